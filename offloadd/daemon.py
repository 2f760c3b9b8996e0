"""The daemon: discovers topics, runs one offload task per owned topic, handles signals.

Lifecycle ``NEW → RUNNING → STOPPING → STOPPED``. Signals (installed by :meth:`Daemon.run`):
``SIGUSR1`` closes every open segment now, ``SIGHUP`` reloads the configuration (throttle,
policies) without dropping work, ``SIGTERM``/``SIGINT`` stop gracefully: no new entries are
taken, open segments are closed and committed within ``shutdown_deadline_s``, and whatever is
still in flight then is abandoned safely (nothing half-committed; a later run redoes it).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import fcntl
import fnmatch
import itertools
import logging
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from offloadd import catalog, logs, wiring
from offloadd.blobstore.base import BlobStore
from offloadd.blobstore.health import StoreHealth
from offloadd.config import Settings
from offloadd.errors import OffloaddError
from offloadd.ledger.base import LedgerSource
from offloadd.ledger.metered import MeteredSource, SourceReadProbe
from offloadd.metadata import managed_ledger, offload_status
from offloadd.metadata.base import MetadataStore
from offloadd.metrics import Metrics
from offloadd.model import LedgerDesc, Position, TopicName
from offloadd.offload.buffer import OffloadBuffer
from offloadd.offload.commit import Fence, NoFence
from offloadd.offload.lag import LagMonitor
from offloadd.offload.recorder import StatusRecorder
from offloadd.offload.roller import RollPolicy
from offloadd.offload.threshold import TailLog, Thresholds
from offloadd.offload.throttle import Throttle
from offloadd.offload.topic import (
    OffloadEnv,
    TaskState,
    TopicOffloader,
    TopicPolicy,
    TopicProbe,
)

log = logging.getLogger(__name__)
MiB = 1024 * 1024
ABANDON_GRACE_S = 10.0


class DaemonState(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


class Revoke(enum.Enum):
    """Why a running topic must stop (see :meth:`Ownership.revoked`)."""

    HANDOFF = "handoff"  # another daemon should own it: close and commit the open segment first
    LOST = "lost"  # ownership already ended (session lost, newer epoch): stop now, commit nothing


class Ownership:
    """Decides which topics this process offloads; the default owns every topic."""

    async def acquire(self, topic: TopicName) -> Fence | None:
        return NoFence()

    async def release(self, topic: TopicName) -> None:
        return None

    async def still_owned(self, topic: TopicName) -> bool:
        return True

    async def revoked(self, running: Collection[TopicName]) -> Mapping[TopicName, Revoke]:
        """Before each discovery pass: running topics to give up, and how."""
        return {}

    def bind(self, revoke: Callable[[Mapping[TopicName, Revoke]], None]) -> None:
        """``revoke(verdicts)`` stops those running topics at once and runs a discovery pass
        soon: for what happens between passes (a lost session must stop its tasks before they
        act on the failed requests it leaves behind)."""


@dataclass(frozen=True)
class OffloadNow:
    """What an offload-now did for one topic.

    ``result``: ``committed`` (everything up to ``target`` is in the tier), ``triggered``
    (asked, not waited for), ``nothing`` (no entry past what is committed), ``failed`` (an
    attempt failed: ``error``; the daemon keeps retrying), ``timeout``, ``not-served``,
    ``ledger-mode``.
    """

    topic: str
    result: str
    target: str | None = None
    last_committed: str | None = None
    error: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.result in ("committed", "triggered", "nothing")

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "result": self.result, "target": self.target,
                "last_committed": self.last_committed, "error": self.error,
                "seconds": round(self.seconds, 3)}


def _text(pos: Position | None) -> str | None:
    return str(pos) if pos is not None else None


def _tail(ledgers: Sequence[LedgerDesc]) -> Position | None:
    """The topic's last readable entry."""
    return next((Position(d.ledger_id, d.last_entry_id) for d in reversed(ledgers)
                 if d.last_entry_id >= 0), None)


