"""The BookKeeper source over a real ZooKeeper holding Pulsar-style metadata and fake bookies."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import struct
from collections.abc import Callable
from typing import Any

import crc32c
import pytest
from kazoo.client import KazooClient

from offloadd import config, wiring
from offloadd.errors import ConfigError, FormatError, NotFound, Retriable
from offloadd.ledger.base import LedgerSource
from offloadd.ledger.bookkeeper import BookKeeperLedgerSource, lost_ledgers
from offloadd.ledger.bookkeeper.codec import DigestType
from offloadd.ledger.bookkeeper.layout import decode_ledger_metadata
from offloadd.ledger.bookkeeper.zk import PulsarZooKeeper
from offloadd.metadata import managed_ledger
from offloadd.model import LedgerState, TopicName
from tests.bookkeeper.conftest import Cluster
from tests.fixtures.bookie_wire import encode_entry, encode_ledger_metadata

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

A = TopicName.parse("persistent://public/default/alpha")
B = TopicName.parse("persistent://public/default/beta")
C = TopicName.parse("persistent://other/ns/gamma")


def payloads(n: int, tag: str, size: int = 100) -> list[bytes]:
    return [f"{tag}-{i}-".encode() + bytes([i % 256]) * (size + i % 7) for i in range(n)]


def framed(first: int, items: list[bytes]) -> bytes:
    return b"".join(struct.pack(">iq", len(p), first + i) + p for i, p in enumerate(items))


async def eventually(pred: Callable[[], Any], what: str, timeout: float = 15.0) -> None:
    async with asyncio.timeout(timeout):
        while True:
            if await pred():
                return
            await asyncio.sleep(0.05)


class TestTopicsAndMirror:
    """Topics come from Pulsar's /managed-ledgers; each gets a mirror in offloadd's store."""

    async def test_lists_matching_topics_and_mirrors_their_ledgers(self,
                                                                   cluster: Cluster) -> None:
        p = cluster.pulsar
        for t in (A, B, C):
            await p.append(t, payloads(3, str(t)))
        await p.close_ledger(A)
        src = cluster.source(topics=("persistent://public/*",))
        try:
            assert isinstance(src, LedgerSource)
            assert await src.list_topics() == [A, B]
            info, _ = await managed_ledger.load(cluster.ours, A.managed_ledger)
            assert [(li.ledgerId, li.entries, li.size) for li in info.ledgerInfo] == \
                [(1, 3, sum(map(len, payloads(3, str(A)))))]
            info, _ = await managed_ledger.load(cluster.ours, B.managed_ledger)
            assert [li.ledgerId for li in info.ledgerInfo] == [2]
            assert not info.ledgerInfo[0].HasField("entries")  # still open
            assert not await cluster.ours.exists(f"/managed-ledgers/{C.managed_ledger}")
        finally:
            await src.close()

    async def test_topic_without_ledgers_gets_an_empty_mirror(self, cluster: Cluster) -> None:
        await cluster.pulsar.create_topic(A)
        src = cluster.source()
        try:
            assert await src.list_topics() == [A]
            assert await src.ledgers(A) == []
            info, _ = await managed_ledger.load(cluster.ours, A.managed_ledger)
            assert len(info.ledgerInfo) == 0
        finally:
            await src.close()

    async def test_unknown_topic_is_not_found(self, cluster: Cluster) -> None:
        src = cluster.source()
        try:
            with pytest.raises(NotFound):
                await src.ledgers(A)
        finally:
            await src.close()


class TestLedgersAndReads:
    async def test_closed_and_open_ledgers_with_exact_sizes(self, cluster: Cluster) -> None:
        p = cluster.pulsar
        first = payloads(20, "a")
        await p.append(A, first)
        await p.close_ledger(A)
        await p.append(A, payloads(5, "b"))
        await p.append(A, payloads(5, "c"))  # its entries piggyback LAC 4
        src = cluster.source()
        try:
            d1, d2 = await src.ledgers(A)
            assert (d1.state, d1.last_entry_id, d1.size) == (LedgerState.CLOSED, 19,
                                                             sum(map(len, first)))
            assert d2.state is LedgerState.OPEN and d2.last_entry_id == 4
            assert d2.size == sum(map(len, payloads(5, "b")))
            assert d1.ctime_ms > 0
        finally:
            await src.close()

    async def test_reads_are_framed_like_blocks_and_bounded(self, cluster: Cluster) -> None:
        p = cluster.pulsar
        items = payloads(50, "r", size=1000)
        await p.append(A, items)
        await p.close_ledger(A)
        src = cluster.source(readahead_bytes=4096, reads_in_flight=8)
        try:
            await src.ledgers(A)
            run = await src.read(A, 1, 0, 49)
            assert bytes(run.data) == framed(0, items)
            assert list(run.offsets) == [len(framed(0, items[:i])) for i in range(51)]
            part = await src.read(A, 1, 10, 49, max_bytes=3500)
            assert part.first_entry_id == 10 and part.count == 3  # 3 frames of ~1015 bytes
            rest = await src.read(A, 1, 13, 49, max_bytes=1)  # never less than one entry
            assert rest.count == 1 and bytes(rest.data) == framed(13, items[13:14])
            again = await src.read(A, 1, 5, 7)  # backwards: the stream restarts
            assert bytes(again.data) == framed(5, items[5:8])
            lease = bytearray(64 * 1024)  # a recycled buffer: the frames land in it
            run = await src.read(A, 1, 8, 20, into=lease)
            assert run.data.obj is lease and bytes(run.data) == framed(8, items[8:21])
            small = bytearray(100)  # too small: a buffer of its own
            run = await src.read(A, 1, 21, 22, into=small)
            assert run.data.obj is not small and bytes(run.data) == framed(21, items[21:23])
            with pytest.raises(NotFound):
                await src.read(A, 1, 40, 50)
            with pytest.raises(NotFound):
                await src.read(A, 99, 0, 0)
            assert await src.read_crcs(1, 0, 49) == [crc32c.crc32c(x) for x in items]
        finally:
            await src.close()

    async def test_wait_follows_the_live_tail_by_long_polls(self, cluster: Cluster) -> None:
        p = cluster.pulsar
        await p.append(A, payloads(3, "x"))
        await p.append(A, payloads(3, "y"))  # LAC 2 is known from these headers
        src = cluster.source()
        try:
            (d,) = await src.ledgers(A)
            assert d.last_entry_id == 2
            waiter = asyncio.ensure_future(src.wait_for_entries(A, 1, 2, 30.0))
            await asyncio.sleep(0.2)
            assert not waiter.done()
            await p.append(A, payloads(1, "z"))  # piggybacks LAC 5
            await asyncio.wait_for(waiter, 10)  # long before the 30 s timeout
            (d,) = await src.ledgers(A)
            assert d.last_entry_id == 5
            assert d.size == sum(map(len, payloads(3, "x") + payloads(3, "y")))
            assert src.metrics.long_polls >= 1
            # the LAC came through the long poll, not the 0.5 s fallback: no bookie refused a
            # long poll (a real 4.15 bookie answers EBADREQ to any but the Java client's shape)
            assert sum(b.served["bad_long_poll"] for b in cluster.bookies) == 0
            assert src.metrics.long_poll_failures == 0
            assert sum(b.served["long_poll"] for b in cluster.bookies) >= 1
            run = await src.read(A, 1, 3, 5)
            assert bytes(run.data) == framed(3, payloads(3, "y"))
            # a new ledger ends a wait on the closed one at its end
            await p.close_ledger(A)
            await eventually(lambda: _closed(src, A), "ledger 1 closed")
            waiter = asyncio.ensure_future(src.wait_for_entries(A, 1, 6, 30.0))
            await asyncio.sleep(0.1)
            await p.open_ledger(A)
            await asyncio.wait_for(waiter, 10)
            assert [d.ledger_id for d in await src.ledgers(A)] == [1, 2]
        finally:
            await src.close()

    async def test_an_idle_ledger_is_long_polled_for_the_whole_wait(self, cluster: Cluster
                                                                     ) -> None:
        """A long poll of an idle open ledger asks the bookie to hold it as long as the topic
        waits, not 10 s: each poll's end woke the topic for nothing (issue 22: 5,000 idle
        topics with an open ledger each made 500 wake-ups and long polls a second)."""
        p = cluster.pulsar
        await p.append(A, payloads(2, "x"))
        src = cluster.source()
        try:
            (d,) = await src.ledgers(A)
            waiter = asyncio.ensure_future(src.wait_for_entries(A, d.ledger_id,
                                                                d.last_entry_id, 120.0))
            async def polled() -> bool:
                return any(b.long_poll_timeouts_ms for b in cluster.bookies)

            await eventually(polled, "a long poll")
            (asked,) = [t for b in cluster.bookies for t in b.long_poll_timeouts_ms]
            assert asked > 100_000  # the wait's 120 s (less the time to send it)
            assert not waiter.done()
            await p.append(A, payloads(1, "y"))  # still answered at once
            await asyncio.wait_for(waiter, 10)
        finally:
            await src.close()

    async def test_hmac_ledgers_use_the_configured_password(self, cluster: Cluster) -> None:
        p = cluster.pulsar
        p.digest_type, p.password = DigestType.HMAC, b"s3cret"
        items = payloads(5, "h")
        await p.append(A, items)
        await p.close_ledger(A)
        # the password is not in the ledger metadata: offloadd must be told
        path = "/ledgers/00/0000/L0001"
        node = await p.zk.get(path)
        md = dataclasses.replace(decode_ledger_metadata(node.data, 1, path), password=None)
        await p.zk.set(path, encode_ledger_metadata(md))
        good = cluster.source(password=b"s3cret")
        bad = cluster.source(password=b"wrong")
        try:
            await good.ledgers(A)
            assert bytes((await good.read(A, 1, 0, 4)).data) == framed(0, items)
            await bad.ledgers(A)
            with pytest.raises(FormatError, match="digest"):
                await bad.read(A, 1, 0, 4)
        finally:
            await good.close()
            await bad.close()


class TestOnlyUpToTheLac:
    """Entries past the last-add-confirmed exist on bookies before they are readable, and an
    entry a crashed writer left on one bookie is never part of the ledger: none is handed out."""

    async def test_unconfirmed_and_torn_entries_are_never_read(self, cluster: Cluster) -> None:
        p = cluster.pulsar
        items = payloads(6, "l")
        await p.append(A, items[:3])
        await p.append(A, items[3:])  # their headers confirm 0..2; 3..5 are not confirmed yet
        led = p.open[A]
        # an add pipelined behind 3..5 (sent before their acks came: it says LAC 2), on one
        # bookie of its write set only; nobody acknowledged it
        torn = encode_entry(p.digest, 1, 6, 2, led.length + 4, b"torn")
        holder = next(b for b in cluster.bookies if b.address == led.meta.bookies_for(6)[0])
        holder.put(1, 6, torn)
        src = cluster.source()
        try:
            (d,) = await src.ledgers(A)
            assert d.last_entry_id == 2 and d.size == sum(map(len, items[:3]))
            with pytest.raises(NotFound):
                await src.read(A, 1, 0, 3)
            assert bytes((await src.read(A, 1, 0, 2)).data) == framed(0, items[:3])
            # the broker crashes with entry 6 on one bookie; recovery closes the ledger at 5
            await p.close_ledger(A)
            await eventually(lambda: _closed(src, A), "ledger 1 closed")
            (d,) = await src.ledgers(A)
            assert d.last_entry_id == 5
            assert bytes((await src.read(A, 1, 0, 5)).data) == framed(0, items)
            with pytest.raises(NotFound):
                await src.read(A, 1, 6, 6)
        finally:
            await src.close()


async def _closed(src: BookKeeperLedgerSource, topic: TopicName) -> bool:
    return (await src.ledgers(topic))[0].state is LedgerState.CLOSED


class TestFaults:
    async def test_ensemble_change_inside_an_open_ledger(self, cluster: Cluster) -> None:
        p = cluster.pulsar
        spare = await type(cluster.bookies[0])().start()
        cluster.bookies.append(spare)
        first = payloads(10, "e1")
        await p.append(A, first)
        src = cluster.source()
        try:
            await src.ledgers(A)  # metadata cached with the first ensemble
            old = cluster.bookies[0].address
            await p.change_ensemble(A, {old: spare.address})
            second = payloads(10, "e2")
            await p.append(A, second)
            await p.close_ledger(A)
            await eventually(lambda: _closed(src, A), "ledger closed")
            run = await src.read(A, 1, 0, 19)
            assert bytes(run.data) == framed(0, first + second)
            assert spare.served["read"] > 0
            assert cluster.bookies[0].entries[1].keys() <= set(range(10))
        finally:
            await src.close()

    async def test_corrupt_replica_is_read_from_the_other_and_counted(
            self, cluster: Cluster) -> None:
        p = cluster.pulsar
        items = payloads(9, "k")
        await p.append(A, items)
        await p.close_ledger(A)
        for b in cluster.bookies:  # damage entry 4 on one of its two replicas
            if 4 in b.entries.get(1, {}):
                b.corrupt(1, 4)
                bad = b.address
                break
        src = cluster.source()
        try:
            for x in cluster.bookies:  # the others in quarantine: the corrupt one is asked first
                if x.address != bad:
                    src.client.replicas.health[x.address].down_until = 1e18
            await src.ledgers(A)
            assert bytes((await src.read(A, 1, 0, 8)).data) == framed(0, items)
            assert src.metrics.digest_errors[bad] == 1
            assert src.metrics.failovers[bad] >= 1
        finally:
            await src.close()

    async def test_killed_bookie_fails_over(self, cluster: Cluster) -> None:
        p = cluster.pulsar
        items = payloads(30, "d")
        await p.append(A, items)
        await p.close_ledger(A)
        src = cluster.source()
        try:
            await src.ledgers(A)
            await cluster.bookies[1].kill()
            assert bytes((await src.read(A, 1, 0, 29)).data) == framed(0, items)
        finally:
            await src.close()

    async def test_ledger_deleted_before_offload_is_reported_as_lost(
            self, cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
        p = cluster.pulsar
        await p.append(A, payloads(7, "old"))
        await p.roll(A)
        await p.append(A, payloads(2, "new"))
        src = cluster.source()
        try:
            await src.list_topics()  # the mirror now lists ledgers 1 and 2
            await p.delete_ledger(A, 1)
            with caplog.at_level(logging.ERROR):
                await eventually(lambda: _ids_are(src, A, [2]), "ledger 1 gone")
            assert "data lost to retention" in caplog.text
            assert "ledger 1 entries 0..6" in caplog.text
            assert src.metrics.lost_entries[str(A)] == 7
            assert src.metrics.lost_ledgers[str(A)] == 1
            info, _ = await managed_ledger.load(cluster.ours, A.managed_ledger)
            assert [li.ledgerId for li in info.ledgerInfo] == [2]
            (lost,) = lost_ledgers(info)
            assert (lost.ledger_id, lost.first, lost.last) == (1, 0, 6)
            with pytest.raises(NotFound):
                await src.read(A, 1, 0, 0)
        finally:
            await src.close()

    async def test_zookeeper_session_loss_is_survived(self, cluster: Cluster) -> None:
        p = cluster.pulsar
        await p.append(A, payloads(3, "s"))
        src = cluster.source()
        try:
            assert [d.ledger_id for d in await src.ledgers(A)] == [1]
            sid = src.zk.session_id
            await expire_session(cluster.hosts, src)
            await p.roll(A)  # while the session is being lost and renewed
            await p.append(A, payloads(4, "t"))
            await p.append(A, payloads(1, "u"))
            await eventually(lambda: _ids_are(src, A, [1, 2]), "the new ledger")
            assert src.zk.session_id not in (None, sid)
            descs = await src.ledgers(A)
            assert descs[0].state is LedgerState.CLOSED and descs[1].last_entry_id == 3
        finally:
            await src.close()


    async def test_an_open_ledger_whose_watch_failed_to_arm_still_learns_its_close(
            self, cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
        """The session expires between the read of an open ledger's metadata and the arming
        of its watch: the next look must load it again, watch and all, or its close is never
        learnt and its last entry (which only the close confirms) is never offloaded."""
        p = cluster.pulsar
        await p.append(A, payloads(3, "w"))
        arm = PulsarZooKeeper.watch_data
        failed: list[str] = []

        async def flaky(self: PulsarZooKeeper, path: str, callback: Any) -> Any:
            if "/L" in path and not failed:  # the first ledger-metadata watch
                failed.append(path)
                raise Retriable(f"ZooKeeper get {path}: SessionExpiredError (injected)")
            return await arm(self, path, callback)

        monkeypatch.setattr(PulsarZooKeeper, "watch_data", flaky)
        src = cluster.source()
        try:
            with pytest.raises(Retriable, match="injected"):
                await src.ledgers(A)
            descs = await src.ledgers(A)
            assert failed and descs[0].state is LedgerState.OPEN
            await p.append(A, payloads(2, "x"))
            await p.close_ledger(A)
            await eventually(lambda: _closed(src, A), "the ledger's close", timeout=10)
            assert (await src.ledgers(A))[0].last_entry_id == 4
        finally:
            await src.close()


async def _ids_are(src: BookKeeperLedgerSource, topic: TopicName, ids: list[int]) -> bool:
    try:
        return [d.ledger_id for d in await src.ledgers(topic)] == ids
    except Exception:  # Retriable while the session is being re-established
        return False


async def expire_session(hosts: str, src: BookKeeperLedgerSource) -> None:
    """End the source's Pulsar ZooKeeper session from another client (a real expiry)."""
    await eventually(lambda: _connected(src), "the source's session")
    session = src.zk._store._zk.client_id  # the session id and password kazoo holds

    def close_it() -> None:
        other = KazooClient(hosts=hosts, client_id=session)
        try:
            other.start(timeout=20)
        finally:
            other.stop()
            other.close()

    await asyncio.to_thread(close_it)


