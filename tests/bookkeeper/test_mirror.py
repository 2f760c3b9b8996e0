"""The mirror against stale views (issue 13, defects 1 and 2).

offloadd's mirror of Pulsar's ledger list drops the record of every ledger Pulsar's list lacks,
offload contexts included. A list read before Pulsar added a ledger lacks it too: applying such
a list after a newer one dropped committed segments and reported data lost that Pulsar never
deleted. Here the slow callers are made slow on purpose — their bookies frozen while they hold
an old list — and Pulsar moves on meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from offloadd import config
from offloadd.commit.ownership import Ownership
from offloadd.ledger.bookkeeper import BookKeeperLedgerSource, lost_ledgers
from offloadd.ledger.bookkeeper.client import ClientOptions
from offloadd.metadata import managed_ledger
from offloadd.metadata.zookeeper import ZooKeeperMetadataStore
from offloadd.model import TopicName, catalog
from offloadd.shell import status
from offloadd.shell.runtime import Runtime
from tests.bookkeeper.cluster import FakePulsar
from tests.bookkeeper.conftest import Cluster, open_cluster
from tests.bookkeeper.test_source import payloads, snapshot
from tests.fixtures.fake_bookie import FakeBookie

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

A = TopicName.parse("persistent://public/default/alpha")


async def until(pred: Callable[[], Any], what: str, timeout: float = 30.0) -> None:
    """Wait for ``pred`` (sync or async) to hold; fail naming ``what`` after ``timeout``."""
    try:
        async with asyncio.timeout(timeout):
            while True:
                got = pred()
                if asyncio.iscoroutine(got):
                    got = await got
                if got:
                    return
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def mirror_ids(store: ZooKeeperMetadataStore, topic: TopicName) -> list[int]:
    info, _ = await managed_ledger.load(store, topic.managed_ledger)
    return [li.ledgerId for li in info.ledgerInfo]


def held(bookies: list[FakeBookie]) -> int:
    return sum(b.served["held"] for b in bookies)


class TestSlowCallerWithAnOldList:
    """Defect 1: a caller that read Pulsar's list, then waited on bookies while Pulsar added a
    ledger (and someone mirrored it), must not make the mirror forget that ledger."""

    async def _scenario(self, cluster: Cluster, same_source: bool,
                        caplog: pytest.LogCaptureFixture) -> None:
        p = cluster.pulsar
        await p.append(A, payloads(5, "a"))
        await p.close_ledger(A)  # ledger 1
        await p.append(A, payloads(3, "b"))  # ledger 2, open
        await p.append(A, payloads(2, "c"))
        # long read timeouts: the slow call waits for the thaw, not for a timeout
        slow_opts = ClientOptions(read_timeout_s=60.0, connect_timeout_s=5.0)
        src = cluster.source(client=slow_opts)
        other = src if same_source else cluster.source()
        try:
            with caplog.at_level(logging.INFO):
                assert await src.list_topics() == [A]
                assert await mirror_ids(cluster.ours, A) == [1, 2]
                before = held(cluster.bookies)
                for b in cluster.bookies:
                    b.freeze()
                # first sight of open ledger 2's LAC: asks its bookies, and they do not answer
                slow = asyncio.ensure_future(src.ledgers(A))
                await until(lambda: held(cluster.bookies) > before, "the slow call's reads")
                await p.roll(A)  # Pulsar moves on: 2 closed, 3 opened (ZooKeeper only)
                # the discovery loop (or another daemon) mirrors the newer list meanwhile
                await until(lambda: listed_and_mirrored(other, cluster, [1, 2, 3]),
                            "the newer list mirrored")
                for b in cluster.bookies:
                    b.thaw()
                descs = await asyncio.wait_for(slow, 30)
                assert [d.ledger_id for d in descs][:2] == [1, 2]
                assert await mirror_ids(cluster.ours, A) == [1, 2, 3]
                info, _ = await managed_ledger.load(cluster.ours, A.managed_ledger)
                assert lost_ledgers(info) == []
                assert "data lost" not in caplog.text
                assert not src.metrics.lost_ledgers and not other.metrics.lost_ledgers

                # a ledger Pulsar really deletes later is still reported, with its entries
                await p.delete_ledger(A, 1)
                await until(lambda: listed_and_mirrored(src, cluster, [2, 3]),
                            "ledger 1 dropped")
                info, _ = await managed_ledger.load(cluster.ours, A.managed_ledger)
                assert [(x.ledger_id, x.first, x.last) for x in lost_ledgers(info)] == \
                    [(1, 0, 4)]
        finally:
            for b in cluster.bookies:
                b.thaw()
            await src.close()
            if other is not src:
                await other.close()

    async def test_one_source_its_listing_and_a_slow_ledgers_call(
            self, cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
        await self._scenario(cluster, True, caplog)

    async def test_two_sources_the_slow_one_finishing_last(
            self, cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
        await self._scenario(cluster, False, caplog)


async def _mirror_is(cluster: Cluster, ids: list[int]) -> bool:
    return await mirror_ids(cluster.ours, A) == ids


async def listed_and_mirrored(src: BookKeeperLedgerSource, cluster: Cluster,
                              ids: list[int]) -> bool:
    """A discovery pass, as the daemon makes one each second, and the mirror it leaves is
    ``ids`` (a pass right after a change of Pulsar's list may run before its watch fires)."""
    await src.list_topics()
    return await _mirror_is(cluster, ids)


# ---- read-only commands -------------------------------------------------------------------------

CONFIG = """
[metadata]
url = "{offloadd_url}"
session_timeout_s = 6
[source]
kind = "bookkeeper"
pulsar_zk = "{pulsar_url}"
topics = ["persistent://public/default/*"]
read_timeout_s = {read_timeout}
bookie_connect_timeout_s = 1.0
bookie_quarantine_s = 5
reads_in_flight = 16
readahead_bytes = 65536
[blobstore]
driver = "filesystem"
path = "{tier}"
[offload]
max_size_per_segment_mbytes = 0.05
max_segment_rollover_time_minutes = 0.01
max_block_size_bytes = 8192
buffer_max_bytes = 1048576
retry_base_s = 0.2
retry_max_s = 1.0
[metrics]
enabled = false
[daemon]
pid_file = "{tmp}/offloadd.pid"
shutdown_deadline_s = 10
"""


def write_config(cluster: Cluster, tmp: Path, name: str, read_timeout: float = 1.0) -> Path:
    f = tmp / name
    f.write_text(CONFIG.format(offloadd_url=cluster.offloadd_url, pulsar_url=cluster.pulsar_url,
                               tier=tmp / "tier", tmp=tmp, read_timeout=read_timeout))
    return f


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "offloadd", *args], capture_output=True,
                          text=True, timeout=timeout)