@dataclass
class _Running:
    task: asyncio.Task[None]
    offloader: TopicOffloader
    recorder: StatusRecorder | None = None
    lost: bool = False  # ownership ended under it: the status record is the successor's


ProbeFactory = Callable[[TopicName], TopicProbe]


def default_owner_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Daemon:
    def __init__(self, settings: Settings, *, source: LedgerSource, metadata: MetadataStore,
                 blobstore: BlobStore, ownership: Ownership | None = None,
                 probe_factory: ProbeFactory | None = None,
                 on_buffer: Callable[[int, int], None] | None = None,
                 metrics: Metrics | None = None,
                 discovery_interval_s: float = 1.0) -> None:
        self.settings = settings
        self.source = source
        self.metadata = metadata
        self.blobstore = blobstore
        self.ownership = ownership or Ownership()
        self.metrics = metrics
        if metrics is not None:
            metrics.throttle_limit(settings.offload.flow_permits_per_second)
        self._wake = asyncio.Event()
        self.ownership.bind(self._revoke_now)
        self._probe_factory = probe_factory
        self.state = DaemonState.NEW
        off = settings.offload
        self.buffer = OffloadBuffer(off.buffer_max_bytes, on_change=on_buffer)
        self.throttle = Throttle(off.flow_permits_per_second, off.burst_bytes)
        # the pipeline reads through a wrapper that times each read per topic
        piped: LedgerSource = source if probe_factory is None else MeteredSource(
            source, self._source_probe)
        self.env = OffloadEnv(
            source=piped, metadata=metadata, blobstore=blobstore, buffer=self.buffer,
            acquire=self._acquire, blocks_in_flight=off.blocks_in_flight,
            retry_base_s=off.retry_base_s, retry_max_s=off.retry_max_s)
        self.topics: dict[TopicName, _Running] = {}
        self._stop = asyncio.Event()
        self._discovery_interval = discovery_interval_s
        self._bg: set[asyncio.Future[None]] = set()  # releases still running
        self.ready = False
        self.lag_monitor = LagMonitor(source)
        self._ledgers_seen: dict[TopicName, list[LedgerDesc]] = {}
        self._on_stopping: Callable[[], None] | None = None
        self._reloading: asyncio.Task[None] | None = None

    def _source_probe(self, topic: TopicName) -> SourceReadProbe | None:
        r = self.topics.get(topic)
        probe = r.offloader.probe if r is not None else None
        return probe if hasattr(probe, "ledger_read") else None  # type: ignore[return-value]

    async def _acquire(self, nbytes: int, topic: str) -> float:
        """Take a block's bytes from the broker-wide budget in one request, reporting the wait
        per topic.

        One request, not pieces: a part goes to the store whole once its bytes are granted, and
        a topic has several parts waiting at once. Pieces of those parts would be served
        interleaved, so all of them would finish their pieces together and go to the store
        in one burst (4 MiB blocks at 1 MB/s: nothing for 50 s, then 50 MB). Whole requests
        leave the store one block at a time, evenly spaced; a block larger than the throttle's
        burst is granted on credit and paid back by the requests after it (throttle.py).
        """
        waited = await self.throttle.acquire(nbytes, topic)
        if self.metrics is not None:
            self.metrics.throttle_wait(topic, waited)
        return waited

    # ---- configuration -------------------------------------------------------------------
    def policy(self, topic: TopicName) -> TopicPolicy:
        s = self.settings
        p = s.policy_for(topic)
        return TopicPolicy(RollPolicy(max_bytes=max(int(p.max_size_per_segment_mbytes * MiB), 1),
                                      max_age_s=p.max_segment_rollover_time_minutes * 60,
                                      max_block_size=p.max_block_size_bytes,
                                      min_block_size=min(s.min_block_size(p),
                                                         p.max_block_size_bytes)),
                           mode=p.mode,
                           thresholds=Thresholds.from_config(p.threshold_bytes,
                                                             p.threshold_seconds))

    def _policy_fn(self, topic: TopicName) -> Callable[[], TopicPolicy]:
        return lambda: self.policy(topic)

    def reload(self, settings: Settings) -> None:
        """Apply a new configuration to running work (SIGHUP).

        Live: the throttle, every offload policy level (read on each roll decision), topic
        patterns, the log level. Keys that only take effect after a restart are named in a
        warning rather than silently ignored.
        """
        old, self.settings = self.settings, settings
        self.throttle.set_rate(settings.offload.flow_permits_per_second,
                               settings.offload.burst_bytes)
        if self.metrics is not None:
            self.metrics.throttle_limit(settings.offload.flow_permits_per_second)
        logging.getLogger().setLevel(settings.daemon.log_level)
        later = [k for k in _restart_keys(old) if _dig(old, k) != _dig(settings, k)]
        if later:
            log.warning("SIGHUP: changed %s: takes effect after a restart", ", ".join(later))
        log.info("configuration reloaded: flow_permits_per_second=%s",
                 settings.offload.flow_permits_per_second)

    def wanted(self, topic: TopicName) -> bool:
        pats = self.settings.source.topics
        return not pats or any(fnmatch.fnmatchcase(str(topic), p) for p in pats)

    # ---- control -------------------------------------------------------------------------
    def trigger(self, topics: list[TopicName] | None = None) -> None:
        for name, r in self.topics.items():
            if topics is None or name in topics:
                r.offloader.trigger()

    def default_trigger_topics(self) -> list[TopicName] | None:
        """What an offload-now naming no topic closes: ``[daemon] offload_now_topics`` (fnmatch
        patterns) of the running topics, or every topic (None) when that is empty."""
        pats = self.settings.daemon.offload_now_topics
        if not pats:
            return None
        return [t for t in self.topics if any(fnmatch.fnmatchcase(str(t), p) for p in pats)]

    async def offload_now(self, topics: list[TopicName] | None = None, *, wait: bool = False,
                          timeout_s: float = 300.0, poll_s: float = 0.1) -> list[OffloadNow]:
        """Close the open segments of ``topics`` (default: :meth:`default_trigger_topics`) at
        each topic's tail as it is now; with ``wait``, until that segment is committed, an
        attempt at it fails, or ``timeout_s`` passes (``offloadd offload-now --wait``, the
        control endpoint). Like ``pulsar-admin topics offload -w`` + ``offload-status -w``.
        """
        names = topics if topics is not None else self.default_trigger_topics()
        if names is None:
            names = list(self.topics)
        t0 = time.monotonic()
        results: dict[TopicName, OffloadNow] = {}
        pending: dict[TopicName, tuple[TopicOffloader, Position, int]] = {}
        for name in names:
            r = self.topics.get(name)
            if r is None:
                results[name] = OffloadNow(str(name), "not-served", error="this daemon does not "
                                           "offload that topic (unknown, filtered out by "
                                           "[source] topics, or owned by another daemon)")
                continue
            off = r.offloader
            if self.policy(name).mode == "ledger":
                results[name] = OffloadNow(str(name), "ledger-mode", _text(off.last_committed),
                                           error="the topic offloads whole ledgers as they close")
                continue
            try:
                ledgers = await self.source.ledgers(name)
                # the thresholds keep the newest data in the source: the segment closes at
                # what may be offloaded now (ledger boundaries tell that much for sure)
                tail = _tail(TailLog().clip(self.policy(name).thresholds, ledgers,
                                            self.env.wall_ms()))
            except OffloaddError as exc:
                results[name] = OffloadNow(str(name), "failed", _text(off.last_committed),
                                           error=f"cannot read the topic's tail: {exc}")
                continue
            done = off.last_committed
            if tail is None or (done is not None and done >= tail):
                results[name] = OffloadNow(str(name), "nothing", _text(done), _text(done))
                continue
            off.trigger()
            if not wait:
                results[name] = OffloadNow(str(name), "triggered", _text(tail), _text(done))
                continue
            pending[name] = (off, tail, off.failed_attempts)
        log.info("offload-now: closing open segments (%s)",
                 ", ".join(map(str, names)) or "no topic")
        while pending:
            for name, (off, tail, failed_before) in list(pending.items()):
                done = off.last_committed
                if done is not None and done >= tail:
                    results[name] = OffloadNow(str(name), "committed", str(tail), str(done),
                                               seconds=time.monotonic() - t0)
                elif off.failed_attempts > failed_before:
                    results[name] = OffloadNow(str(name), "failed", str(tail), _text(done),
                                               error=off.last_error,
                                               seconds=time.monotonic() - t0)
                elif off.state is TaskState.STOPPED or self.topics.get(name) is None:
                    results[name] = OffloadNow(str(name), "failed", str(tail), _text(done),
                                               error="the topic's task stopped",
                                               seconds=time.monotonic() - t0)
                else:
                    continue
                del pending[name]
            if not pending:
                break
            if time.monotonic() - t0 >= timeout_s:
                for name, (off, tail, _) in pending.items():
                    results[name] = OffloadNow(str(name), "timeout", str(tail),
                                               _text(off.last_committed),
                                               error=off.last_error,
                                               seconds=time.monotonic() - t0)
                break
            await asyncio.sleep(poll_s)
        return [results[n] for n in names]

    def request_stop(self) -> None:
        if self.state in (DaemonState.NEW, DaemonState.RUNNING):
            self.state = DaemonState.STOPPING
            log.info("stopping: no new entries; closing open segments within %.0fs",
                     self.settings.daemon.shutdown_deadline_s)
            if self._on_stopping is not None:
                self._on_stopping()
        self._stop.set()

    # ---- running -------------------------------------------------------------------------
    async def run(self, *, install_signals: bool = True,
                  reload: Callable[[], Settings] | None = None,
                  on_ready: Callable[[], Awaitable[None] | None] | None = None,
                  trigger_file: Path | None = None,
                  on_stopping: Callable[[], None] | None = None) -> None:
        loop = asyncio.get_running_loop()
        self._on_stopping = on_stopping
        installed: list[int] = []
        if install_signals:
            handlers: dict[int, Callable[[], None]] = {
                signal.SIGUSR1: lambda: self._signal_trigger(trigger_file),
                signal.SIGTERM: self.request_stop,
                signal.SIGINT: self.request_stop,
            }
            if reload is not None:
                handlers[signal.SIGHUP] = lambda: self._signal_reload(reload)
            for sig, fn in handlers.items():
                loop.add_signal_handler(sig, fn)
                installed.append(sig)
        self.state = DaemonState.RUNNING
        gc_task = asyncio.create_task(self._gc_loop(), name="gc")
        check_task = asyncio.create_task(self._read_check_loop(), name="read check")
        lag_task = asyncio.create_task(self._lag_loop(), name="lag")
        try:
            first = True
            while not self._stop.is_set():
                self._wake.clear()
                try:
                    await self._revoke()
                    await self._discover()
                except OffloaddError as exc:
                    log.error("topic discovery failed: %s", exc)
                if first:
                    first = False
                    self.ready = True
                    if on_ready is not None:
                        res = on_ready()
                        if res is not None:
                            await res
                self._reap()
                await self._pause()
            gc_task.cancel()
            check_task.cancel()
            await asyncio.gather(gc_task, check_task, return_exceptions=True)
            await self._shutdown()
        finally:
            gc_task.cancel()
            check_task.cancel()
            lag_task.cancel()
            await asyncio.gather(lag_task, check_task, return_exceptions=True)
            for sig in installed:
                loop.remove_signal_handler(sig)
            self.state = DaemonState.STOPPED
            self.ready = False

    async def _gc_loop(self) -> None:
        """Retention and garbage collection every ``[retention] interval_s`` (docs/retention.md):
        deletions of fully deleted segments, their retries, the orphan sweep."""
        from offloadd.retention.gc import gc_pass

        while True:
            await asyncio.sleep(self.settings.retention.interval_s)
            log.debug("gc pass starting")
            try:
                report = await gc_pass(self.metadata, self.blobstore, self.source,
                                       self.settings, now=time.time(), probe=self.metrics)
                log.debug("gc pass done")
                if not report.ok:
                    log.warning("gc pass left work pending: %s", report.to_json())
            except OffloaddError as exc:
                log.error("gc pass failed (retried next interval): %s", exc)

    async def _read_check_loop(self) -> None:
        """Read back what each topic committed since the last look (offloadd/read/check.py)."""
        from offloadd.read.check import read_back

        checked: dict[TopicName, Position] = {}
        while True:
            interval = self.settings.offload.read_check_interval_s
            await asyncio.sleep(interval if interval > 0 else 60.0)
            if interval <= 0:
                continue  # off; a reload may turn it on
            for topic, r in list(self.topics.items()):
                done = r.offloader.last_committed
                probe = r.offloader.probe
                if done is None or checked.get(topic) == done or not hasattr(probe, "index_read"):
                    continue
                try:
                    seg = await read_back(self.metadata, self.blobstore, topic,
                                          probe)  # type: ignore[arg-type]
                except Exception as exc:  # the check must outlive any failure; retried
                    log.warning("topic %s: reading the newest committed segment back from the "
                                "tier failed (readers will fail the same way): %s", topic, exc)
                    continue
                checked[topic] = done
                if seg is not None:
                    log.debug("topic %s: segment %s reads back", topic, seg.uid)
            for gone in set(checked) - set(self.topics):
                del checked[gone]

    async def _lag_loop(self) -> None:
        """Every ``[daemon] lag_interval_s``: each running topic's lag, from its last committed
        position to the source's LAC (offload/lag.py). Independent of the topic tasks, so the
        figures keep moving while uploads fail or the store hangs."""
        limit = asyncio.Semaphore(16)  # source calls in flight at once

        async def one(topic: TopicName, off: TopicOffloader) -> None:
            async with limit:
                interval = self.settings.daemon.lag_interval_s
                try:
                    async with asyncio.timeout(max(interval * 5, 10.0)):
                        ledgers = await self.source.ledgers(topic)
                    self._ledgers_seen[topic] = ledgers
                except (OffloaddError, TimeoutError) as exc:
                    # the last list we had still gives growing seconds: better than a freeze
                    log.debug("lag of %s: source unavailable (%s)", topic, exc)
                    ledgers = self._ledgers_seen.get(topic, [])
                    if not ledgers:
                        return
                committed = off.last_committed
                if not off.recovered:  # recovery may be stuck on the store: ask the catalog
                    try:
                        info, _ = await managed_ledger.load(self.metadata, topic.managed_ledger)
                    except OffloaddError as exc:
                        log.debug("lag of %s: catalog unreadable (%s)", topic, exc)
                        return
                    done = [seg for seg in catalog.segments(info) if seg.complete]
                    committed = done[-1].end if done else None
                lag = await self.lag_monitor.sample(topic, ledgers, committed)
                off.lag = lag
                off.probe.lag(lag.entries, lag.bytes, lag.seconds)

        while True:
            await asyncio.sleep(self.settings.daemon.lag_interval_s)
            for gone in set(self._ledgers_seen) - set(self.topics):
                del self._ledgers_seen[gone]
                self.lag_monitor.forget(gone)
            running = [(t, r.offloader) for t, r in self.topics.items() if not r.task.done()]
            if running:
                results = await asyncio.gather(*(one(t, off) for t, off in running),
                                               return_exceptions=True)
                for (topic, _), res in zip(running, results, strict=True):
                    if isinstance(res, Exception):  # a bug must not stop the figures for good
                        log.error("lag of %s not measured: %r", topic, res)

    def _signal_trigger(self, trigger_file: Path | None) -> None:
        """SIGUSR1: all topics, or those ``offloadd offload-now --topic`` wrote down."""
        names: list[TopicName] | None = None
        if trigger_file is not None:
            try:
                text = trigger_file.read_text()
                trigger_file.unlink()
                names = [TopicName.parse(line.strip()) for line in text.splitlines()
                         if line.strip()] or None
            except FileNotFoundError:
                pass
            except (OSError, OffloaddError) as exc:
                log.warning("SIGUSR1: ignoring trigger file %s: %s", trigger_file, exc)
        if names is None:
            names = self.default_trigger_topics()
        log.info("SIGUSR1: closing open segments now (%s)",
                 "all topics" if names is None else ", ".join(map(str, names)) or "no topic")
        self.trigger(names)

    def _signal_reload(self, reload: Callable[[], Settings]) -> None:
        if self._reloading is not None and not self._reloading.done():
            log.warning("SIGHUP: a reload is already under way; ignoring this one")
            return
        self._reloading = asyncio.ensure_future(self._reload(reload))

    async def _reload(self, reload: Callable[[], Settings]) -> None:
        try:
            # reading and validating the file is blocking I/O: keep it off the event loop
            self.reload(await asyncio.to_thread(reload))
        except OffloaddError as exc:
            log.error("SIGHUP: configuration not reloaded, keeping the old one: %s", exc)

    async def _pause(self) -> None:
        """Until the next pass is due, a stop is requested or the ownership hook wakes us."""
        waits = [asyncio.ensure_future(self._stop.wait()), asyncio.ensure_future(self._wake.wait())]
        try:
            await asyncio.wait(waits, timeout=self._discovery_interval,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    async def _revoke(self) -> None:
        self._apply_revocations(await self.ownership.revoked(list(self.topics)))

    def _revoke_now(self, verdicts: Mapping[TopicName, Revoke]) -> None:
        self._apply_revocations(verdicts)
        self._wake.set()

    def _apply_revocations(self, verdicts: Mapping[TopicName, Revoke]) -> None:
        """Stop the tasks of topics this process must give up (see :class:`Revoke`)."""
        for topic, how in verdicts.items():
            r = self.topics.get(topic)
            if r is None or r.task.done():
                continue
            if how is Revoke.LOST:
                r.lost = True
                if not r.task.cancelling():
                    log.warning("topic %s: ownership lost; stopping now, committing nothing",
                                topic)
                    r.task.cancel()
            elif r.offloader.state is TaskState.RUNNING:
                log.info("topic %s: handing over to another daemon after closing the open "
                         "segment", topic)
                r.offloader.request_stop()

    async def _discover(self) -> None:
        for topic in await self.source.list_topics():
            if topic in self.topics or not self.wanted(topic):
                continue
            fence = await self.ownership.acquire(topic)
            if fence is None:
                continue
            probe = self._probe_factory(topic) if self._probe_factory else None
            recorder = await self._recorder(topic, fence)
            off = TopicOffloader(topic, self.env, self._policy_fn(topic), fence, probe,
                                 status=recorder)
            # every line the task logs carries its topic as a field (offloadd.logs)
            task = asyncio.create_task(off.run(), name=f"offload {topic}",
                                       context=logs.context_with(topic=str(topic)))
            self.topics[topic] = _Running(task, off, recorder)
            log.info("offloading topic %s", topic)

    async def _recorder(self, topic: TopicName, fence: Fence) -> StatusRecorder:
        """The topic's persisted offload status, continued from what its last owner wrote."""
        ml = topic.managed_ledger
        try:
            previous = await offload_status.read(self.metadata, ml)
        except OffloaddError as exc:  # unreadable: start afresh rather than not at all
            log.warning("topic %s: previous offload status unreadable (%s)", topic, exc)
            previous = None
        owner = getattr(self.ownership, "owner_id", None) or default_owner_id()
        recorder = StatusRecorder(self.metadata, ml, fence, owner,
                                  interval_s=self.settings.daemon.status_interval_s,
                                  initial=previous)
        recorder.start()
        return recorder

    def _let_go(self, r: _Running) -> None:
        """The topic's task ended: record that this owner stopped, in the background."""
        if r.recorder is None:
            return
        if not r.lost:
            r.recorder.stopped()
        self._bg.add(t := asyncio.ensure_future(r.recorder.close()))
        t.add_done_callback(self._bg.discard)

    def _reap(self) -> None:
        for topic, r in list(self.topics.items()):
            if r.task.done():
                del self.topics[topic]
                exc = r.task.exception() if not r.task.cancelled() else None
                if exc is not None:
                    log.error("topic %s task ended: %r", topic, exc)
                if self.metrics is not None:
                    self.metrics.forget_topic(topic.ns, str(topic))
                self._let_go(r)
                self._bg.add(t := asyncio.ensure_future(self.ownership.release(topic)))
                t.add_done_callback(self._bg.discard)

    async def _shutdown(self) -> None:
        deadline = self.settings.daemon.shutdown_deadline_s
        for r in self.topics.values():
            r.offloader.request_stop()
        tasks = [r.task for r in self.topics.values()]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=deadline)
            for t in pending:
                t.cancel()
            if pending:
                log.warning("shutdown deadline (%.0fs) passed: abandoning %d in-flight "
                            "segment(s); they are redone on the next start", deadline,
                            len(pending))
                # abandoning aborts uploads; a hung store must not hold the exit hostage
                _, stuck = await asyncio.wait(pending, timeout=ABANDON_GRACE_S)
                if stuck:
                    log.warning("%d topic task(s) still abandoning after %.0fs; exiting "
                                "anyway (offloadd gc sweeps what they leave)", len(stuck),
                                ABANDON_GRACE_S)
        for r in self.topics.values():
            self._let_go(r)
        if self._bg:  # status records are written before ownership is given up
            await asyncio.wait(list(self._bg), timeout=ABANDON_GRACE_S)
        for topic in list(self.topics):
            await self.ownership.release(topic)
        self.topics.clear()

    def status(self) -> dict[str, Any]:
        health = getattr(self.blobstore, "health", None)
        circuit = getattr(getattr(health, "state", None), "value", "healthy")
        ready, reason = health.readiness() if isinstance(health, StoreHealth) else (True, "")
        return {
            "state": self.state.value,
            "pid": os.getpid(),
            "store_circuit": circuit,
            "store_ready": ready,
            "store_reason": reason,
            "throttle": {"bytes_per_s": self.throttle.rate, "waiting": self.throttle.waiting},
            "buffer": {"used": self.buffer.used, "cap": self.buffer.cap},
            "topics": {str(t): dict(r.offloader.status()) for t, r in self.topics.items()},
            "source": wiring.source_status(self.settings, self.source),
        }