async def _connected(src: BookKeeperLedgerSource) -> bool:
    return src.zk.session_id is not None


class TestReadOnly:
    """Nothing under Pulsar's tree changes when offloadd works on it."""

    async def test_pulsar_nodes_keep_their_versions(self, cluster: Cluster) -> None:
        p = cluster.pulsar
        for t in (A, B):
            await p.append(t, payloads(10, str(t)))
            await p.roll(t)
            await p.append(t, payloads(4, str(t)))
            await p.append(t, payloads(1, str(t)))
        before = await asyncio.to_thread(snapshot, cluster.hosts, cluster.pulsar_url)
        src = cluster.source()
        try:
            for t in await src.list_topics():
                for d in await src.ledgers(t):
                    if d.last_entry_id >= 0:
                        await src.read(t, d.ledger_id, 0, d.last_entry_id)
                        await src.read_crcs(d.ledger_id, 0, d.last_entry_id)
                await src.wait_for_entries(t, 2, 3, 0.3)
        finally:
            await src.close()
        after = await asyncio.to_thread(snapshot, cluster.hosts, cluster.pulsar_url)
        assert before == after
        assert any(path.endswith("/L0003") for path in before)


class TestBatchProbe:
    """Asking a bookie whether it has batched reads costs one older than 4.17 an ERROR with a
    stack trace in its log: the daemon asks each bookie once, a read-only command never."""

    async def test_only_the_daemon_probes_and_once_per_bookie(self, cluster: Cluster) -> None:
        p = cluster.pulsar
        p.ensemble_size = p.write_quorum = 3  # not striped: runs that batching serves
        for b in cluster.bookies:
            b.batch_reads = "silent"  # BookKeeper 4.15
        await p.append(A, payloads(40, "a"))
        await p.roll(A)
        ro = cluster.source()
        ro = BookKeeperLedgerSource(ro.options, cluster.ours, read_only=True)
        try:
            (d, _) = await ro.ledgers(A)
            run = await ro.read(A, d.ledger_id, 0, d.last_entry_id)
            assert run.count == 40
            await asyncio.sleep(0.5)  # time enough for a probe to reach the bookies
        finally:
            await ro.close()
        assert sum(b.served["batch_asked"] for b in cluster.bookies) == 0
        src = cluster.source()
        try:
            for _ in range(3):
                (d, _) = await src.ledgers(A)
                await src.read(A, d.ledger_id, 0, d.last_entry_id)
                await asyncio.sleep(1.2)  # past the probe's read timeout: it has its answer
                for b in cluster.bookies:  # reconnects: the answer stays
                    for conn in b.connections:
                        conn.drop()
        finally:
            await src.close()
        asked = [b.served["batch_asked"] for b in cluster.bookies]
        assert sum(asked) >= 1 and max(asked) == 1
        assert [b.served["error_log"] for b in cluster.bookies] == asked


