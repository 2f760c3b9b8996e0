"""The sidecar soak (issue 13): a real ``offloadd run`` and the CLI against a hostile Pulsar.

The cluster (:mod:`tests.bookkeeper.cluster`, real ZooKeeper, four fake bookies in this process)
is written by three brokers at once — small batches, a new ledger every 250–500 ms, now and then
a broker crash that leaves an entry past the ledger's end on one bookie — while Pulsar's
retention deletes ledgers closed more than a few seconds ago, whether offloadd has them or not.
Ensembles of 3, write quorum 2, ack quorum 2, striped as BookKeeper stripes, rotating over the
four bookies; a bookie that does not answer an add makes the writer change the ensemble.

The daemon is a real process (``offloadd run``, filesystem tier). Round after round, one of:

- a bookie frozen (``SIGSTOP``-like) for a few seconds while ``offloadd status`` runs beside the
  daemon (slow, holding an old ledger list: the case of defect 2);
- the daemon itself stopped (``SIGSTOP``) around a ``status``/``verify``: offloadd's whole
  catalog (every znode's version and mzxid) must be the same after the command as before;
- ``kill -9`` of the daemon, down long enough for retention to delete ledgers it knew and
  ledgers it never saw (created and deleted while it was down), ``status``/``verify`` run while
  it is down (same catalog check), then a restart;
- a graceful stop and restart; a bookie answering slowly for a while.

A watcher polls the catalog throughout: a ledger record may leave it only after Pulsar deleted
the ledger, a committed segment only once every ledger it touches is deleted, and a loss only be
recorded for a ledger Pulsar deleted. At the end the writers stop, the daemon drains and stops,
``verify``, ``gc --grace 0`` and ``verify`` run, and every entry of the tier is read back and
compared with what the brokers acknowledged:

- 0 duplicated, 0 payloads that differ, 0 entries that were never acknowledged (the torn ones);
- 0 lost: every acknowledged entry is in the tier, unless retention deleted its ledger before
  offloadd took it — and then a loss is recorded in the catalog covering it, unless the ledger
  was created and deleted while no daemon ran (that cannot be known, docs/sidecar.md);
- 0 false loss reports: a ledger recorded lost is one Pulsar deleted, and no entry recorded lost
  is in the tier;
- 0 orphans after gc; the catalog never written by a read-only command.

CI runs a short version (``test_sidecar_soak``, about a minute); ``OFFLOADD_SLOW_TESTS=1`` adds
``test_sidecar_soak_long`` (ten minutes of rounds). Both print their figures, keep them in the
pytest cache (``offloadd/sidecar_soak/<mode>``) and write them to ``$OFFLOADD_SIDECAR_SOAK_JSON``
when set; ``python -m tests.reliability.report`` puts them in docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import re
import signal
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from offloadd.blobstore.filesystem import FilesystemBlobStore
from offloadd.errors import OffloaddError
from offloadd.format.streaming import StreamingIndex
from offloadd.ledger.bookkeeper import lost_ledgers
from offloadd.metadata import managed_ledger
from offloadd.metadata.zookeeper import ZooKeeperMetadataStore
from offloadd.model import TopicName, catalog
from offloadd.model.keys import streaming_index_key
from offloadd.read.reader import TierReader
from tests.bookkeeper.cluster import FakePulsar, LedgerLife
from tests.bookkeeper.conftest import Cluster, open_cluster
from tests.bookkeeper.scale import SIDECAR_HEAD, SMALL_SEGMENTS
from tests.bookkeeper.test_source import snapshot
from tests.fixtures.fake_bookie import FakeBookie

pytestmark = [pytest.mark.integration]

CACHE_KEY = "offloadd/sidecar_soak"
_GAP = re.compile(r"^(?P<ledger>\d+):\d+\.\.before ")
_MIRROR = re.compile(r"^(?P<when>\S+) INFO\s+\S+: topic (?P<topic>\S+): mirrored Pulsar's "
                     r"ledger list", re.M)
# monotonic + _WALL = wall clock: the daemon's log lines carry wall-clock times
_WALL = time.time() - time.monotonic()
_COMMIT = re.compile(r"topic (?P<topic>\S+): segment (?P<uid>[0-9a-f-]{36}) offloaded:")
OFFLOADD = [sys.executable, "-m", "offloadd"]

CONFIG = SIDECAR_HEAD + """topics = ["persistent://public/soak/*"]
read_timeout_s = 1.0
bookie_connect_timeout_s = 1.0
bookie_quarantine_s = 3
""" + SMALL_SEGMENTS + """buffer_max_bytes = 4194304
retry_base_s = 0.2
retry_max_s = 1.0
[retention]
interval_s = 20
orphan_grace_s = 30
[metrics]
enabled = false
[daemon]
pid_file = "{root}/offloadd.pid"
shutdown_deadline_s = 15
log_format = "text"
log_level = "INFO"
"""


@dataclass(frozen=True)
class Plan:
    seconds: float  # of rounds of faults, before the drain
    topics: int = 3
    retention_s: float = 6.0  # Pulsar deletes ledgers closed longer ago than this
    seed: int = 1313


# ---- the brokers and Pulsar's retention ----------------------------------------------------------


async def broker(p: FakePulsar, topic: TopicName, rnd: random.Random, stop: asyncio.Event,
                 stats: Counter[str]) -> None:
    """One broker writing ``topic`` until ``stop``: batches every 30–60 ms, a new ledger every
    250–500 ms, one roll in eight a crash whose recovery leaves a torn entry."""
    next_roll = time.monotonic() + rnd.uniform(0.25, 0.5)
    await p.open_ledger(topic)
    while not stop.is_set():
        n = rnd.randint(1, 8)
        await p.append(topic, [rnd.randbytes(rnd.randint(0, 2000)) for _ in range(n)])
        stats["entries"] += n
        if time.monotonic() >= next_roll:
            if rnd.random() < 0.125:
                await p.crash_and_recover(topic, b"torn: never acknowledged")
                stats["torn"] += 1
            else:
                await p.close_ledger(topic)
            await p.open_ledger(topic)
            stats["ledgers"] += 1
            next_roll = time.monotonic() + rnd.uniform(0.25, 0.5)
        await asyncio.sleep(rnd.uniform(0.03, 0.06))
    await p.close_ledger(topic)


async def retention(p: FakePulsar, topics: list[TopicName], max_age_s: float,
                    stop: asyncio.Event, stats: Counter[str]) -> None:
    while not stop.is_set():
        for t in topics:
            stats["deleted"] += len(await p.retain(t, max_age_s=max_age_s, keep=2))
        await asyncio.sleep(0.2)


# ---- the catalog, watched ------------------------------------------------------------------------


class CatalogWatcher:
    """Polls offloadd's catalog (the mirror nodes) every 50 ms; see the module docstring."""

    def __init__(self, store: ZooKeeperMetadataStore, pulsar: FakePulsar,
                 topics: list[TopicName]) -> None:
        self.store = store
        self.pulsar = pulsar
        self.topics = topics
        self.seen: set[int] = set()  # every ledger ever in the mirror
        self.ids: dict[TopicName, list[int]] = {}
        self.committed: dict[TopicName, dict[Any, tuple[int, ...]]] = {}
        self.segments_ever: dict[Any, tuple[TopicName, catalog.Segment]] = {}
        self.violations: list[str] = []
        self.polls = 0

    def _deleted(self, lid: int) -> bool:
        life = self.pulsar.history.get(lid)
        return life is not None and life.deleted is not None

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.poll()
            await asyncio.sleep(0.05)

    async def poll(self) -> None:
        for t in self.topics:
            try:
                info, _ = await managed_ledger.load(self.store, t.managed_ledger)
            except Exception:  # not mirrored yet, or ZooKeeper busy: next time
                continue
            ids = [li.ledgerId for li in info.ledgerInfo]
            self.seen.update(ids)
            for lid in set(self.ids.get(t, [])) - set(ids):
                if not self._deleted(lid):
                    self.violations.append(f"{t}: ledger {lid} left the catalog while Pulsar "
                                           "had it")
            done = [s for s in catalog.segments(info) if s.complete]
            for seg in done:
                self.segments_ever.setdefault(seg.uid, (t, seg))
            segs = {s.uid: tuple(s.ledger_ids()) for s in done}
            for uid, lids in self.committed.get(t, {}).items():
                if uid not in segs and not all(map(self._deleted, lids)):
                    self.violations.append(f"{t}: committed segment {uid} over {lids} vanished")
            for lost in lost_ledgers(info):
                if not self._deleted(lost.ledger_id):
                    self.violations.append(f"{t}: ledger {lost.ledger_id} recorded lost while "
                                           "Pulsar had it")
            self.ids[t], self.committed[t] = ids, segs
        self.polls += 1