class TestReadOnlyCommandsNeverWrite:
    """Defect 2: ``status`` and ``verify`` mirrored Pulsar's list themselves. Only the daemon
    writes the catalog; a command that reads leaves every node as it found it."""

    async def test_status_and_verify_leave_every_catalog_node_as_it_was(
            self, cluster: Cluster, tmp_path: Path) -> None:
        p = cluster.pulsar
        await p.append(A, payloads(6, "h"))
        await p.roll(A)
        await p.append(A, payloads(4, "i"))
        daemon_like = cluster.source()
        try:  # the daemon mirrored the topic, then stopped
            assert await daemon_like.list_topics() == [A]
            await daemon_like.ledgers(A)
        finally:
            await daemon_like.close()
        # Pulsar moved on while no daemon ran: a writing command would mirror all of this
        await p.roll(A)
        await p.append(A, payloads(3, "j"))
        await p.append(A, payloads(1, "k"))
        await p.delete_ledger(A, 1)
        cfg = write_config(cluster, tmp_path, "offloadd.toml")
        before = await asyncio.to_thread(snapshot, cluster.hosts, cluster.offloadd_url)
        for args in (["status"], ["status", "--json"], ["verify"], ["verify", "--json"]):
            done = await asyncio.to_thread(cli, *args, "--config", str(cfg))
            assert "Traceback" not in done.stderr, done.stderr
            if args == ["status", "--json"]:  # the bookies it asked for the open ledger's LAC
                rows = json.loads(done.stdout)["source"]["bookies"]
                assert rows and all(r["tail"] == "v3" for r in rows.values()), rows
            after = await asyncio.to_thread(snapshot, cluster.hosts, cluster.offloadd_url)
            assert after == before, f"offloadd {' '.join(args)} wrote the catalog"
        assert await mirror_ids(cluster.ours, A) == [1, 2]  # still as the daemon left it

    def test_the_wiring_opens_the_commands_source_read_only(self, cluster: Cluster,
                                                            tmp_path: Path) -> None:
        from offloadd import wiring
        from offloadd.ledger.bookkeeper import BookKeeperLedgerSource

        settings = config.load(write_config(cluster, tmp_path, "offloadd.toml"))
        ro = wiring.open_source(settings, cluster.ours, read_only=True)
        rw = wiring.open_source(settings, cluster.ours)
        assert isinstance(ro, BookKeeperLedgerSource) and ro.read_only
        assert isinstance(rw, BookKeeperLedgerSource) and not rw.read_only


