"""Lag is measured from the last committed position to the source's LAC (issue 14 item 1).

The pure arithmetic first, with the layouts drawn; then the monitor against the embedded store
with a real topic task whose uploads fail, hang and recover.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from pathlib import Path

import pytest

from offloadd import wiring
from offloadd.blobstore.base import StoreView
from offloadd.blobstore.memory import MemoryBlobStore
from offloadd.commit.fence import NoFence
from offloadd.errors import Retriable
from offloadd.ledger.local import LocalLedgerStore, RolloverPolicy
from offloadd.metadata.memory import MemoryMetadataStore
from offloadd.model import LedgerDesc, LedgerState, Position, TopicName
from offloadd.offload.buffer import OffloadBuffer
from offloadd.offload.lag import LacHistory, Lag, LagMonitor, measure, tail_of
from offloadd.offload.roller import RollPolicy
from offloadd.offload.topic import OffloadEnv, TopicOffloader, TopicPolicy
from offloadd.retry import Backoff

pytestmark = pytest.mark.timeout(60)

OPEN, CLOSED = LedgerState.OPEN, LedgerState.CLOSED
NOW = 1_000_000_000  # ms


def led(lid: int, state: LedgerState, entries: int, size: int, ctime: int) -> LedgerDesc:
    return LedgerDesc(lid, state, entries - 1, size, ctime)


class TestMeasure:
    """The arithmetic of lag, case by case."""

    def test_nothing_committed_counts_every_readable_entry(self) -> None:
        # ledger 3: 0..9 (closed, 1000 B)   ledger 4: 0..4 (open, 500 B)   committed: none
        ledgers = [led(3, CLOSED, 10, 1000, NOW - 60_000), led(4, OPEN, 5, 500, NOW - 5_000)]
        lag = measure(ledgers, None, NOW)
        assert lag == Lag(15, 1500, 60.0, Position(3, 0), True)

    def test_a_commit_mid_ledger_counts_the_rest_of_it_and_what_follows(self) -> None:
        # ledger 3: 0..9, committed up to 3:6 (700 B of it)  ->  3:7..3:9 and all of ledger 4
        ledgers = [led(3, CLOSED, 10, 1000, NOW - 60_000), led(4, OPEN, 5, 500, NOW - 5_000)]
        lag = measure(ledgers, Position(3, 6), NOW, committed_bytes=700)
        assert (lag.entries, lag.bytes, lag.oldest, lag.bytes_exact) == (8, 800, Position(3, 7),
                                                                         True)
        assert lag.seconds == 60.0  # written after its ledger was created: at most 60 s ago

    def test_bytes_are_prorated_and_flagged_when_the_source_cannot_say(self) -> None:
        ledgers = [led(3, CLOSED, 10, 1000, NOW - 60_000)]
        lag = measure(ledgers, Position(3, 6), NOW)
        assert (lag.entries, lag.bytes, lag.bytes_exact) == (3, 300, False)

    @pytest.mark.parametrize("committed", [Position(3, 9), Position(4, 4)])
    def test_an_idle_fully_committed_topic_has_no_lag(self, committed: Position) -> None:
        # ledger 3: 0..9 closed, committed to its end; ledger 4: open and empty (or committed)
        ledgers = [led(3, CLOSED, 10, 1000, NOW - 3_600_000)]
        if committed.ledger_id == 4:
            ledgers.append(led(4, OPEN, 5, 500, NOW - 600_000))
        else:
            ledgers.append(led(4, OPEN, 0, 0, NOW - 600_000))
        assert measure(ledgers, committed, NOW, committed_bytes=500) == Lag(0, 0, 0.0)

    def test_a_segment_of_one_entry_at_the_boundary_is_not_lag(self) -> None:
        # Kafka's KAFKA-20977: a one-record segment whose base offset equals the last remote
        # offset counted as "only local". Here: ledger 5 has one entry, committed; ledger 6
        # was rolled and is empty.
        ledgers = [led(5, CLOSED, 1, 10, NOW - 10_000), led(6, OPEN, 0, 0, NOW - 1_000)]
        assert measure(ledgers, Position(5, 0), NOW, committed_bytes=10) == Lag(0, 0, 0.0)
        # one more entry: exactly one entry of lag
        ledgers[1] = led(6, OPEN, 1, 7, NOW - 1_000)
        lag = measure(ledgers, Position(5, 0), NOW, committed_bytes=10)
        assert (lag.entries, lag.bytes, lag.oldest) == (1, 7, Position(6, 0))

    def test_a_committed_ledger_retention_removed_does_not_count(self) -> None:
        # committed up to 2:99; ledger 2 is gone from the source; ledger 3 is all lag
        ledgers = [led(3, OPEN, 4, 40, NOW - 2_000)]
        lag = measure(ledgers, Position(2, 99), NOW)
        assert (lag.entries, lag.bytes, lag.oldest, lag.seconds) == (4, 40, Position(3, 0), 2.0)

    def test_seconds_take_the_latest_known_moment_the_entry_did_not_exist(self) -> None:
        ledgers = [led(3, OPEN, 10, 1000, NOW - 600_000)]
        lag = measure(ledgers, Position(3, 6), NOW, written_after_ms=NOW - 4_000)
        assert lag.seconds == 4.0
        # a creation time later than the observation wins (both are lower bounds)
        ledgers = [led(3, OPEN, 10, 1000, NOW - 1_000)]
        assert measure(ledgers, Position(3, 6), NOW, written_after_ms=NOW - 4_000).seconds == 1

    def test_without_any_time_the_first_sighting_bounds_it(self) -> None:
        ledgers = [led(3, OPEN, 10, 1000, 0)]  # a source that knows no creation time
        assert measure(ledgers, None, NOW, seen_by_ms=NOW - 3_000).seconds == 3.0


class TestHistory:
    """The LAC history bounds when an entry was written, from the safe side."""

    def test_written_after_is_the_last_sighting_short_of_the_entry(self) -> None:
        h = LacHistory()
        h.observe(1000, None)
        h.observe(2000, Position(3, 4))
        h.observe(3000, Position(3, 4))  # unchanged: same sample, later "last seen"
        h.observe(4000, Position(3, 9))
        assert len(h.samples) == 3
        assert h.written_after(Position(3, 0)) == 1000
        assert h.written_after(Position(3, 5)) == 3000
        assert h.seen_by(Position(3, 5)) == 4000
        assert h.written_after(Position(4, 0)) == 4000 and h.seen_by(Position(4, 0)) is None

    def test_forgetting_keeps_the_sample_that_still_bounds(self) -> None:
        h = LacHistory()
        for i in range(10):
            h.observe(1000 * i, Position(3, i))
        h.forget_before(Position(3, 6))
        assert h.written_after(Position(3, 6)) == 5000
        assert h.samples[0][2] == Position(3, 5)

    def test_thinning_bounds_memory_and_never_moves_a_bound_later(self) -> None:
        h = LacHistory()
        for i in range(10_000):
            h.observe(i, Position(1, i))
            assert len(h.samples) <= 2049
        for probe in (Position(1, 17), Position(1, 5000), Position(1, 9999)):
            true_last_short = probe.entry_id - 1
            after = h.written_after(probe)
            assert after is not None and after <= true_last_short  # never later: safe side

    def test_tail_of_skips_empty_ledgers(self) -> None:
        assert tail_of([led(3, CLOSED, 10, 1, 1), led(4, OPEN, 0, 0, 1)]) == Position(3, 9)
        assert tail_of([led(4, OPEN, 0, 0, 1)]) is None


TOPIC = TopicName.parse("persistent://public/default/lagging")
KiB = 1024


class TestMonitorWithATopicTask:
    """Against the embedded store and a real topic task: lag grows while uploads fail or hang,
    independently of the task, and drops to exactly 0 / 0 / 0 once everything is committed."""

    async def test_lag_grows_during_failures_and_is_zero_when_idle(self, tmp_path: Path) -> None:
        failing = True
        hang = asyncio.Event()

        async def hold() -> None:
            await hang.wait()

        def fault(op: str, key: str) -> Awaitable[object] | None:
            if failing and op == "put_part":
                return hold()  # a part that never lands, like a frozen store
            if failing and op == "complete":
                raise Retriable(f"injected {op} failure")
            return None

        md = MemoryMetadataStore()
        store = LocalLedgerStore(tmp_path / "ledgers", md, RolloverPolicy(max_entries=50))
        env = OffloadEnv(source=store.source, metadata=md, blobstore=MemoryBlobStore(fault),
                         buffer=OffloadBuffer(8 << 20), retry=Backoff(0.01, 0.05),
                         idle_poll_s=0.05, part_size=KiB)  # multipart even for small segments
        off = TopicOffloader(TOPIC, env, lambda: TopicPolicy(
            RollPolicy(16 * KiB, 0.2, 4 * KiB)), NoFence())
        now = [int(time.time() * 1000)]  # the writer stamps ledgers with the real clock
        monitor = LagMonitor(store.source, wall_ms=lambda: now[0])

        async def write(n: int) -> None:
            for _ in range(n):
                await store.writer.append(TOPIC, [b"x" * 100])

        async def sample() -> Lag:
            return await monitor.sample(TOPIC, await store.source.ledgers(TOPIC),
                                        off.last_committed)

        await write(120)  # 50 + 50 + 20 entries over three ledgers
        # the monitor's clock starts after the writes: a clock behind the ledgers' creation
        # stamps would clamp the first sample's seconds to 0
        now[0] = int(time.time() * 1000)
        task = asyncio.create_task(off.run())
        try:
            async with asyncio.timeout(20):
                while not off.recovered or off.position in (None, Position(0, 0)):
                    await asyncio.sleep(0.02)
            first = await sample()
            assert (first.entries, first.bytes, first.bytes_exact) == (120, 12_000, True)
            now[0] += 5_000
            await write(30)
            second = await sample()
            # the task read entries into its segment, but nothing is committed: all of it lags
            assert off.last_committed is None and off.position is not None
            assert (second.entries, second.bytes) == (150, 15_000)
            assert second.seconds >= first.seconds + 5

            failing = False
            hang.set()
            async with asyncio.timeout(30):
                while off.last_committed is None or (await sample()).entries:
                    off.trigger()
                    await asyncio.sleep(0.05)
            now[0] += 3_600_000  # an hour of silence
            assert await sample() == Lag(0, 0, 0.0)
            await write(1)
            late = await sample()
            assert (late.entries, late.bytes) == (1, 100)
            # written after the last sample that did not see it, not an hour ago
            assert late.seconds == 0.0
        finally:
            off.request_stop()
            hang.set()
            await asyncio.wait_for(task, 10)
            await store.close()


class TestDaemonLagLoop:
    """The daemon's own loop reports lag for a topic whose recovery is stuck on the store."""

    async def test_lag_is_reported_while_recovery_redoes_a_segment_on_a_hung_store(
            self, tmp_path: Path) -> None:
        from offloadd.config import Settings
        from offloadd.metrics import Metrics
        from offloadd.shell.daemon import Daemon

        hang = asyncio.Event()

        async def hold() -> None:
            await hang.wait()

        hung_ops = {"complete"}  # first the completion hangs, later the parts too

        def fault(op: str, key: str) -> Awaitable[object] | None:
            return hold() if op in hung_ops else None

        md = MemoryMetadataStore()
        store = LocalLedgerStore(tmp_path / "ledgers", md, RolloverPolicy(max_entries=50))
        blob = MemoryBlobStore(fault)
        for _ in range(80):
            await store.writer.append(TOPIC, [b"y" * 200])
        # a first owner assigns a segment and dies while completing it: an ASSIGNED record
        env = OffloadEnv(source=store.source, metadata=md, blobstore=blob,
                         buffer=OffloadBuffer(8 << 20), retry=Backoff(0.01, 0.05),
                         idle_poll_s=0.05, part_size=KiB)  # multipart even for small segments
        first = TopicOffloader(TOPIC, env, lambda: TopicPolicy(RollPolicy(4 * KiB, 600, KiB)),
                               NoFence())
        task = asyncio.create_task(first.run())
        async with asyncio.timeout(20):
            while first.segment_state is None or first.segment_state.value != "assigned":
                await asyncio.sleep(0.02)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        hung_ops.add("put_part")

        settings = Settings(metrics={"enabled": False}, blobstore={"part_size_bytes": KiB},
                            daemon={"lag_interval_s": 0.1, "status_interval_s": 0.2})
        metrics = Metrics()
        daemon = Daemon(settings, source=wiring.local_view(store.source), metadata=md,
                        tier=StoreView(blob),
                        probe_factory=lambda t: metrics.topic(t.ns, str(t)), metrics=metrics)
        running = asyncio.create_task(daemon.run(install_signals=False))
        try:
            async with asyncio.timeout(20):
                while TOPIC not in daemon.topics or daemon.topics[TOPIC].offloader.lag is None:
                    await asyncio.sleep(0.05)
            off = daemon.topics[TOPIC].offloader
            assert not off.recovered  # still redoing the assigned segment on the hung store
            lag = off.lag
            assert lag is not None and (lag.entries, lag.bytes) == (80, 16_000)
            scraped = {s.name: s.value for fam in metrics.registry.collect()
                       for s in fam.samples if s.labels.get("topic") == str(TOPIC)}
            assert scraped["offloadd_lag_entries"] == 80
            assert scraped["offloadd_lag_bytes"] == 16_000
        finally:
            hang.set()
            daemon.request_stop()
            await asyncio.wait_for(running, 30)
            await store.close()


