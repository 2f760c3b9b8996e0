"""``offloadd standalone``: embedded writer + daemon + metrics in one process.

No external service: metadata in SQLite (``embedded:./data/metadata``), ledgers under
``./data/ledgers``, the tier under ``./data/tier``. Without ``--config`` the demo policy below
rolls small segments and ledgers quickly so that a short run shows segments spanning ledgers
and ledgers spanning segments. When ``--duration`` ends, the writer stops, every open segment
is closed and committed, and the process exits 0 (also on SIGTERM/SIGINT).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from offloadd import config as config_mod
from offloadd.config import Settings
from offloadd.errors import OffloaddError
from offloadd.ledger.local import StoreLock
from offloadd.model.lifecycle import Lifecycle
from offloadd.model.system_topics import is_system_topic
from offloadd.shell.daemon import Daemon
from offloadd.shell.pidfile import PidFile
from offloadd.shell.produce import PayloadKind, ProduceStats, PulsarShape, produce, topic_names
from offloadd.shell.runtime import Runtime

if TYPE_CHECKING:
    from offloadd.shell.produce_schema import SchemaKind

log = logging.getLogger(__name__)

DEMO_OVERRIDES: dict[str, Any] = {
    "offload__max_size_per_segment_mbytes": 4,
    "offload__max_segment_rollover_time_minutes": 0.1,
    "offload__max_block_size_bytes": 1024 * 1024,
    "source__rollover_bytes": 3 * 1024 * 1024 // 2,
    "source__rollover_minutes": 0.25,
    "lakehouse__enabled": True,  # when the lakehouse extra is installed
}


def load_settings(path: str | None) -> Settings:
    if path is not None:
        return config_mod.load(path)
    return config_mod.load(None, **DEMO_OVERRIDES)


async def run_standalone(settings: Settings, *, duration: float | None, rate: float,
                         entry_size: int, topics: int, drain_timeout_s: float = 120.0,
                         config_path: str | None = None, payload: PayloadKind = "pulsar",
                         shape: PulsarShape | None = None,
                         schema: SchemaKind | None = None) -> dict[str, Any]:
    # the store is this process's alone: it writes every topic and offloads every topic
    # without the ownership layer, so a second writer or daemon on it would lose entries
    locks = await asyncio.to_thread(_lock_store, settings)
    try:
        return await _run_standalone(settings, duration=duration, rate=rate,
                                     entry_size=entry_size, topics=topics,
                                     drain_timeout_s=drain_timeout_s, config_path=config_path,
                                     payload=payload, shape=shape, schema=schema)
    finally:
        for lock in reversed(locks):
            lock.release()


def _lock_store(settings: Settings) -> list[StoreLock]:
    path = settings.source.path
    writer = StoreLock.acquire(path, StoreLock.WRITER, holder="offloadd standalone")
    try:
        return [writer, StoreLock.acquire(path, StoreLock.OFFLOADER,
                                          holder="offloadd standalone")]
    except BaseException:
        writer.release()
        raise


async def _run_standalone(settings: Settings, *, duration: float | None, rate: float,
                          entry_size: int, topics: int, drain_timeout_s: float,
                          config_path: str | None, payload: PayloadKind,
                          shape: PulsarShape | None,
                          schema: SchemaKind | None = None) -> dict[str, Any]:
    pid_handle = PidFile.acquire(settings.daemon.pid_file)  # refuses a second daemon here
    try:
        rt = await Runtime.open(settings, with_writer=True)
    except BaseException:
        pid_handle.release()
        raise
    assert rt.local is not None
    stop = asyncio.Event()
    daemon = rt.daemon
    stats = ProduceStats()
    names = topic_names(topics)
    t0 = time.monotonic()

    def reload() -> Settings:
        return load_settings(config_path)

    daemon_task = asyncio.create_task(daemon.run(
        reload=reload, trigger_file=settings.daemon.pid_file.with_suffix(".trigger")))
    # the daemon owns SIGTERM/SIGINT handling; stopping it also stops the writer
    try:
        await rt.start_metrics()
        await rt.start_lakehouse(optional=True)
        writer = rt.local.writer
        source = None
        if schema is not None:  # messages of a registered schema (typed columns)
            from offloadd.shell.produce_schema import schema_entries

            source = await schema_entries(
                rt.metadata, names, schema, max_batch=shape.max_batch if shape else 16,
                transactions=shape.transactions if shape else False)
        progress = asyncio.create_task(_progress(daemon, lambda: stats, t0))

        def seen(s: ProduceStats) -> None:
            nonlocal stats
            stats = s  # the writer's running totals, for the progress line

        async def write() -> None:
            nonlocal stats
            stats = await produce(writer, names, entry_size=entry_size, rate=rate,
                                  duration=duration, stop=stop, on_batch=seen,
                                  payload=payload, shape=shape, source=source)

        writer_task = asyncio.create_task(write())
        while not writer_task.done() and not daemon_task.done() and daemon.state.value in (
                "new", "running"):
            await asyncio.wait({writer_task, daemon_task}, timeout=0.5,
                               return_when=asyncio.FIRST_COMPLETED)
        stop.set()
        await writer_task
        await writer.close()  # closes open ledgers: their ends are final
        drained: bool | None = None  # None: stopped by a signal, no drain asked for
        if not daemon_task.done() and daemon.state.value == "running":
            log.info("standalone: writer stopped; offloading what it wrote (up to %.0fs; "
                     "SIGTERM stops now)", drain_timeout_s)
            drained = await _drain(daemon, rt, drain_timeout_s)
            daemon.request_stop()
        await daemon_task
        progress.cancel()
        projected = None
        if rt.lakehouse is not None:  # the tables catch up with everything committed
            projected = {r.topic: r for r in await rt.lakehouse.catch_up()}
        summary = await _summary(rt, names, stats, time.monotonic() - t0)
        if projected is not None:
            summary["lakehouse"] = {t: {"last_position": r.last_position, "error": r.error}
                                    for t, r in projected.items()}
        summary["drained"] = drained
        problem = offload_problem(summary)
        if problem is not None:  # a run that offloaded nothing did not do its job: exit 1
            summary["problem"] = problem
            log.error("standalone: %s", problem)
        # the summary itself goes to stdout once (the command prints it): not again in the log
        log.info("standalone finished: %d bytes written, drained=%s",
                 summary.get("bytes_written", 0), drained)
        return summary
    finally:
        await rt.close()
        pid_handle.release()


def offload_problem(summary: dict[str, Any]) -> str | None:
    """Why a run's summary is a failure although it ended without an error: nothing reached
    the tier (a failing store, a stop before the first segment closed); None when something
    did."""
    offloaded = sum(int(t.get("entries_offloaded") or 0) for t in summary["topics"].values())
    if offloaded:
        return None
    written = summary["entries_written"]
    if not written:
        return "nothing was written or offloaded (see the errors above)"
    return (f"nothing was offloaded: {written} entries written, none committed to the tier "
            "(see the errors above; the entries stay in the ledger store and a restart "
            "offloads them)")


async def _drain(daemon: Daemon, rt: Runtime, timeout: float) -> bool | None:
    """Close every open segment and wait until all written entries are committed; False if
    that did not happen within ``timeout`` (e.g. the store keeps failing), None if a signal
    stopped the daemon meanwhile (its own shutdown deadline then bounds the exit)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        if daemon.state is not Lifecycle.RUNNING:
            log.info("standalone: stopping before everything written was offloaded; the "
                     "rest stays in the ledger store and a restart offloads it")
            return None
        daemon.trigger()
        behind = 0
        for topic in await rt.source.list_topics():
            if is_system_topic(topic):  # never offloaded (topic policies: __change_events)
                continue
            ledgers = await rt.source.ledgers(topic)
            last = next((d for d in reversed(ledgers) if d.last_entry_id >= 0), None)
            running = daemon.topics.get(topic)
            if last is None:
                continue
            done = running.offloader.last_committed if running else None
            if done is None or (done.ledger_id, done.entry_id) < (last.ledger_id,
                                                                   last.last_entry_id):
                behind += 1
        if behind == 0:
            return True
    log.error("standalone: not everything written was offloaded within %.0fs of the end "
              "(see the errors above); what is committed is intact, the rest is still in "
              "./data/ledgers and a restart offloads it", timeout)
    return False