@pytest.mark.timeout(180)
async def test_a_slow_status_beside_a_running_daemon_drops_no_ledger(
        zk_server: str, tmp_path: Path) -> None:
    """Defect 2 as it was seen: a daemon offloads a live topic while ``status`` — slowed down
    by a frozen bookie — holds an old ledger list. The catalog never loses a ledger Pulsar still
    lists, nor a committed segment, and no loss is reported."""
    async with open_cluster(zk_server, bookies=4, add_timeout_s=0.5, avoid_s=60.0) as cl:
        p = cl.pulsar
        frozen = cl.bookies[0]
        others = [b.address for b in cl.bookies[1:3]]
        cfg = write_config(cl, tmp_path, "daemon.toml")
        # status waits on the frozen bookie until the thaw (its read timeout is longer)
        slow_cfg = write_config(cl, tmp_path, "status.toml", read_timeout=60.0)
        rnd = random.Random(13)
        for _ in range(2):
            await p.append(A, [rnd.randbytes(rnd.randint(1, 600)) for _ in range(40)])
            await p.roll(A)
        rt = await Runtime.open(config.load(cfg), ownership=Ownership())
        go, stop = asyncio.Event(), asyncio.Event()
        go.set()
        paused = asyncio.Event()
        writer = asyncio.ensure_future(_write(p, rnd, go, paused, stop))
        watcher = _CatalogWatcher(cl.ours, p)
        watching = asyncio.ensure_future(watcher.run(stop))
        daemon = asyncio.ensure_future(rt.daemon.run(install_signals=False))
        try:
            await until(lambda: watcher.committed, "a first committed segment", 60)
            go.clear()
            await until(paused.is_set, "the writer to pause")
            # a fresh ledger striped over the bookie about to freeze, a little in it
            await p.close_ledger(A)
            await p.open_ledger(A, ensemble=[frozen.address, *others])
            await p.append(A, [b"before-the-freeze"] * 5)
            await p.append(A, [b"confirming"] * 2)
            frozen.freeze()
            known = frozen.connections
            slow = asyncio.ensure_future(status.collect(config.load(slow_cfg)))
            await until(lambda: any(c.held for c in frozen.connections - known),
                        "status to wait on the frozen bookie", 60)
            go.set()  # the writer changes the ensemble and rolls on; the daemon mirrors it
            frozen_ledger = p.ledgers_of(A)[-1].ledger_id
            await until(lambda: len([x for x in watcher.ids if x > frozen_ledger]) >= 2,
                        "the daemon to mirror ledgers newer than the slow status's list", 60)
            frozen.thaw()
            st = await asyncio.wait_for(slow, 60)
            (t,) = st["topics"]
            assert "data_lost" not in t and "error" not in t, t
            await asyncio.sleep(1.0)  # the daemon goes on a little after the status
        finally:
            frozen.thaw()
            stop.set()
            await asyncio.gather(writer, watching, return_exceptions=True)
            rt.daemon.request_stop()
            await asyncio.gather(daemon, return_exceptions=True)
            await rt.close()
        assert writer.exception() is None and watching.exception() is None
        assert p.ensemble_changes >= 1  # the freeze was felt by the writer too
        assert watcher.violations == [], watcher.violations
        info, _ = await managed_ledger.load(cl.ours, A.managed_ledger)
        assert lost_ledgers(info) == []


async def _write(p: FakePulsar, rnd: random.Random, go: asyncio.Event, paused: asyncio.Event,
                 stop: asyncio.Event) -> None:
    """A broker writing ``A``: small batches, a new ledger every ~300 ms; pauses on demand."""
    n = 0
    while not stop.is_set():
        if not go.is_set():
            paused.set()
            await asyncio.wait([asyncio.ensure_future(go.wait()),
                                asyncio.ensure_future(stop.wait())],
                               return_when=asyncio.FIRST_COMPLETED)
            paused.clear()
            continue
        await p.append(A, [rnd.randbytes(rnd.randint(1, 600)) for _ in range(rnd.randint(1, 8))])
        n += 1
        if n % 6 == 0:
            await p.roll(A)
        await asyncio.sleep(0.05)