class TierChecker:
    """Reads every committed segment soon after its commit (the daemon's gc may delete it
    with its ledgers some seconds later), all of it — the ranges its index holds, also those of
    ledgers whose records already left the catalog — and compares each payload with what the
    broker acknowledged at that position. A segment counts as committed when the watcher saw
    it complete in the catalog or the daemon logged its commit (``segment <uid> offloaded``,
    written after the commit's compare-and-set): a segment whose ledgers Pulsar deleted right
    after its commit may leave the catalog between two polls."""

    def __init__(self, reader: TierReader, watcher: CatalogWatcher, pulsar: FakePulsar,
                 daemon: Daemon) -> None:
        self.reader = reader
        self.watcher = watcher
        self.pulsar = pulsar
        self.daemon = daemon
        self._read_upto: dict[Path, int] = {}
        self.logged: dict[Any, TopicName] = {}
        self.done: set[Any] = set()
        self.offloaded: dict[int, Counter[int]] = {}  # ledger -> entry -> segments holding it
        self.checked = 0
        self.differing = 0
        self.phantom = 0
        self.gone_before_check = 0
        self.problems: list[str] = []

    def _tail_logs(self) -> None:
        """Commits the daemon logged since the last look (each run's log read incrementally)."""
        for path in list(self.daemon.logs):
            try:
                with path.open("rb") as f:
                    f.seek(self._read_upto.get(path, 0))
                    chunk = f.read()
            except FileNotFoundError:
                continue
            whole = chunk[:chunk.rfind(b"\n") + 1]  # a line being written waits
            self._read_upto[path] = self._read_upto.get(path, 0) + len(whole)
            for line in whole.decode(errors="replace").splitlines():
                m = _COMMIT.search(line)
                if m is not None:
                    self.logged.setdefault(uuid.UUID(m["uid"]), TopicName.parse(m["topic"]))

    async def run(self, stop: asyncio.Event) -> None:
        while True:
            await asyncio.to_thread(self._tail_logs)
            seen = dict(self.watcher.segments_ever)
            todo: list[tuple[Any, TopicName, catalog.Segment | None]] = [
                (uid, t, seg) for uid, (t, seg) in seen.items() if uid not in self.done]
            todo += [(uid, t, None) for uid, t in self.logged.items()
                     if uid not in self.done and uid not in seen]
            for uid, t, seg in todo:
                await self.check(t, uid, seg)
                self.done.add(uid)
            if stop.is_set() and not todo:
                return
            await asyncio.sleep(0.1)

    async def check(self, topic: TopicName, uid: Any, seg: catalog.Segment | None) -> None:
        try:
            idx = await self.reader.index(streaming_index_key(uid))
            assert isinstance(idx, StreamingIndex)
            full = catalog.Segment(uid, catalog.SegmentKind.STREAMING, tuple(
                catalog.LedgerRange(s.ledger_id, s.blocks[0].first_entry_id, s.last_entry_id)
                for s in idx.sections), True)
            entries = [(e.position, bytes(e.payload)) async for e in self.reader.read_segment(full)]
        except OffloaddError:
            # gc took it with its ledgers first: count what the catalog said it held
            self.gone_before_check += 1
            for r in seg.ranges if seg is not None else ():
                self.offloaded.setdefault(r.ledger_id, Counter()).update(
                    range(r.first, r.last + 1))
            return
        for pos, payload in entries:
            lid, eid = pos.ledger_id, pos.entry_id
            self.offloaded.setdefault(lid, Counter())[eid] += 1
            life = self.pulsar.history.get(lid)
            if life is None or life.topic != topic or eid >= len(life.payloads):
                self.phantom += 1
                self.problems.append(f"{topic}: {lid}:{eid} (segment {uid}) is in the tier "
                                     "but no broker had it acknowledged")
            elif payload != life.payloads[eid]:
                self.differing += 1
                self.problems.append(f"{topic}: {lid}:{eid} (segment {uid}) differs from "
                                     "what was written")
            self.checked += 1