# ---- reload ----------------------------------------------------------------------------------
def _restart_keys(settings: Settings) -> list[str]:
    """Configuration read once at start: a SIGHUP that changes these says so."""
    keys = [f"{sec}.{k}" for sec in ("metadata", "blobstore", "metrics", "lakehouse")
            for k in type(getattr(settings, sec)).model_fields]
    return [*keys, "source.kind", "source.path", "daemon.pid_file", "daemon.log_format",
            "offload.buffer_max_bytes", "offload.blocks_in_flight", "offload.retry_base_s",
            "offload.retry_max_s"]


def _dig(settings: Settings, key: str) -> object:
    section, _, name = key.partition(".")
    return getattr(getattr(settings, section), name)


# ---- pid file ------------------------------------------------------------------------------
class PidFile:
    """The daemon's pid file, locked with ``flock`` for as long as the process runs.

    The lock, not the number in the file, says whether a daemon is running: the kernel drops
    it when the process dies, however it dies, so a pid file left behind by a crash (whose pid
    may since name an unrelated process) is recognised as stale and never signalled.
    """

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, path: Path) -> PidFile:
        """Lock ``path`` and write our pid into it; ``OffloaddError`` if another live process
        holds it."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                other = _read_pid(path)
                raise OffloaddError(
                    f"another offloadd (pid {other if other is not None else '?'}) is running "
                    f"with pid file {path}; stop it first or give this one its own data"
                ) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd)

    def release(self) -> None:
        """Remove the file (while still holding the lock), then unlock; idempotent."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            with contextlib.suppress(FileNotFoundError):
                if _read_pid(self.path) == os.getpid():
                    self.path.unlink()
        finally:
            os.close(fd)