class _CatalogWatcher:
    """Polls the mirror: a ledger record may go only once Pulsar deleted the ledger; a
    committed segment only once every ledger it touches is deleted; a loss only for a deleted
    ledger. Whatever breaks that is a violation."""

    def __init__(self, store: ZooKeeperMetadataStore, pulsar: FakePulsar) -> None:
        self.store = store
        self.pulsar = pulsar
        self.ids: list[int] = []
        self.committed: dict[Any, tuple[int, ...]] = {}
        self.violations: list[str] = []

    def _deleted(self, lid: int) -> bool:
        life = self.pulsar.history.get(lid)
        return life is not None and life.deleted is not None

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                info, _ = await managed_ledger.load(self.store, A.managed_ledger)
            except Exception:  # not created yet
                await asyncio.sleep(0.05)
                continue
            ids = [li.ledgerId for li in info.ledgerInfo]
            for lid in set(self.ids) - set(ids):
                if not self._deleted(lid):
                    self.violations.append(f"ledger {lid} dropped from the mirror, Pulsar has "
                                           "it")
            segs = {s.uid: tuple(s.ledger_ids()) for s in catalog.segments(info) if s.complete}
            for uid, lids in self.committed.items():
                if uid not in segs and not all(map(self._deleted, lids)):
                    self.violations.append(f"committed segment {uid} over {lids} vanished")
            for lost in lost_ledgers(info):
                if not self._deleted(lost.ledger_id):
                    self.violations.append(f"ledger {lost.ledger_id} reported lost, Pulsar "
                                           "has it")
            self.ids, self.committed = ids, segs
            await asyncio.sleep(0.05)


class TestWhileNoDaemonRan:
    """What a daemon that was down can and cannot know (docs/sidecar.md)."""

    async def test_known_ledger_deleted_is_reported_unseen_one_is_not(
            self, cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
        p = cluster.pulsar
        await p.append(A, payloads(4, "a"))
        await p.roll(A)  # 1 closed, 2 open
        await p.append(A, payloads(3, "b"))
        first = cluster.source()
        try:
            assert await first.list_topics() == [A]
            await first.ledgers(A)
        finally:
            await first.close()  # the daemon stops
        # while it is down: 2 closes, 3 is created, written, closed and deleted, 1 deleted
        await p.roll(A)
        await p.append(A, payloads(5, "c"))
        await p.roll(A)
        await p.append(A, payloads(1, "d"))
        await p.delete_ledger(A, 3)
        await p.delete_ledger(A, 1)
        again = cluster.source()
        try:
            with caplog.at_level(logging.ERROR):
                assert await again.list_topics() == [A]
            assert await mirror_ids(cluster.ours, A) == [2, 4]
            info, _ = await managed_ledger.load(cluster.ours, A.managed_ledger)
            assert [(x.ledger_id, x.first, x.last) for x in lost_ledgers(info)] == [(1, 0, 3)]
            assert "ledger 3" not in caplog.text  # it never was in any list offloadd read
        finally:
            await again.close()


class TestLossOfALedgerNeverMirroredClosed:
    """Found by the long soak: a ledger the mirror held as open, then closed and deleted by
    Pulsar before the daemon looked again, was reported with the end the daemon had read while
    it was open — a lower bound — or, when nothing of it was readable yet, not at all."""

    @pytest.mark.parametrize("readable_first", [0, 3])
    async def test_reported_whole(self, cluster: Cluster, readable_first: int) -> None:
        p = cluster.pulsar
        await p.append(A, payloads(3, "x"))  # ledger 1: entries 0..2 carry LAC -1
        if readable_first:
            await p.append(A, payloads(2, "y"))  # confirms 0..2
        src = cluster.source()
        try:
            assert await src.list_topics() == [A]
            (d,) = await src.ledgers(A)
            assert d.last_entry_id == readable_first - 1
            # Pulsar writes on, closes it, rolls, and retention deletes it: all before the
            # daemon looks again
            await p.append(A, payloads(6, "z"))
            await p.roll(A)
            await p.append(A, payloads(1, "n"))
            await p.delete_ledger(A, 1)
            total = len(p.history[1].payloads)
            await until(lambda: listed_and_mirrored(src, cluster, [2]), "ledger 1 dropped")
            info, _ = await managed_ledger.load(cluster.ours, A.managed_ledger)
            (lost,) = lost_ledgers(info)
            assert lost.ledger_id == 1 and lost.first == 0
            assert lost.last in (total - 1, -1)  # its end, or "unknown": never less
            assert src.metrics.lost_ledgers[str(A)] == 1
        finally:
            await src.close()
