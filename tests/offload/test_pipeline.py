"""The offload pipeline end to end in one process: the embedded ledger store on disk, the
in-memory metadata and blob stores (with fault hooks), the real topic task."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from offloadd import wiring
from offloadd.blobstore.memory import MemoryBlobStore
from offloadd.commit.fence import NoFence
from offloadd.errors import Fenced, Retriable
from offloadd.ledger.local import LocalLedgerStore, RolloverPolicy
from offloadd.metadata import managed_ledger
from offloadd.metadata.base import CheckOp, Op
from offloadd.metadata.memory import MemoryMetadataStore
from offloadd.model import TopicName, catalog
from offloadd.model.keys import streaming_data_key
from offloadd.offload.buffer import OffloadBuffer
from offloadd.offload.context import OffloadMode
from offloadd.offload.roller import RollPolicy
from offloadd.offload.topic import OffloadEnv, TopicOffloader, TopicPolicy
from offloadd.read.check import read_back
from offloadd.read.reader import NullReadProbe, TierReader
from offloadd.read.verify import verify
from offloadd.retry import Backoff

pytestmark = pytest.mark.timeout(60)

TOPIC = TopicName.parse("persistent://public/default/pipe")
KiB = 1024


class Rig:
    def __init__(self, tmp: Path, rollover: RolloverPolicy, roll: RollPolicy,
                 blob: MemoryBlobStore | None = None, buffer_cap: int = 8 << 20) -> None:
        self.metadata = MemoryMetadataStore()
        self.store = LocalLedgerStore(tmp / "ledgers", self.metadata, rollover)
        self.blob = blob or MemoryBlobStore()
        self.buffer = OffloadBuffer(buffer_cap)
        self.env = OffloadEnv(source=self.store.source, metadata=self.metadata,
                              blobstore=self.blob, buffer=self.buffer,
                              retry=Backoff(0.01, 0.05), idle_poll_s=0.05)
        self.roll = roll
        self.mode = OffloadMode.STREAMING
        self.payloads: list[bytes] = []

    def offloader(self, fence: object | None = None) -> TopicOffloader:
        return TopicOffloader(TOPIC, self.env, lambda: TopicPolicy(self.roll, self.mode),
                              fence or NoFence())  # type: ignore[arg-type]

    async def write(self, n: int, size: int = KiB) -> None:
        for i in range(n):
            p = (f"{len(self.payloads):08d}".encode() * (size // 8 + 1))[:size]
            self.payloads.append(p)
            await self.store.writer.append(TOPIC, [p])
            if i % 16 == 15:
                await asyncio.sleep(0)

    async def segments(self) -> list[catalog.Segment]:
        info, _ = await managed_ledger.load(self.metadata, TOPIC.managed_ledger)
        return catalog.segments(info)

    async def read_back(self) -> list[bytes]:
        reader = TierReader(self.metadata, self.blob)
        return [bytes(e.payload) async for e in reader.read(TOPIC)]

    async def verify_ok(self) -> None:
        rep = await verify(self.metadata, self.blob, wiring.local_view(self.store.source), [TOPIC],
                           grace_s=0)
        assert rep.ok, rep.to_json()


async def until(pred: Callable[[], Awaitable[bool]], timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while not await pred():
            await asyncio.sleep(0.02)


async def committed_entries(rig: Rig) -> int:
    return sum(s.entries for s in await rig.segments() if s.complete)


async def stop(task: asyncio.Task[None], off: TopicOffloader) -> None:
    off.request_stop()
    await asyncio.wait_for(task, 10)


class TestRolling:
    """Segments roll by size, time or trigger, independently of ledger rollover."""

    async def test_a_segment_spans_several_ledgers(self, tmp_path: Path) -> None:
        # ledgers of 10 entries, segments of up to 1 MiB: one segment covers all ledgers
        rig = Rig(tmp_path, RolloverPolicy(max_entries=10), RollPolicy(1 << 20, 600, 4 * KiB))
        await rig.write(35)
        off = rig.offloader()
        task = asyncio.create_task(off.run())
        await until(lambda: _has_position(off))
        off.trigger()
        await until(lambda: _committed_at_least(rig, 35))
        await stop(task, off)
        segs = await rig.segments()
        assert len(segs) == 1 and len(segs[0].ranges) >= 3
        ids = [r.ledger_id for r in segs[0].ranges]
        assert ids == sorted(set(ids))
        assert await rig.read_back() == rig.payloads
        await rig.verify_ok()

    async def test_a_ledger_spans_several_segments(self, tmp_path: Path) -> None:
        # one big ledger, segments of 4 KiB of frames: many segments inside ledger 0
        rig = Rig(tmp_path, RolloverPolicy(max_entries=10_000), RollPolicy(4 * KiB, 600, 2 * KiB))
        await rig.write(20)
        off = rig.offloader()
        task = asyncio.create_task(off.run())
        await until(lambda: _committed_at_least(rig, 18))
        off.trigger()
        await until(lambda: _committed_at_least(rig, 20))
        await stop(task, off)
        segs = await rig.segments()
        ledgers = {r.ledger_id for s in segs for r in s.ranges}
        assert len(ledgers) == 1 and len(segs) >= 3
        assert await rig.read_back() == rig.payloads
        await rig.verify_ok()

    async def test_time_rolls_a_quiet_segment(self, tmp_path: Path) -> None:
        rig = Rig(tmp_path, RolloverPolicy(), RollPolicy(1 << 20, 0.3, 64 * KiB))
        await rig.write(5)
        off = rig.offloader()
        task = asyncio.create_task(off.run())
        # no trigger, no size limit reached: only the 0.3 s age closes it
        await until(lambda: _committed_at_least(rig, 5))
        await rig.write(3)
        await until(lambda: _committed_at_least(rig, 8))
        await stop(task, off)
        assert len(await rig.segments()) == 2
        assert await rig.read_back() == rig.payloads

    async def test_a_quiet_open_segment_holds_its_bytes_and_an_idle_topic_none(
            self, tmp_path: Path) -> None:
        """Memory follows data: a short read waiting in an open segment pins its own bytes,
        not a block-sized array; once the segment is sealed the topic holds no buffer bytes."""
        rig = Rig(tmp_path, RolloverPolicy(max_entries=5), RollPolicy(1 << 20, 600, 64 * KiB))
        await rig.write(5, size=100)  # one closed ledger: read at once, a part far from full
        off = rig.offloader()
        task = asyncio.create_task(off.run())
        await until(lambda: _read_to(off, 5))
        assert rig.buffer.used == 5 * (12 + 100)
        assert rig.buffer.leased == 0  # the 64 KiB array the read landed in went back
        off.trigger()
        await until(lambda: _committed_at_least(rig, 5))
        await asyncio.sleep(0.2)  # idle for a while
        assert (rig.buffer.used, rig.buffer.leased, rig.buffer.parked) == (0, 0, 0)
        await stop(task, off)
        assert await rig.read_back() == rig.payloads

    async def test_blocks_never_mix_ledgers_and_are_cut_at_the_block_size(
            self, tmp_path: Path) -> None:
        rig = Rig(tmp_path, RolloverPolicy(max_entries=7), RollPolicy(1 << 20, 600, 3 * KiB))
        await rig.write(30)
        off = rig.offloader()
        task = asyncio.create_task(off.run())
        await until(lambda: _has_position(off))
        off.trigger()
        await until(lambda: _committed_at_least(rig, 30))
        await stop(task, off)
        (seg,) = await rig.segments()
        reader = TierReader(rig.metadata, rig.blob)
        idx = await reader.index(f"{seg.uid}-index")
        for section in idx.sections:  # type: ignore[union-attr]
            for b in section.blocks:
                data = rig.blob.objects[str(seg.uid)].data
                assert int.from_bytes(data[b.offset + 28:b.offset + 36], "big") == section.ledger_id
                assert idx.block_end(b) - b.offset <= 3 * KiB


class TestFailures:
    """A failing store never loses or duplicates committed data; failed segments are redone."""

    async def test_failing_parts_are_retried_until_the_segment_commits(
            self, tmp_path: Path) -> None:
        fails = {"put_part": 3, "complete": 1, "put": 1}

        def fault(op: str, key: str) -> None:
            if fails.get(op, 0) > 0:
                fails[op] -= 1
                raise Retriable(f"injected {op} failure")

        rig = Rig(tmp_path, RolloverPolicy(max_entries=8), RollPolicy(8 * KiB, 600, 2 * KiB),
                  MemoryBlobStore(fault))
        rig.env.part_size = 2 * KiB  # multipart even for small segments
        await rig.write(40)
        off = rig.offloader()
        task = asyncio.create_task(off.run())
        await until(lambda: _committed_at_least(rig, 32))
        off.trigger()
        await until(lambda: _committed_at_least(rig, 40))
        await stop(task, off)
        assert off.failed_attempts == 0 and all(v == 0 for v in fails.values())
        assert await rig.read_back() == rig.payloads
        await rig.verify_ok()
        # nothing of the failed attempts is left behind
        live = {str(s.uid) for s in await rig.segments()}
        assert {k.removesuffix("-index") for k in rig.blob.objects} == live

    async def test_an_assigned_segment_is_redone_over_the_same_positions(
            self, tmp_path: Path) -> None:
        hold = asyncio.Event()

        async def stall() -> None:
            await hold.wait()

        def fault(op: str, key: str) -> Awaitable[None] | None:
            return stall() if op == "complete" else None

        rig = Rig(tmp_path, RolloverPolicy(max_entries=6), RollPolicy(1 << 20, 600, 2 * KiB),
                  MemoryBlobStore(fault))
        rig.env.part_size = 2 * KiB  # multipart even for small segments
        await rig.write(20)
        off = rig.offloader()
        task = asyncio.create_task(off.run())
        await until(lambda: _has_position(off))
        off.trigger()
        # the segment is ASSIGNED and its data upload hangs: "crash" now
        await until(lambda: _assigned(rig))
        (dead,) = await rig.segments()
        assert not dead.complete
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

        rig.blob.fault = None
        off2 = rig.offloader()
        task2 = asyncio.create_task(off2.run())
        await until(lambda: _committed_at_least(rig, 20))
        await stop(task2, off2)
        (redone,) = await rig.segments()
        assert redone.complete and redone.uid != dead.uid
        assert redone.ranges == dead.ranges
        assert streaming_data_key(dead.uid) not in rig.blob.objects
        assert await rig.read_back() == rig.payloads
        await rig.verify_ok()


class TestStopOutOfTime:
    """A stop with thousands of open segments leaves them as a crash would (``leave_open``):
    the attempt is not cleaned up, and the next owner offloads every entry exactly once."""

    @pytest.mark.parametrize("leave", [True, False])
    async def test_a_cancelled_task_leaves_or_abandons_its_open_attempt(
            self, tmp_path: Path, leave: bool) -> None:
        aborted: list[str] = []

        def fault(op: str, key: str) -> None:
            if op == "abort":
                aborted.append(key)

        rig = Rig(tmp_path, RolloverPolicy(max_entries=6), RollPolicy(1 << 20, 600, 2 * KiB),
                  MemoryBlobStore(fault))
        rig.env.part_size = 2 * KiB  # a multipart upload, open while the segment is
        await rig.write(20)
        off = rig.offloader()
        task = asyncio.create_task(off.run())
        await until(lambda: _read_all(off, 20))
        attempt = off.attempt
        assert attempt is not None  # a segment is open: read, not closed (600 s age roll)
        off.leave_open = leave
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if leave:  # left as a crash leaves it: its upload is offloadd gc's
            assert off.attempt is attempt and aborted == []
        else:
            assert off.attempt is None and aborted
        assert await rig.segments() == []  # nothing of it recorded either way

        off2 = rig.offloader()
        task2 = asyncio.create_task(off2.run())
        await until(lambda: _has_position(off2))
        off2.trigger()
        await until(lambda: _committed_at_least(rig, 20))
        await stop(task2, off2)
        assert await rig.read_back() == rig.payloads  # nothing lost, nothing twice
        await rig.verify_ok()


    async def test_a_stop_closes_its_segment_only_when_its_turn_comes(
            self, tmp_path: Path) -> None:
        """At a stop the closes take turns (``OffloadEnv.stop_closes``, the scheduler's
        shutdown sets it): a task waiting for its turn has begun nothing, so leaving it at
        the closing time leaves only what a crash would (issue 22: 10,000 closes at once
        shared the CPU so evenly that none finished by the deadline)."""
        rig = Rig(tmp_path, RolloverPolicy(max_entries=6), RollPolicy(1 << 20, 600, 2 * KiB))
        await rig.write(20)
        gate = rig.env.stop_closes = asyncio.Semaphore(1)
        await gate.acquire()  # another topic's close holds the only turn
        off = rig.offloader()
        task = asyncio.create_task(off.run())
        await until(lambda: _read_all(off, 20))
        off.request_stop()

        async def waiting() -> bool:
            return bool(gate._waiters)  # the task waits for its turn

        await until(waiting)
        assert await rig.segments() == []  # nothing assigned, nothing committed yet
        gate.release()
        await asyncio.wait_for(task, 10)  # its turn: closed and committed, then stopped
        assert await committed_entries(rig) == 20
        assert gate._value == 1  # (and the turn given back)
        assert await rig.read_back() == rig.payloads


class TestFencing:
    """A stale owner's commit fails its compare-and-set and it stops without committing."""

    async def test_a_fenced_task_commits_nothing(self, tmp_path: Path) -> None:
        rig = Rig(tmp_path, RolloverPolicy(), RollPolicy(1 << 20, 600, 4 * KiB))
        await rig.metadata.create("/offloadd/topics/fence", b"epoch-1")

        class EpochFence:
            def guard_ops(self) -> list[Op]:
                return [CheckOp("/offloadd/topics/fence", 0)]

            async def verify(self) -> None:
                node = await rig.metadata.get("/offloadd/topics/fence")
                if node.version != 0:
                    raise Fenced("a newer owner took the topic")

        await rig.write(10)
        off = rig.offloader(EpochFence())
        task = asyncio.create_task(off.run())
        await until(lambda: _has_position(off))
        await rig.metadata.set("/offloadd/topics/fence", b"epoch-2")  # taken over
        off.trigger()
        await asyncio.wait_for(task, 10)
        assert await rig.segments() == []
        assert rig.blob.objects == {}