# ---- the daemon and the commands -----------------------------------------------------------------


class Daemon:
    """``offloadd run`` as a real process; every run's stderr kept in its own file."""

    def __init__(self, config: Path, root: Path) -> None:
        self.config = config
        self.root = root
        self.proc: asyncio.subprocess.Process | None = None
        self.runs = 0
        self.logs: list[Path] = []
        self.down_since: float | None = time.monotonic()
        self.down: list[tuple[float, float]] = []  # windows without a daemon

    async def start(self) -> None:
        self.runs += 1
        log = self.root / f"daemon-{self.runs:03d}.log"
        self.logs.append(log)
        err = await asyncio.to_thread(log.open, "wb")
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *OFFLOADD, "run", "--config", str(self.config), cwd=self.root,
                stdin=asyncio.subprocess.DEVNULL, stdout=err, stderr=err)
        finally:
            err.close()  # the child has its own descriptor
        # down until it has read Pulsar's lists: what was deleted before is not its to know
        deadline = time.monotonic() + 60
        while "offloadd ready" not in await asyncio.to_thread(log.read_text, errors="replace"):
            if self.proc.returncode is not None or time.monotonic() > deadline:
                raise AssertionError(f"offloadd run did not start:\n{self.text()[-3000:]}")
            await asyncio.sleep(0.05)
        if self.down_since is not None:
            self.down.append((self.down_since, time.monotonic()))
            self.down_since = None

    async def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        await self.proc.wait()
        self.down_since = time.monotonic()

    async def stop(self) -> int:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(self.proc.wait(), 60)
        self.down_since = time.monotonic()
        return code

    def pause(self) -> None:
        """SIGSTOP: a stopped daemon reads no list either, so this is a window without one."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        self.down_since = time.monotonic()

    def resume(self) -> None:
        """SIGCONT; the window without a daemon ends now."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)
        self._window_closes()

    async def resume_and_catch_up(self, topics: list[TopicName]) -> None:
        """SIGCONT; the window without a daemon ends only once it has read every topic's list
        again (on a loaded machine that is seconds after the signal: a ledger created while it
        was stopped and deleted before that read is one it cannot know)."""
        assert self.proc is not None
        log = self.logs[-1]
        start = (await asyncio.to_thread(log.stat)).st_size
        self.proc.send_signal(signal.SIGCONT)
        wanted = {f"topic {t}: mirrored Pulsar's ledger list" for t in topics}
        deadline = time.monotonic() + 30
        while wanted and time.monotonic() < deadline and self.alive():
            await asyncio.sleep(0.05)
            text = await asyncio.to_thread(_read_from, log, start)
            wanted = {w for w in wanted if w not in text}
        self._window_closes()

    def _window_closes(self) -> None:
        if self.down_since is not None:
            self.down.append((self.down_since, time.monotonic()))
            self.down_since = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def text(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.logs if p.exists())