def write_pid_file(path: Path) -> PidFile:
    """Lock and write the pid file (see :class:`PidFile`); release it with
    :func:`remove_pid_file` or ``PidFile.release()``."""
    return PidFile.acquire(path)


def remove_pid_file(handle: PidFile) -> None:
    handle.release()


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _lock_holders(path: Path) -> set[int] | None:
    """Pids holding an ``flock`` on ``path``'s inode, from ``/proc/locks``; None where that
    cannot be read."""
    try:
        st = os.stat(path)
        text = Path("/proc/locks").read_text()
    except OSError:
        return None
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    holders = set()
    for line in text.splitlines():
        f = line.split()
        # "1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF" (blocked waiters carry a "->")
        if len(f) >= 6 and f[1] == "FLOCK" and "->" not in f and f[5] == want:
            with contextlib.suppress(ValueError):
                holders.add(int(f[4]))
    return holders


def _runs_offloadd(cmdline: bytes) -> bool:
    """``/proc/<pid>/cmdline`` is offloadd's: the ``offloadd`` script (run directly or by its
    interpreter) or ``python -m offloadd[.cli]``."""
    args = cmdline.rstrip(b"\0").split(b"\0")
    if any(os.path.basename(a) == b"offloadd" for a in args[:2]):
        return True
    return any(a == b"-m" and nxt.split(b".")[0] == b"offloadd"
               for a, nxt in itertools.pairwise(args[:4]))