async def _progress(daemon: Daemon, stats: Callable[[], ProduceStats], t0: float) -> None:
    """A line every 5 s: what was written, what is committed, the buffer."""
    while True:
        await asyncio.sleep(5)
        st = daemon.status()
        last = {t: v["last_committed"] for t, v in st["topics"].items()}
        log.info("t=%.0fs written %.1f MB, buffer %.1f MiB, last committed %s",
                 time.monotonic() - t0, stats().bytes / 1e6, st["buffer"]["used"] / 2**20,
                 ", ".join(f"{t.rsplit('/', 1)[-1]}={p}" for t, p in sorted(last.items())))


async def _summary(rt: Runtime, names: list[Any], stats: ProduceStats,
                   seconds: float) -> dict[str, Any]:
    from offloadd.metadata import managed_ledger
    from offloadd.model import catalog

    topics: dict[str, dict[str, Any]] = {}
    for t in names:
        try:
            info, _ = await managed_ledger.load(rt.metadata, t.managed_ledger)
        except OffloaddError:
            continue
        segs = [s for s in catalog.segments(info) if s.complete]
        topics[str(t)] = {
            "ledgers": len(info.ledgerInfo),
            "segments": len(segs),
            "entries_offloaded": sum(s.entries for s in segs),
            "last_offloaded": str(segs[-1].end) if segs else None,
        }
        if t in stats.digests:
            topics[str(t)]["sent"] = stats.digests[t].to_json()
    return {"seconds": round(seconds, 1), "entries_written": stats.entries,
            "bytes_written": stats.bytes, "topics": topics}