@dataclass
class CommandRun:
    args: tuple[str, ...]
    mode: str  # "daemon down", "daemon stopped", "beside the daemon"
    code: int
    seconds: float
    catalog_written: bool | None  # None: not checkable (the daemon was writing)
    out: str = field(default="", repr=False)


async def command(config: Path, root: Path, *args: str, timeout: float = 180
                  ) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *OFFLOADD, *args, "--config", str(config), cwd=root, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


# ---- the soak ------------------------------------------------------------------------------------


@dataclass
class Soak:
    cluster: Cluster
    root: Path
    plan: Plan
    topics: list[TopicName] = field(default_factory=list)
    commands: list[CommandRun] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)
    stats: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rnd = random.Random(self.plan.seed)
        self.topics = [TopicName.parse(f"persistent://public/soak/t{i}")
                       for i in range(self.plan.topics)]
        self.config = self.root / "offloadd.toml"
        self.config.write_text(CONFIG.format(
            offloadd_url=self.cluster.offloadd_url, pulsar_url=self.cluster.pulsar_url,
            tier=self.root / "tier", root=self.root))
        self.daemon = Daemon(self.config, self.root)
        self.watcher = CatalogWatcher(self.cluster.ours, self.cluster.pulsar, self.topics)
        self.reader = TierReader(self.cluster.ours, FilesystemBlobStore(self.root / "tier"))
        self.checker = TierChecker(self.reader, self.watcher, self.cluster.pulsar, self.daemon)

    # ---- commands ------------------------------------------------------------------------
    async def _snap(self) -> dict[str, tuple[int, ...]]:
        return await asyncio.to_thread(snapshot, self.cluster.hosts, self.cluster.offloadd_url)

    async def run_command(self, mode: str, *args: str) -> CommandRun:
        checkable = mode != "beside the daemon"
        before = await self._snap() if checkable else None
        t0 = time.monotonic()
        code, out, err = await command(self.config, self.root, *args)
        took = time.monotonic() - t0
        written = None
        if checkable:
            written = _written(before, await self._snap())
            if written:
                self.problems.append(f"offloadd {' '.join(args)} ({mode}) wrote the catalog")
        # status exits 1 while a topic is failing and 3 once data was lost to retention: both
        # happen here for real (faults, retention racing a stopped daemon)
        allowed = (0, 1, 3) if args[0] == "status" else (0, 1)
        if "Traceback" in err or code not in allowed:
            self.problems.append(f"offloadd {' '.join(args)} ({mode}) exited {code}: "
                                 f"{err[-2000:]}")
        if args[0] == "status" and "--json" in args and code in allowed:
            for t in json.loads(out)["topics"]:
                for lost in t.get("data_lost", []):
                    if not self._deleted(lost["ledger"]):
                        self.problems.append(f"status showed ledger {lost['ledger']} lost, "
                                             "Pulsar has it")
        run = CommandRun(args, mode, code, round(took, 2), written, out)
        self.commands.append(run)
        return run

    def _deleted(self, lid: int) -> bool:
        life = self.cluster.pulsar.history.get(lid)
        return life is not None and life.deleted is not None

    def _one_topic(self) -> str:
        return str(self.rnd.choice(self.topics))

    # ---- rounds --------------------------------------------------------------------------
    async def freeze_bookie(self) -> None:
        """A bookie stops answering (SIGSTOP) while ``status`` runs beside the daemon."""
        b: FakeBookie = self.rnd.choice(self.cluster.bookies)
        b.freeze()
        self.faults["bookie frozen"] += 1
        try:
            slow = asyncio.ensure_future(
                self.run_command("beside the daemon", "status", "--json"))
            await asyncio.sleep(self.rnd.uniform(1.5, 4.0))
        finally:
            b.thaw()
        await slow

    async def slow_bookie(self) -> None:
        b: FakeBookie = self.rnd.choice(self.cluster.bookies)
        b.latency_s, b.jitter_s = 0.02, self.rnd.uniform(0.05, 0.3)
        self.faults["bookie slow"] += 1
        try:
            await self.run_command("beside the daemon", "verify", "--topic",
                                   self._one_topic(), "--json")
            await asyncio.sleep(self.rnd.uniform(0.5, 2.0))
        finally:
            b.latency_s = b.jitter_s = 0.0

    async def stopped_daemon_commands(self) -> None:
        """The daemon stopped (SIGSTOP) while read-only commands run: nothing else writes
        offloadd's catalog, so any change is theirs."""
        self.daemon.pause()
        self.faults["daemon stopped"] += 1
        try:
            await asyncio.sleep(0.5)  # what it sent before the stop reaches ZooKeeper
            await self.run_command("daemon stopped", "status", "--json")
            await self.run_command("daemon stopped", "status")
        finally:
            await self.daemon.resume_and_catch_up(self.topics)

    async def kill_and_restart(self) -> None:
        """kill -9; down long enough for retention to delete ledgers the daemon knew and some
        it never sees; the read-only commands run meanwhile; then a restart."""
        await self.daemon.kill9()
        self.faults["daemon kill -9"] += 1
        down = self.rnd.uniform(self.plan.retention_s + 2.5, self.plan.retention_s + 5.0)
        t0 = time.monotonic()
        await self.run_command("daemon down", "status", "--json")
        await self.run_command("daemon down", "verify", "--topic", self._one_topic(), "--json")
        await asyncio.sleep(max(down - (time.monotonic() - t0), 0.0))
        await self.daemon.start()

    async def graceful_restart(self) -> None:
        code = await self.daemon.stop()
        if code != 0:
            self.problems.append(f"offloadd run exited {code} on SIGTERM")
        self.faults["daemon restarted"] += 1
        await self.run_command("daemon down", "status")
        await self.daemon.start()

    async def rounds(self, deadline: float) -> None:
        cycle = [self.freeze_bookie, self.stopped_daemon_commands, self.kill_and_restart,
                 self.slow_bookie, self.freeze_bookie, self.graceful_restart]
        i = 0
        while time.monotonic() < deadline:
            await cycle[i % len(cycle)]()
            i += 1
            await asyncio.sleep(self.rnd.uniform(0.5, 1.5))
            if not self.daemon.alive():
                self.problems.append(f"offloadd run died:\n{self.daemon.text()[-3000:]}")
                await self.daemon.start()

    # ---- the whole run -------------------------------------------------------------------
    async def run(self) -> dict[str, Any]:
        p = self.cluster.pulsar
        t_start = time.monotonic()
        stop_writers, stop_watch = asyncio.Event(), asyncio.Event()
        brokers = [asyncio.ensure_future(broker(p, t, random.Random(self.plan.seed + i),
                                                stop_writers, self.stats))
                   for i, t in enumerate(self.topics)]
        retainer = asyncio.ensure_future(retention(p, self.topics, self.plan.retention_s,
                                                   stop_writers, self.stats))
        watching = asyncio.ensure_future(self.watcher.run(stop_watch))
        checking = asyncio.ensure_future(self.checker.run(stop_watch))
        try:
            await asyncio.sleep(1.0)  # some history before the daemon first starts
            await self.daemon.start()
            await self.rounds(time.monotonic() + self.plan.seconds)
            stop_writers.set()
            await asyncio.gather(*brokers, retainer)
            await self.drain(timeout=120 + self.plan.seconds / 5)
            code = await self.daemon.stop()
            if code != 0:
                self.problems.append(f"offloadd run exited {code} on the final SIGTERM")
            await self.watcher.poll()
        finally:
            stop_writers.set()
            stop_watch.set()
            await asyncio.gather(*brokers, retainer, watching, checking,
                                 return_exceptions=True)
            if self.daemon.alive():
                assert self.daemon.proc is not None
                self.daemon.proc.kill()
                await self.daemon.proc.wait()
        for task in (*brokers, retainer, watching, checking):
            if task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        figures = await self.check()
        figures["seconds"] = round(time.monotonic() - t_start, 1)
        return figures

    async def drain(self, timeout: float) -> None:
        """Until every acknowledged entry of every ledger Pulsar still has is committed."""
        deadline = time.monotonic() + timeout
        while True:
            missing = await self._not_committed()
            if not missing:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"not drained after {timeout:g}s: {missing[:10]}\n"
                                     f"{self.daemon.text()[-4000:]}")
            await asyncio.sleep(0.5)

    async def _committed(self) -> dict[int, set[int]]:
        """Entry ids per ledger that committed segments hold, per the catalog."""
        out: dict[int, set[int]] = {}
        for t in self.topics:
            info, _ = await managed_ledger.load(self.cluster.ours, t.managed_ledger)
            for s in catalog.segments(info):
                if s.complete:
                    for r in s.ranges:
                        out.setdefault(r.ledger_id, set()).update(range(r.first, r.last + 1))
        return out

    async def _not_committed(self) -> list[tuple[int, int]]:
        held = await self._committed()
        out = []
        for life in self.cluster.pulsar.history.values():
            if life.deleted is None and len(life.payloads) > len(held.get(life.ledger_id, ())):
                out.append((life.ledger_id, len(life.payloads)))
        return out

    # ---- the checks ----------------------------------------------------------------------
    async def check(self) -> dict[str, Any]:
        p = self.cluster.pulsar
        final = [await self.run_command("daemon down", "verify", "--json")]
        gc_code, _, gc_err = await command(self.config, self.root, "gc", "--grace", "0",
                                                "--json")
        if gc_code not in (0, 1) or "Traceback" in gc_err:
            self.problems.append(f"gc exited {gc_code}: {gc_err[-2000:]}")
        _, out, _ = await command(self.config, self.root, "verify", "--json",
                                  "--orphan-grace", "0")
        report = json.loads(out)
        orphans = len(report["orphans"])
        final.append(await self.run_command("daemon down", "status", "--json"))
        # verify before gc: a gap may only be where Pulsar deleted a ledger before offload
        before_gc = json.loads(final[0].out)
        gaps = [g for t in before_gc["topics"] for g in t["gaps"]]
        for g in gaps:
            m = _GAP.search(g)
            if m is None or not self._deleted(int(m["ledger"])):
                self.problems.append(f"verify: a gap not explained by retention: {g}")

        # the tier as gc left it, read back once more: each entry already checked (by the
        # checker, right after its commit), once, and still what the broker acknowledged
        lives = p.history
        ck = self.checker
        self.problems += ck.problems
        final_read = 0
        seen_final: set[tuple[int, int]] = set()
        for t in self.topics:
            async for e in self.reader.read(t):
                lid, eid = e.position.ledger_id, e.position.entry_id
                life = lives.get(lid)
                if (lid, eid) in seen_final or ck.offloaded.get(lid, Counter())[eid] != 1 \
                        or life is None or eid >= len(life.payloads) \
                        or bytes(e.payload) != life.payloads[eid]:
                    self.problems.append(f"{t}: {lid}:{eid} read back at the end: duplicated, "
                                         "never seen committed, or different")
                seen_final.add((lid, eid))
                final_read += 1
        duplicated = sum(n - 1 for c in ck.offloaded.values() for n in c.values() if n > 1)
        in_tier = {lid: set(c) for lid, c in ck.offloaded.items()}

        # what is not in the tier: lost to retention (reported, or unknowable) or lost
        recorded: dict[int, tuple[int, int]] = {}
        for t in self.topics:
            info, _ = await managed_ledger.load(self.cluster.ours, t.managed_ledger)
            for lost in lost_ledgers(info):
                recorded[lost.ledger_id] = (lost.first, lost.last)
        daemon_log = self.daemon.text()
        mirrored = _mirror_reads(daemon_log)
        silent = reported_entries = unknowable_ledgers = unknowable_entries = 0
        false_reports = 0
        written = sum(len(x.payloads) for x in lives.values())
        for life in lives.values():
            absent = set(range(len(life.payloads))) - in_tier.get(life.ledger_id, set())
            if not absent:
                continue
            if life.deleted is None:
                silent += len(absent)
                self.problems.append(f"ledger {life.ledger_id}: {len(absent)} entries Pulsar "
                                     "still has are not in the tier")
                continue
            rec = recorded.get(life.ledger_id)
            if rec is not None and _covers(rec, absent):
                reported_entries += len(absent)
            elif life.ledger_id not in self.watcher.seen and self._while_down(life, mirrored):
                unknowable_ledgers += 1
                unknowable_entries += len(absent)
            elif _logged_lost(daemon_log, life):
                reported_entries += len(absent)
            else:
                silent += len(absent)
                self.problems.append(f"ledger {life.ledger_id}: entries {sorted(absent)[:5]}… "
                                     f"deleted before offload, not reported (recorded {rec})")
        for lid, (first, last) in recorded.items():
            life = lives.get(lid)
            tier = in_tier.get(lid, set())
            end = last if last >= 0 else (len(life.payloads) - 1 if life else first)
            if life is None or life.deleted is None or any(first <= e <= end for e in tier):
                false_reports += 1
                self.problems.append(f"false loss report: ledger {lid} {first}..{last}")
        log_reports = [line for line in daemon_log.splitlines() if "data lost" in line]
        for line in log_reports:
            for lid in _ledger_ids(line):
                if not self._deleted(lid):
                    false_reports += 1
                    self.problems.append(f"false loss in the log: {line}")
        if orphans:
            self.problems.append(f"{orphans} orphans after gc: {report['orphans'][:5]}")
        for v in report["topics"]:
            if v["errors"] or v["duplicates"] or v["checksum_mismatches"]:
                self.problems.append(f"verify: {v}")
        self.problems += self.watcher.violations
        catalog_writes = sum(1 for c in self.commands if c.catalog_written)
        by_mode = Counter(f"{c.args[0]} ({c.mode})" for c in self.commands)
        return {
            "topics": len(self.topics),
            "ledgers_created": len(lives),
            "ledgers_deleted_by_retention": sum(1 for x in lives.values() if x.deleted),
            "torn_ledgers": sum(1 for x in lives.values() if x.torn),
            "ensemble_changes": p.ensemble_changes,
            "entries_written": written,
            "entries_checked": ck.checked,
            "entries_read_back_at_the_end": final_read,
            "segments_checked": len(ck.done),
            "segments_gone_before_checked": ck.gone_before_check,
            "entries_lost": silent,
            "entries_duplicated": duplicated,
            "payload_mismatches": ck.differing,
            "phantom_entries": ck.phantom,
            "false_loss_reports": false_reports,
            "lost_to_retention_reported_entries": reported_entries,
            "lost_to_retention_reported_ledgers": len(recorded),
            "unknowable_ledgers": unknowable_ledgers,
            "unknowable_entries": unknowable_entries,
            "faults": dict(self.faults),
            "faults_injected": sum(self.faults.values()),
            "daemon_runs": self.daemon.runs,
            "commands": dict(by_mode),
            "commands_checked_by_znode_versions": sum(1 for c in self.commands
                                                      if c.catalog_written is not None),
            "catalog_written_by_read_only_commands": catalog_writes,
            "catalog_polls": self.watcher.polls,
            "catalog_violations": len(self.watcher.violations),
            "slowest_status_s": max((c.seconds for c in self.commands
                                     if c.args[0] == "status"), default=0),
            "orphans_left": orphans,
            "final_verify_ok": final[0].code == 0,
            "final_verify_gaps_all_lost_to_retention": len(gaps),
            "final_verify_before_gc": {
                "errors": sum(len(t["errors"]) for t in before_gc["topics"]),
                "duplicates": sum(t["duplicates"] for t in before_gc["topics"]),
                "checksum_mismatches": sum(t["checksum_mismatches"]
                                           for t in before_gc["topics"]),
                "orphans": len(before_gc["orphans"]),
                "first_errors": [e for t in before_gc["topics"] for e in t["errors"]][:3]},
            "gc_exit": gc_code,
        }

    def _while_down(self, life: LedgerLife, mirrored: dict[str, list[float]]) -> bool:
        """Deleted while no daemon was reading Pulsar's lists (killed until ready again, or
        stopped until it had read them again), and created after the last list the daemon had
        read of its topic before that (a second's leeway before the window in any case: a
        loaded daemon is seconds behind the lists, and what it never read it cannot know)."""
        assert life.deleted is not None
        windows = list(self.daemon.down)
        if self.daemon.down_since is not None:
            windows.append((self.daemon.down_since, time.monotonic()))
        reads = mirrored.get(str(life.topic), [])
        for lo, hi in windows:
            if life.deleted > hi:
                continue
            if lo - 1.0 <= life.created:
                return True
            last_read = max((t for t in reads if t <= lo + _WALL), default=None)
            if last_read is not None and life.created + _WALL > last_read + 0.5 \
                    and life.created >= lo - 10.0:
                return True
        return False