class TestQuietTopics:
    """Issue 22, "idle is free": the lag loop measures a topic again only when something
    happened to it (its source recorded a change, or it committed); a quiet topic's lag stays
    what it was, its seconds moving with the clock in ``status`` and in the scrape."""

    async def test_idle_topics_with_open_segments_are_not_read_again(
            self, tmp_path: Path) -> None:
        from offloadd.config import Settings
        from offloadd.ledger.local import LocalLedgerSource, LocalLedgerWriter
        from offloadd.metrics import Metrics
        from offloadd.shell.daemon import Daemon

        md = MemoryMetadataStore()
        # a writer of its own, as another process's: the source follows its change journal
        writer = LocalLedgerWriter(tmp_path / "ledgers", md)
        source = LocalLedgerSource(tmp_path / "ledgers", md, watch_interval=0.01)
        topics = [TopicName("public", "default", f"quiet-{i}") for i in range(12)]
        for t in topics:
            await writer.append(t, [b"z" * 100])
        reads: dict[TopicName, int] = {}
        ledgers = source.ledgers

        async def counted(topic: TopicName) -> list[LedgerDesc]:
            reads[topic] = reads.get(topic, 0) + 1
            return await ledgers(topic)

        source.ledgers = counted  # type: ignore[method-assign]
        # segments stay open (10-minute roll): every topic has lag, none commits
        settings = Settings(metrics={"enabled": False},
                            daemon={"lag_interval_s": 0.02, "status_interval_s": 0.2})
        metrics = Metrics()
        daemon = Daemon(settings, source=wiring.local_view(source), metadata=md,
                        tier=StoreView(MemoryBlobStore()),
                        probe_factory=lambda t: metrics.topic(t.ns, str(t)), metrics=metrics)
        running = asyncio.create_task(daemon.run(install_signals=False))

        def lags() -> dict[TopicName, Lag | None]:
            return {t: (r.offloader.lag if (r := daemon.topics.get(t)) else None)
                    for t in topics}

        try:
            async with asyncio.timeout(20):
                while any(lag is None or lag.entries != 1 for lag in lags().values()):
                    await asyncio.sleep(0.02)
            # settled (the journal's first look wakes everything once): then a window of
            # fifteen passes of the lag loop reads no topic's ledgers, nothing happening to any
            # (before: every topic, every pass)
            quiet_windows = 0
            async with asyncio.timeout(20):
                while not quiet_windows:
                    reads.clear()
                    before = daemon.topics[topics[0]].offloader.status()["lag"]
                    await asyncio.sleep(0.3)
                    quiet_windows += not reads
            # the quiet topic's lag still ages: in status and in the scrape
            after = daemon.topics[topics[0]].offloader.status()["lag"]
            assert isinstance(before, dict) and isinstance(after, dict)
            assert after["entries"] == 1 and after["seconds"] >= before["seconds"] + 0.25
            scraped = {s.labels["topic"]: s.value for fam in metrics.registry.collect()
                       for s in fam.samples if s.name == "offloadd_lag_seconds"}
            measured = daemon.topics[topics[0]].offloader.lag
            assert measured is not None
            assert scraped[str(topics[0])] >= measured.seconds + 0.25

            # one topic is written: that one is measured again, and only that one
            await writer.append(topics[3], [b"z" * 100])
            async with asyncio.timeout(20):
                while (lag := lags()[topics[3]]) is None or lag.entries != 2:
                    await asyncio.sleep(0.02)
            assert set(reads) == {topics[3]}
            assert all(lag is not None and lag.entries == 1
                       for t, lag in lags().items() if t != topics[3])
        finally:
            daemon.request_stop()
            await asyncio.wait_for(running, 30)
            await writer.close()
            await source.close()

    async def test_a_commit_is_measured_without_reading_the_source_again(
            self, tmp_path: Path) -> None:
        """A quiet topic that commits is measured again (its committed position moved) from
        the ledger list the lag loop last read: the source recorded no change of it, so that
        list is still the source's (issue 22: a source read per commit, on top of the
        commit's own)."""
        from offloadd.config import Settings
        from offloadd.ledger.local import LocalLedgerSource, LocalLedgerWriter
        from offloadd.shell.daemon import Daemon

        md = MemoryMetadataStore()
        writer = LocalLedgerWriter(tmp_path / "ledgers", md)
        source = LocalLedgerSource(tmp_path / "ledgers", md, watch_interval=0.01)
        topics = [TopicName("public", "default", f"commits-{i}") for i in range(4)]
        for t in topics:
            await writer.append(t, [b"z" * 100])
        reads: dict[TopicName, int] = {}  # by the lag loop (not by the topics' own tasks)
        ledgers = source.ledgers

        async def counted(topic: TopicName) -> list[LedgerDesc]:
            task = asyncio.current_task()
            if task is None or not task.get_name().startswith("offload "):
                reads[topic] = reads.get(topic, 0) + 1
            return await ledgers(topic)

        source.ledgers = counted  # type: ignore[method-assign]
        settings = Settings(metrics={"enabled": False},
                            daemon={"lag_interval_s": 0.02, "status_interval_s": 0.2})
        daemon = Daemon(settings, source=wiring.local_view(source), metadata=md,
                        tier=StoreView(MemoryBlobStore()))
        running = asyncio.create_task(daemon.run(install_signals=False))

        def lag_of(t: TopicName) -> Lag | None:
            return r.offloader.lag if (r := daemon.topics.get(t)) else None

        try:
            async with asyncio.timeout(20):
                while any((lag := lag_of(t)) is None or lag.entries != 1 for t in topics):
                    await asyncio.sleep(0.02)
                while True:  # settled: a window in which the lag loop reads nothing
                    reads.clear()
                    await asyncio.sleep(0.3)
                    if not reads:
                        break
            daemon.trigger([topics[1]])
            async with asyncio.timeout(20):
                while (lag := lag_of(topics[1])) is None or lag.entries != 0:
                    await asyncio.sleep(0.02)
            assert daemon.topics[topics[1]].offloader.last_committed is not None
            assert reads == {}  # before: the lag loop read the committed topic's ledgers
            others = [lag_of(t) for t in topics if t != topics[1]]
            assert all(lag is not None and lag.entries == 1 for lag in others)
        finally:
            daemon.request_stop()
            await asyncio.wait_for(running, 30)
            await writer.close()
            await source.close()