class TestMemory:
    """The offload buffer bounds what is held, whatever the write rate and store speed."""

    async def test_buffer_never_exceeds_its_cap_with_a_slow_store(self, tmp_path: Path) -> None:
        async def slow() -> None:
            await asyncio.sleep(0.01)

        def fault(op: str, key: str) -> Awaitable[None] | None:
            return slow() if op == "put_part" else None

        cap = 16 * KiB
        rig = Rig(tmp_path, RolloverPolicy(max_entries=50), RollPolicy(64 * KiB, 600, 4 * KiB),
                  MemoryBlobStore(fault), buffer_cap=cap)
        # a part is held whole until it is sent: parts of a block, well inside the cap (a part
        # filling past the cap is the one case the buffer lets through: test_buffer.TestParked)
        rig.env.part_size = 4 * KiB
        off = rig.offloader()
        task = asyncio.create_task(off.run())
        await rig.write(300)
        await until(lambda: _committed_at_least(rig, 256), timeout=40)
        off.trigger()
        await until(lambda: _committed_at_least(rig, 300), timeout=40)
        await stop(task, off)
        # a read never exceeds its reservation but by the one entry that alone outgrows it
        assert 0 < rig.buffer.high_water <= cap + 12 + KiB
        assert rig.buffer.used == 0
        assert await rig.read_back() == rig.payloads