def _mirror_reads(log: str) -> dict[str, list[float]]:
    """Wall-clock times at which the daemon logged a topic's ledger list as read, by topic."""
    out: dict[str, list[float]] = {}
    for m in _MIRROR.finditer(log):
        out.setdefault(m["topic"], []).append(datetime.fromisoformat(m["when"]).timestamp())
    return out


def _written(before: dict[str, tuple[int, ...]] | None,
             after: dict[str, tuple[int, ...]]) -> bool:
    """Whether the catalog changed between two snapshots other than by the stopped or killed
    daemon's ZooKeeper session expiring (on a loaded machine a command can outlast the
    session timeout): its ephemeral nodes vanish and their parents' child versions move."""
    assert before is not None
    if set(after) - set(before):
        return True
    for path, stat in before.items():
        now = after.get(path)
        if now is None:
            if stat[6] == 0:  # a persistent node deleted
                return True
            continue
        version, _cversion, aversion, mzxid, _pzxid, size, owner = stat
        if (now[0], now[2], now[3], now[5], now[6]) != (version, aversion, mzxid, size, owner):
            return True
    return False


def _read_from(path: Path, offset: int) -> str:
    with path.open("rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def _covers(rec: tuple[int, int], absent: set[int]) -> bool:
    first, last = rec
    return min(absent) >= first and (last < 0 or max(absent) <= last)


def _ledger_ids(line: str) -> list[int]:
    out = []
    words = line.replace(",", " ").replace(";", " ").split()
    for a, b in itertools.pairwise(words):
        if a == "ledger" and b.isdigit():
            out.append(int(b))
    return out


def _logged_lost(log: str, life: LedgerLife) -> bool:
    """The offloader itself reported entries of this ledger lost to retention (it was deleted
    under its position, or under a segment assigned but not yet committed)."""
    lid = life.ledger_id
    return any("lost to retention" in line and (f"ledger {lid} was deleted" in line
                                                or f" {lid}:" in line)
               for line in log.splitlines())


def _record(request: pytest.FixtureRequest, mode: str, figures: dict[str, Any]) -> None:
    data = {**figures, "mode": mode, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    text = json.dumps(data, indent=2, sort_keys=True)
    print(f"\noffloadd sidecar soak figures ({mode}):\n{text}")
    cache = getattr(request.config, "cache", None)
    if cache is not None:
        cache.set(f"{CACHE_KEY}/{mode}", data)
    out = os.environ.get("OFFLOADD_SIDECAR_SOAK_JSON")
    if out:
        path = Path(out)
        old = json.loads(path.read_text()) if path.exists() else {}
        path.write_text(json.dumps({**old, mode: data}, indent=2, sort_keys=True) + "\n")


async def _soak(zk_server: str, tmp_path: Path, plan: Plan, mode: str,
                request: pytest.FixtureRequest) -> None:
    async with open_cluster(zk_server, bookies=4, add_timeout_s=0.5, avoid_s=3.0,
                            rotate=True) as cluster:
        soak = Soak(cluster, tmp_path, plan)
        figures = await soak.run()
    figures["problems"] = len(soak.problems)
    _record(request, mode, figures)
    assert soak.problems == [], "\n".join(soak.problems[:40])
    _assert_clean(figures)


def _assert_clean(figures: dict[str, Any]) -> None:
    for key in ("entries_lost", "entries_duplicated", "payload_mismatches", "phantom_entries",
                "false_loss_reports", "catalog_written_by_read_only_commands",
                "catalog_violations", "orphans_left"):
        assert figures[key] == 0, (key, figures)
    assert figures["entries_checked"] > 0 and figures["ledgers_deleted_by_retention"] > 0
    assert figures["commands_checked_by_znode_versions"] >= 4


@pytest.mark.timeout(300)
async def test_sidecar_soak(zk_server: str, tmp_path: Path,
                            request: pytest.FixtureRequest) -> None:
    await _soak(zk_server, tmp_path, Plan(seconds=40), "ci", request)


@pytest.mark.slow
@pytest.mark.timeout(1500)
async def test_sidecar_soak_long(zk_server: str, tmp_path: Path,
                                 request: pytest.FixtureRequest) -> None:
    await _soak(zk_server, tmp_path, Plan(seconds=600, seed=4242), "long", request)