def snapshot(hosts: str, url: str) -> dict[str, tuple[int, ...]]:
    """Every node under the URL's chroot with its stat (versions and zxids; the last field is
    the ephemeral owner's session, 0 for a persistent node)."""
    chroot = url.split("/", 3)[3]
    zk = KazooClient(hosts=hosts)
    zk.start(timeout=10)
    out: dict[str, tuple[int, ...]] = {}
    try:
        def walk(path: str) -> None:
            data, st = zk.get(path)
            out[path] = (st.version, st.cversion, st.aversion, st.mzxid, st.pzxid, len(data),
                         st.ephemeralOwner)
            for kid in zk.get_children(path):
                walk(f"{path.rstrip('/')}/{kid}")

        walk(f"/{chroot}")
    finally:
        zk.stop()
        zk.close()
    return out


class TestConfig:
    """``[source] kind = "bookkeeper"`` through the config file and the wiring."""

    def settings(self, tmp_path: Any, text: str) -> config.Settings:
        f = tmp_path / "offloadd.toml"
        f.write_text(text)
        return config.load(f)

    def test_wiring_builds_the_source(self, tmp_path: Any) -> None:
        s = self.settings(tmp_path, """
[metadata]
url = "zk://127.0.0.1:2181/offloadd"
[source]
kind = "bookkeeper"
pulsar_zk = "zk://127.0.0.1:2181"
digest_password = "pw"
zone = "east"
zones = { "10.0.0.1:3181" = "east" }
reads_in_flight = 32
""")
        src = wiring.open_source(s, None)  # type: ignore[arg-type]
        assert isinstance(src, BookKeeperLedgerSource)
        assert src.password == b"pw" and src.options.reads_in_flight == 32
        assert src.options.client.replicas.local_zone == "east"
        assert "pw" not in repr(src.options)

    def test_pulsar_tree_as_our_store_is_refused(self, tmp_path: Any) -> None:
        s = self.settings(tmp_path, """
[metadata]
url = "zk://127.0.0.1:2181/pulsar"
[source]
kind = "bookkeeper"
pulsar_zk = "zk://127.0.0.1:2181/pulsar"
""")
        with pytest.raises(ConfigError, match="own chroot"):
            wiring.open_source(s, None)  # type: ignore[arg-type]

    def test_pulsar_zk_is_required(self, tmp_path: Any) -> None:
        s = self.settings(tmp_path, '[source]\nkind = "bookkeeper"\n')
        with pytest.raises(ConfigError, match="pulsar_zk"):
            wiring.open_source(s, None)  # type: ignore[arg-type]