async def _read_to(off: TopicOffloader, frames: int) -> bool:
    return off.attempt is not None and off.attempt.entries >= frames


async def _has_position(off: TopicOffloader) -> bool:
    return off.position is not None


async def _read_all(off: TopicOffloader, n: int) -> bool:
    return off.position is not None and off.position.entry_id >= 0 and \
        off.attempt is not None and off.attempt.entries >= n


async def _committed_at_least(rig: Rig, n: int) -> bool:
    return await committed_entries(rig) >= n


async def _assigned(rig: Rig) -> bool:
    return any(not s.complete for s in await rig.segments())


class TestLedgerMode:
    """PIP-17 mode offloads closed ledgers whole; switching modes loses and repeats nothing."""

    async def test_closed_ledgers_are_offloaded_whole(self, tmp_path: Path) -> None:
        rig = Rig(tmp_path, RolloverPolicy(max_entries=9), RollPolicy(1 << 20, 600, 4 * KiB))
        rig.mode = OffloadMode.LEDGER
        await rig.write(30)  # ledgers of 9, 9, 9 entries closed; 3 entries in the open one
        off = rig.offloader()
        task = asyncio.create_task(off.run())
        await until(lambda: _committed_at_least(rig, 27))
        await stop(task, off)
        segs = await rig.segments()
        assert [s.kind for s in segs] == [catalog.SegmentKind.LEDGER] * 3
        assert all(s.complete and s.ranges[0].first == 0 for s in segs)
        # blocks of a ledger object: full ones padded to the block size, the last one exact
        for s in segs:
            key = f"{s.uid}-ledger-{s.ranges[0].ledger_id}"
            assert key in rig.blob.objects and key + "-index" in rig.blob.objects
        assert await rig.read_back() == rig.payloads[:27]
        await rig.verify_ok()

    async def test_switching_to_ledger_mode_completes_the_open_segment_first(
            self, tmp_path: Path) -> None:
        rig = Rig(tmp_path, RolloverPolicy(max_entries=12), RollPolicy(1 << 20, 600, 2 * KiB))
        await rig.write(8)
        off = rig.offloader()
        task = asyncio.create_task(off.run())
        await until(lambda: _has_position(off))
        off.trigger()
        await until(lambda: _committed_at_least(rig, 8))  # a streaming segment ends mid-ledger
        rig.mode = OffloadMode.LEDGER
        await rig.write(40)
        await until(lambda: _committed_at_least(rig, 36))
        await stop(task, off)
        segs = await rig.segments()
        kinds = [s.kind for s in segs]
        assert kinds[0] is catalog.SegmentKind.STREAMING
        assert catalog.SegmentKind.LEDGER in kinds
        # the rest of the first ledger went out as one streaming segment ending at its end
        assert segs[1].kind is catalog.SegmentKind.STREAMING and segs[1].end.entry_id == 11
        got = await rig.read_back()
        assert len(got) >= 36 and got == rig.payloads[:len(got)]
        await rig.verify_ok()

    async def test_switching_back_to_streaming_continues_after_the_last_ledger(
            self, tmp_path: Path) -> None:
        rig = Rig(tmp_path, RolloverPolicy(max_entries=10), RollPolicy(1 << 20, 600, 4 * KiB))
        rig.mode = OffloadMode.LEDGER
        await rig.write(25)
        off = rig.offloader()
        task = asyncio.create_task(off.run())
        await until(lambda: _committed_at_least(rig, 20))
        rig.mode = OffloadMode.STREAMING
        off.trigger()
        await until(lambda: _committed_at_least(rig, 25))
        await stop(task, off)
        kinds = [s.kind for s in await rig.segments()]
        assert kinds[:2] == [catalog.SegmentKind.LEDGER] * 2
        assert kinds[-1] is catalog.SegmentKind.STREAMING
        assert await rig.read_back() == rig.payloads
        await rig.verify_ok()