def read_pid_file(path: Path) -> int:
    """The pid of the live offloadd that holds ``path``; ``OffloaddError`` (naming why) when
    there is none, so a caller never signals a process that merely reused a stale pid."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise OffloaddError(f"no daemon pid file at {path}: is offloadd running with this "
                            "config? (see [daemon] pid_file)") from None
    try:
        pid = _read_pid(path)
        if pid is None:
            raise OffloaddError(f"pid file {path} does not hold a process id")
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # held: a daemon is running
        else:
            raise OffloaddError(f"pid file {path} names process {pid}, which is not running "
                                "(stale pid file): no offloadd holds its lock")
    finally:
        os.close(fd)
    holders = _lock_holders(path)
    if holders is not None and pid not in holders:
        raise OffloaddError(f"pid file {path} names process {pid}, but the process holding "
                            f"its lock is {', '.join(map(str, sorted(holders))) or 'unknown'}; "
                            "not signalling")
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        raise OffloaddError(f"pid file {path} names process {pid}, which is not running "
                            "(stale pid file)") from None
    except OSError:
        return pid  # /proc hidden from us (hidepid): the lock check stands alone
    if not _runs_offloadd(cmdline):
        what = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()[:80]
        raise OffloaddError(f"pid file {path} names process {pid}, which is not offloadd "
                            f"({what!r}); not signalling")
    return pid