class TestExternalDeletion:
    """A ledger deleted under an open segment fails that attempt, never the task."""

    async def test_the_task_survives_and_offloads_what_remains(self, tmp_path: Path) -> None:
        rig = Rig(tmp_path, RolloverPolicy(max_entries=5), RollPolicy(1 << 20, 600, 2 * KiB))
        await rig.write(20)  # ledgers 0..2 closed (5 entries each), ledger 3 open
        off = rig.offloader()
        task = asyncio.create_task(off.run())
        await until(lambda: _position_past(off, 2))
        first = (await rig.store.source.ledgers(TOPIC))[0].ledger_id
        await rig.store.source.delete_ledger(TOPIC, first)  # retention, behind our back
        off.trigger()
        await until(lambda: _committed_at_least(rig, 10))
        assert not task.done()
        await stop(task, off)
        segs = await rig.segments()
        assert segs and all(s.complete for s in segs)
        assert first not in {lid for s in segs for lid in s.ledger_ids()}
        assert await rig.read_back() == rig.payloads[5:5 + len(await rig.read_back())]


async def _position_past(off: TopicOffloader, ledger_id: int) -> bool:
    return off.position is not None and off.position.ledger_id >= ledger_id


class TestTierUsage:
    """Each committed segment records what it costs in the tier: its two objects, their bytes
    exactly as stored, the payload they hold and the PUT-class requests that wrote them."""

    async def test_recorded_usage_matches_the_objects(self, tmp_path: Path) -> None:
        ops: list[str] = []
        blob = MemoryBlobStore(lambda op, key: ops.append(op))
        # ledgers of 5 KiB: short blocks; parts of >= 8 KiB group them
        rig = Rig(tmp_path, RolloverPolicy(max_entries=5), RollPolicy(1 << 20, 600, 16 * KiB),
                  blob=blob)
        rig.env.part_size = 8 * KiB
        await rig.write(40)
        off = rig.offloader()
        task = asyncio.create_task(off.run())
        await until(lambda: _has_position(off))
        off.trigger()
        await until(lambda: _committed_at_least(rig, 40))
        await stop(task, off)
        segs = [s for s in await rig.segments() if s.complete]
        total = catalog.TierUsage()
        for seg in segs:
            usage = catalog.usage_of(seg)
            assert usage is not None
            total = total + usage
        stored = sum(len(o.data) for o in blob.objects.values())
        assert total.objects == len(blob.objects) == 2 * len(segs)
        assert total.stored_bytes == stored
        assert total.payload_bytes == sum(len(p) for p in rig.payloads)
        puts = ops.count("start_upload") + ops.count("put_part") + ops.count("complete") + \
            ops.count("put")
        assert total.put_requests == puts
        assert ops.count("put_part") < 8  # 8 ledgers, 8+ blocks: fewer parts than blocks
        # blocks sized by content: 40 KiB of payload stored in well under 2 % more
        assert stored / total.payload_bytes < 1.05
        # the daemon's read-back check reports the GET-class requests it made
        heard: list[tuple[int, int]] = []
        before = len(ops)
        await read_back(rig.metadata, blob, TOPIC, NullReadProbe(),
                        on_requests=lambda n, b: heard.append((n, b)))
        reads = [op for op in ops[before:] if op in ("head", "get_range")]
        assert len(heard) == 1 and heard[0][0] == len(reads) == 3  # index HEAD + GET, data
        assert await rig.read_back() == rig.payloads
        await rig.verify_ok()
