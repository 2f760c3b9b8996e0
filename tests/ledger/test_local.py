"""The embedded managed-ledger store: files, rollover, ids, recovery, checksums, deletion.

On-disk layout per ledger (see ``offloadd.ledger.local``)::

    000…07.log  [len|id|payload][len|id|payload]…   frames, as blocks frame them
    000…07.crc  [crc0][crc1]…                        uint32 LE per payload
    000…07.off  [0][off1][off2]…                     int64 LE frame starts; whole records = entries
    000…07.sum, 000…07.osum                          CRC32C per chunk of .log / .off
                                                     (tests/ledger/test_source_checks.py)
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import struct
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from offloadd._proto import mldataformats_pb2 as pb
from offloadd.errors import Conflict, Fenced, FormatError, NotFound, OversizeEntryError
from offloadd.ledger.local import (
    LocalLedgerSource,
    LocalLedgerStore,
    LocalLedgerWriter,
    RolloverPolicy,
    frame_entries,
    ledger_files,
)
from offloadd.metadata import managed_ledger
from offloadd.metadata.base import MetadataStore
from offloadd.metadata.memory import MemoryMetadataStore
from offloadd.model import FRAME_OVERHEAD, LedgerDesc, LedgerState, Position, TopicName
from offloadd.model.keys import LEDGER_ID_COUNTER
from tests.ledger.support import append_bytes, frames, overwrite

pytestmark = pytest.mark.timeout(60)

A = TopicName.parse("persistent://public/default/a")
B = TopicName.parse("persistent://other/ns/b")


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def metadata() -> MetadataStore:
    return MemoryMetadataStore()


@pytest.fixture
async def store(tmp_path: Path, metadata: MetadataStore) -> AsyncIterator[LocalLedgerStore]:
    s = LocalLedgerStore(tmp_path, metadata)
    yield s
    await s.close()


async def read_all(source: LocalLedgerSource, topic: TopicName,
                   desc: LedgerDesc) -> list[bytes]:
    if desc.entries == 0:
        return []
    return frames(await source.read(topic, desc.ledger_id, 0, desc.last_entry_id))


class TestFraming:
    """frame_entries writes exactly what the block format expects."""

    def test_frames_crcs_and_offsets_match_the_obvious_encoding(self) -> None:
        payloads = [b"", b"a", b"hello" * 100]
        log, crcs, offs, end = frame_entries(payloads, 7, 1000)
        assert log == b"".join(struct.pack(">iq", len(p), 7 + i) + p
                               for i, p in enumerate(payloads))
        assert crcs == b"".join(struct.pack("<I", crc32c.crc32c(p)) for p in payloads)
        assert offs == struct.pack("<3q", 1000, 1012, 1025)
        assert end == 1000 + len(log)


class TestRoundTrip:
    """Whatever is appended reads back byte for byte, in order, across rollovers."""

    @settings(max_examples=40, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(
        batches=st.lists(st.one_of(
            st.lists(st.just(b""), min_size=1, max_size=5),
            st.lists(st.binary(max_size=40), min_size=1, max_size=200),
            st.lists(st.builds(lambda n, seed: hashlib.shake_128(seed).digest(n),
                               st.integers(10_000, 70_000), st.binary(max_size=8)),
                     min_size=1, max_size=2),
        ), min_size=1, max_size=6),
        max_entries=st.integers(1, 300),
        max_bytes=st.integers(1, 200_000),
        run_bytes=st.integers(1, 100_000),
    )
    async def test_appended_batches_read_back_in_order(
            self, batches: list[list[bytes]], max_entries: int, max_bytes: int,
            run_bytes: int) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            store = LocalLedgerStore(tmp, MemoryMetadataStore(),
                                     RolloverPolicy(max_entries, max_bytes, 3600))
            try:
                positions = [await store.writer.append(A, batch) for batch in batches]
                descs = await store.source.ledgers(A)
                got: list[bytes] = []
                for desc in descs:
                    assert desc.entries <= max_entries
                    entry = 0
                    while entry <= desc.last_entry_id:
                        run = await store.source.read(A, desc.ledger_id, entry,
                                                      desc.last_entry_id, max_bytes=run_bytes)
                        assert run.count == 1 or len(run.data) <= run_bytes
                        got.extend(frames(run))
                        entry += run.count
                    if desc.state is LedgerState.CLOSED:
                        assert desc.size == sum(map(len, got[len(got) - desc.entries:]))
            finally:
                await store.close()
        everything = [p for batch in batches for p in batch]
        assert got == everything
        ids = [d.ledger_id for d in descs]
        assert ids == sorted(set(ids))
        assert positions == sorted(positions)
        assert positions[-1] == max(Position(d.ledger_id, d.last_entry_id) for d in descs
                                    if d.entries)

    async def test_verify_crc_accepts_intact_entries(self, tmp_path: Path,
                                                     metadata: MetadataStore) -> None:
        writer = LocalLedgerWriter(tmp_path, metadata)
        pos = await writer.append(A, [os.urandom(n) for n in range(0, 3000, 300)])
        source = LocalLedgerSource(tmp_path, metadata, verify_crc=True)
        run = await source.read(A, pos.ledger_id, 0, pos.entry_id)
        assert run.count == 10
        assert list(await source.read_crcs(pos.ledger_id, 0, pos.entry_id)) == list(run.crcs or ())
        await writer.close()


class TestRollover:
    """Ledgers roll by entries, bytes and age; ids are global, unique and increasing."""

    async def test_rolls_by_entries_splitting_a_batch(self, tmp_path: Path,
                                                      metadata: MetadataStore) -> None:
        writer = LocalLedgerWriter(tmp_path, metadata, RolloverPolicy(4, 1 << 30, 3600))
        source = LocalLedgerSource(tmp_path, metadata)
        assert await writer.append(A, [b"x"] * 10) == Position(2, 1)
        descs = await source.ledgers(A)
        assert [(d.ledger_id, d.state, d.entries) for d in descs] == [
            (0, LedgerState.CLOSED, 4), (1, LedgerState.CLOSED, 4), (2, LedgerState.OPEN, 2)]
        await writer.close()

    async def test_rolls_by_bytes_keeping_the_entry_that_crosses_the_limit(
            self, tmp_path: Path, metadata: MetadataStore) -> None:
        writer = LocalLedgerWriter(tmp_path, metadata, RolloverPolicy(1000, 250, 3600))
        source = LocalLedgerSource(tmp_path, metadata)
        await writer.append(A, [b"x" * 100] * 6)
        descs = await source.ledgers(A)
        # 100, 200, 300 ≥ 250 → full after 3 entries; a full ledger rolls at once.
        assert [(d.entries, d.size, d.state) for d in descs] == [
            (3, 300, LedgerState.CLOSED), (3, 300, LedgerState.CLOSED), (0, 0, LedgerState.OPEN)]
        await writer.close()

    async def test_rolls_by_age_on_the_next_append_and_on_roll_expired(
            self, tmp_path: Path, metadata: MetadataStore) -> None:
        clock = Clock()
        writer = LocalLedgerWriter(tmp_path, metadata, RolloverPolicy(1000, 1 << 30, 60),
                                   clock=clock)
        source = LocalLedgerSource(tmp_path, metadata)
        first = await writer.append(A, [b"a"])
        clock.now += 59
        assert (await writer.append(A, [b"b"])).ledger_id == first.ledger_id
        assert await writer.roll_expired() == []
        clock.now += 1
        second = await writer.append(A, [b"c"])
        assert second == Position(second.ledger_id, 0)
        assert second.ledger_id > first.ledger_id
        clock.now += 60
        assert await writer.roll_expired() == [A]
        descs = await source.ledgers(A)
        assert [d.entries for d in descs] == [2, 1, 0]
        assert descs[1].ctime_ms == int((clock.now - 60) * 1000)
        await writer.close()

    async def test_ledger_ids_are_unique_and_increasing_across_topics_and_writers(
            self, tmp_path: Path, metadata: MetadataStore) -> None:
        policy = RolloverPolicy(3, 1 << 30, 3600)
        w1 = LocalLedgerWriter(tmp_path, metadata, policy, id_range=4)
        w2 = LocalLedgerWriter(tmp_path, metadata, policy, id_range=4)
        source = LocalLedgerSource(tmp_path, metadata)
        for i in range(10):
            await w1.append(A, [b"a"] * (i % 4 + 1))
            await w2.append(B, [b"b"] * (i % 3 + 1))
        a_ids = [d.ledger_id for d in await source.ledgers(A)]
        b_ids = [d.ledger_id for d in await source.ledgers(B)]
        assert a_ids == sorted(a_ids)
        assert b_ids == sorted(b_ids)
        assert len(set(a_ids) | set(b_ids)) == len(a_ids) + len(b_ids)
        await w1.close()
        await w2.close()

    async def test_a_new_ledger_is_above_the_topics_previous_ones_whatever_range_is_held(
            self, tmp_path: Path, metadata: MetadataStore) -> None:
        w1 = LocalLedgerWriter(tmp_path, metadata, id_range=16)
        await w1.append(A, [b"a"])  # w1 now holds ids 1..15
        w2 = LocalLedgerWriter(tmp_path, metadata, id_range=16)
        await w2.append(B, [b"b"])  # ledger 16
        await w2.close()
        await w1.append(B, [b"b"])  # B moved to w1: its next ledger must follow 16
        source = LocalLedgerSource(tmp_path, metadata)
        assert [d.ledger_id for d in await source.ledgers(B)] == [16, 32]
        await w1.close()

    async def test_ids_reserved_by_a_dead_writer_are_never_reused(
            self, tmp_path: Path, metadata: MetadataStore) -> None:
        w1 = LocalLedgerWriter(tmp_path, metadata, id_range=8)
        await w1.append(A, [b"a"])
        await w1.close()  # ids 1..7 are lost with it
        w2 = LocalLedgerWriter(tmp_path, metadata, id_range=8)
        assert (await w2.append(B, [b"b"])).ledger_id == 8
        assert (await metadata.get(LEDGER_ID_COUNTER)).data == b"16"
        await w2.close()

    async def test_roll_of_an_empty_ledger_is_a_no_op(self, store: LocalLedgerStore) -> None:
        ledger_id = await store.writer.open_topic(A)
        await store.writer.roll(A)
        assert [d.ledger_id for d in await store.source.ledgers(A)] == [ledger_id]


class TestMetadata:
    """The writer keeps ManagedLedgerInfo as Pulsar does and never touches offload contexts."""

    async def test_ledger_info_records_ctime_entries_and_size(
            self, tmp_path: Path, metadata: MetadataStore) -> None:
        clock = Clock(1234.5)
        writer = LocalLedgerWriter(tmp_path, metadata, clock=clock)
        await writer.append(A, [b"abc", b"de"])
        info, _ = await managed_ledger.load(metadata, A.managed_ledger)
        assert not info.ledgerInfo[0].HasField("entries")
        assert info.ledgerInfo[0].timestamp == 1_234_500
        await writer.close()
        info, _ = await managed_ledger.load(metadata, A.managed_ledger)
        li = info.ledgerInfo[0]
        assert (li.ledgerId, li.entries, li.size, li.timestamp) == (0, 2, 5, 1_234_500)

    async def test_offload_context_written_meanwhile_survives_a_rollover(
            self, tmp_path: Path, metadata: MetadataStore) -> None:
        writer = LocalLedgerWriter(tmp_path, metadata)
        pos = await writer.append(A, [b"a"])

        def mark(info: pb.ManagedLedgerInfo) -> bool:
            _ledger_info(info, pos.ledger_id).offloadContext.offloadSegment.add(
                uidMsb=1, uidLsb=2, endEntryId=0)
            return True

        await managed_ledger.update(metadata, A.managed_ledger, mark)
        await writer.roll(A)
        await writer.close()
        info, _ = await managed_ledger.load(metadata, A.managed_ledger)
        li = _ledger_info(info, pos.ledger_id)
        assert li.entries == 1
        assert [(s.uidMsb, s.uidLsb) for s in li.offloadContext.offloadSegment] == [(1, 2)]

    async def test_list_topics_walks_tenant_namespace_and_topic(
            self, store: LocalLedgerStore, metadata: MetadataStore) -> None:
        c = TopicName.parse("persistent://public/default/c")
        for topic in (A, B, c):
            await store.writer.append(topic, [b"x"])
        await metadata.create("/managed-ledgers/public/default/persistent/bad name", b"")
        assert sorted(await store.source.list_topics()) == sorted([A, B, c])

    async def test_list_topics_of_an_empty_store_is_empty(self, store: LocalLedgerStore) -> None:
        assert await store.source.list_topics() == []


class TestLimits:
    """Oversize entries are refused whole, naming the topic and the size."""

    async def test_oversize_entry_refuses_the_whole_batch(
            self, tmp_path: Path, metadata: MetadataStore) -> None:
        writer = LocalLedgerWriter(tmp_path, metadata, max_entry_bytes=100)
        source = LocalLedgerSource(tmp_path, metadata)
        await writer.append(A, [b"ok"])
        with pytest.raises(OversizeEntryError, match=r"persistent://public/default/a.*101 bytes"):
            await writer.append(A, [b"fine", b"x" * 101])
        descs = await source.ledgers(A)
        assert [d.entries for d in descs] == [1]
        assert await writer.append(A, [b"x" * 100]) == Position(descs[0].ledger_id, 1)
        await writer.close()

    async def test_default_limit_is_pulsars_max_message_size(
            self, store: LocalLedgerStore) -> None:
        await store.writer.append(A, [b"x" * (5 << 20)])
        with pytest.raises(OversizeEntryError):
            await store.writer.append(A, [b"x" * ((5 << 20) + 1)])


class TestCrashRecovery:
    """A ledger left open by a dead writer is closed at its last whole entry."""

    @staticmethod
    async def crash(tmp_path: Path, metadata: MetadataStore, batches: int) -> int:
        """Leave what a killed writer leaves: files as written, the ledger open in metadata."""
        writer = LocalLedgerWriter(tmp_path, metadata)
        for i in range(batches):
            pos = await writer.append(A, [bytes([i]) * (10 + i)] * 3)
        await writer.close()

        def reopen(info: pb.ManagedLedgerInfo) -> bool:
            li = info.ledgerInfo[-1]
            li.ClearField("entries")
            li.ClearField("size")
            return True

        await managed_ledger.update(metadata, A.managed_ledger, reopen)
        return pos.ledger_id

    @pytest.mark.parametrize(("tear", "whole"), [
        ("nothing", 12),
        ("log mid-frame", 11),       # the last frame lost its tail
        ("log mid-header", 11),      # only 5 bytes of the last frame remain
        ("partial batch in log", 12),  # frames written, .crc/.off not yet
        ("partial off record", 12),  # 3 bytes of a 13th record
        ("crc without off", 12),     # a 13th CRC, no offset yet
    ])
    async def test_new_writer_closes_at_the_last_whole_entry(
            self, tmp_path: Path, metadata: MetadataStore, tear: str, whole: int) -> None:
        ledger_id = await self.crash(tmp_path, metadata, 4)
        files = ledger_files(tmp_path, ledger_id)
        log_size = files.log.stat().st_size
        if tear == "log mid-frame":
            os.truncate(files.log, log_size - 4)
        elif tear == "log mid-header":
            os.truncate(files.log, log_size - 13 - 12 + 5)
        elif tear == "partial batch in log":
            append_bytes(files.log, struct.pack(">iq", 50, 12) + b"z" * 20)
        elif tear == "partial off record":
            append_bytes(files.off, b"\x01\x02\x03")
        elif tear == "crc without off":
            append_bytes(files.crc, b"\x01\x02\x03\x04")

        source = LocalLedgerSource(tmp_path, metadata)
        [desc] = await source.ledgers(A)
        assert (desc.state, desc.entries) == (LedgerState.OPEN, whole)
        with pytest.raises(NotFound):
            await source.read(A, ledger_id, 0, whole)

        writer = LocalLedgerWriter(tmp_path, metadata)
        pos = await writer.append(A, [b"after"])
        closed, new = await source.ledgers(A)
        assert (closed.state, closed.entries) == (LedgerState.CLOSED, whole)
        assert new.ledger_id == pos.ledger_id > ledger_id
        expected = [bytes([i]) * (10 + i) for i in range(4) for _ in range(3)][:whole]
        assert await read_all(source, A, closed) == expected
        assert closed.size == sum(map(len, expected))
        assert files.off.stat().st_size == 8 * whole
        assert files.crc.stat().st_size == 4 * whole
        assert files.log.stat().st_size == closed.size + FRAME_OVERHEAD * whole
        await writer.close()

    async def test_a_writer_finding_another_writers_fresh_ledger_refuses(
            self, tmp_path: Path, metadata: MetadataStore) -> None:
        w1 = LocalLedgerWriter(tmp_path, metadata)
        await w1.append(A, [b"a"])
        w2 = LocalLedgerWriter(tmp_path, metadata)
        # w2 recovers w1's open ledger and opens its own; w1's next rollover then finds a
        # ledger it did not open and must not claim it.
        await w2.open_topic(A)
        with pytest.raises(Fenced):
            await w1.roll(A)
        with pytest.raises(Fenced):
            await w1.append(A, [b"late"])  # keeps refusing; w2's ledger stays untouched
        await w1.close()
        [_, taken] = await LocalLedgerSource(tmp_path, metadata).ledgers(A)
        assert (taken.state, taken.entries) == (LedgerState.OPEN, 0)
        await w2.close()


class TestChecksums:
    """verify_crc catches flipped payload bytes and bad headers, naming file and entry."""

    async def test_flipped_payload_byte_is_a_format_error(
            self, tmp_path: Path, metadata: MetadataStore) -> None:
        writer = LocalLedgerWriter(tmp_path, metadata)
        pos = await writer.append(A, [b"a" * 50, b"b" * 50, b"c" * 50])
        await writer.close()
        files = ledger_files(tmp_path, pos.ledger_id)
        overwrite(files.log, 62 + 12 + 7, b"X")
        trusting = LocalLedgerSource(tmp_path, metadata, verify_crc=False)
        assert len((await trusting.read(A, pos.ledger_id, 0, 2)).data) == 186
        checking = LocalLedgerSource(tmp_path, metadata, verify_crc=True)
        with pytest.raises(FormatError, match=r"00000000000000000000\.log.*entry 1") as err:
            await checking.read(A, pos.ledger_id, 0, 2)
        assert err.value.offset == 62
        run = await checking.read(A, pos.ledger_id, 2, 2)
        assert frames(run) == [b"c" * 50]

    async def test_bad_frame_header_is_a_format_error(
            self, tmp_path: Path, metadata: MetadataStore) -> None:
        writer = LocalLedgerWriter(tmp_path, metadata)
        pos = await writer.append(A, [b"a" * 50, b"b" * 50])
        await writer.close()
        overwrite(ledger_files(tmp_path, pos.ledger_id).log, 62 + 4, struct.pack(">q", 7))
        checking = LocalLedgerSource(tmp_path, metadata, verify_crc=True)
        with pytest.raises(FormatError, match="entry 7"):
            await checking.read(A, pos.ledger_id, 0, 1)


class TestDeletion:
    """Retention deletes closed ledgers from metadata first, then their files."""

    async def test_deleting_a_closed_ledger_removes_metadata_and_files(
            self, store: LocalLedgerStore) -> None:
        first = await store.writer.append(A, [b"a"])
        await store.writer.roll(A)
        second = await store.writer.append(A, [b"b"])
        await store.source.delete_ledger(A, first.ledger_id)
        assert [d.ledger_id for d in await store.source.ledgers(A)] == [second.ledger_id]
        assert not any(p.exists() for p in ledger_files(store.source.path, first.ledger_id).all())
        with pytest.raises(NotFound):
            await store.source.read(A, first.ledger_id, 0, 0)

    async def test_open_ledger_cannot_be_deleted(self, store: LocalLedgerStore) -> None:
        pos = await store.writer.append(A, [b"a"])
        with pytest.raises(Conflict, match="open"):
            await store.source.delete_ledger(A, pos.ledger_id)
        assert ledger_files(store.source.path, pos.ledger_id).log.exists()

    async def test_ledger_of_another_topic_is_not_found_and_kept(
            self, store: LocalLedgerStore) -> None:
        pos = await store.writer.append(A, [b"a"])
        await store.writer.roll(A)
        await store.writer.append(B, [b"b"])
        with pytest.raises(NotFound):
            await store.source.delete_ledger(B, pos.ledger_id)
        assert ledger_files(store.source.path, pos.ledger_id).log.exists()


class TestWaitAcrossProcesses:
    """A source without the writer's notifier polls files and metadata."""

    async def test_polling_source_wakes_on_append_and_on_new_ledger(
            self, tmp_path: Path, metadata: MetadataStore) -> None:
        writer = LocalLedgerWriter(tmp_path, metadata)
        source = LocalLedgerSource(tmp_path, metadata)
        pos = await writer.append(A, [b"a"])
        waiter = asyncio.create_task(source.wait_for_entries(A, pos.ledger_id, 0, 30))
        await asyncio.sleep(0.1)
        assert not waiter.done()
        await writer.append(A, [b"b"])
        await asyncio.wait_for(waiter, 5)
        waiter = asyncio.create_task(source.wait_for_entries(A, pos.ledger_id, 1, 30))
        await asyncio.sleep(0.1)
        assert not waiter.done()
        await writer.roll(A)
        await asyncio.wait_for(waiter, 5)
        await writer.close()

    async def test_idle_waits_end_at_their_deadline_on_the_watchers_tick(
            self, tmp_path: Path, metadata: MetadataStore,
            monkeypatch: pytest.MonkeyPatch) -> None:
        """Issue 22: 10,000 idle topics each held a timer (handle, timeout object, frames) for
        its wait's deadline; the watcher's one tick ends them instead."""
        writer = LocalLedgerWriter(tmp_path, metadata)
        source = LocalLedgerSource(tmp_path, metadata)
        topics = [TopicName.parse(f"persistent://public/default/idle-{i}") for i in range(50)]
        ends = [await writer.append(t, [b"x"]) for t in topics]
        loop = asyncio.get_running_loop()
        timers: list[float | None] = []
        timeout = asyncio.timeout

        def counted(delay: float | None) -> asyncio.Timeout:
            timers.append(delay)
            return timeout(delay)

        monkeypatch.setattr(asyncio, "timeout", counted)
        t0 = loop.time()
        waits = [asyncio.create_task(source.wait_for_entries(t, p.ledger_id, p.entry_id, 0.3))
                 for t, p in zip(topics, ends, strict=True)]
        await asyncio.sleep(0.1)
        assert not any(w.done() for w in waits)  # waiting: nothing written
        assert timers == []  # the watcher's tick, not a timer per wait
        await asyncio.wait_for(asyncio.gather(*waits), 5)  # each ends at its deadline
        assert loop.time() - t0 >= 0.3
        assert source._watcher.waiting == 0 and not source._watcher._due
        # a wait woken by a change leaves nothing behind either
        waiter = asyncio.create_task(source.wait_for_entries(topics[0], ends[0].ledger_id,
                                                             ends[0].entry_id, 30))
        await asyncio.sleep(0.1)
        await writer.append(topics[0], [b"y"])
        await asyncio.wait_for(waiter, 5)
        assert source._watcher.waiting == 0 and not source._watcher._due
        await writer.close()
        await source.close()

    async def test_a_wait_right_after_a_read_reads_no_metadata_and_still_wakes(
            self, tmp_path: Path, metadata: MetadataStore,
            monkeypatch: pytest.MonkeyPatch) -> None:
        """Issue 22: the topic task reads its ledgers, then waits; on ZooKeeper the wait's own
        read of the same node was a network round trip per segment."""
        writer = LocalLedgerWriter(tmp_path, metadata)
        source = LocalLedgerSource(tmp_path, metadata)
        pos = await writer.append(A, [b"a"])
        # the watcher runs once a wait has registered: let one wait end first
        await source.wait_for_entries(A, pos.ledger_id, pos.entry_id, 0.05)
        gets: list[str] = []
        real_get = metadata.get

        async def counted(path: str) -> object:
            gets.append(path)
            return await real_get(path)

        await source.ledgers(A)
        monkeypatch.setattr(metadata, "get", counted)
        waiter = asyncio.create_task(source.wait_for_entries(A, pos.ledger_id, pos.entry_id, 30))
        await asyncio.sleep(0.2)
        assert not waiter.done()
        assert gets == []  # nothing journaled since the read: no second read
        await writer.append(A, [b"b"])
        await asyncio.wait_for(waiter, 5)
        # a change after the read, before the wait, journaled but perhaps not yet seen by
        # the watcher: the wait still ends
        await source.ledgers(A)
        await writer.roll(A)
        await asyncio.wait_for(source.wait_for_entries(A, pos.ledger_id, pos.entry_id + 1, 30),
                               5)
        await writer.close()
        await source.close()

    async def test_wait_at_the_end_of_a_closed_last_ledger_waits_for_a_new_one(
            self, tmp_path: Path, metadata: MetadataStore) -> None:
        writer = LocalLedgerWriter(tmp_path, metadata)
        pos = await writer.append(A, [b"a"])
        await writer.close()
        source = LocalLedgerSource(tmp_path, metadata)
        waiter = asyncio.create_task(source.wait_for_entries(A, pos.ledger_id, 0, 30))
        await asyncio.sleep(0.1)
        assert not waiter.done()
        writer = LocalLedgerWriter(tmp_path, metadata)
        await writer.append(A, [b"b"])
        await asyncio.wait_for(waiter, 5)
        await writer.close()

    async def test_wait_on_unknown_topic_is_not_found(self, store: LocalLedgerStore) -> None:
        with pytest.raises(NotFound, match="nothing"):
            await store.source.wait_for_entries(
                TopicName.parse("persistent://public/default/nothing"), 0, -1, 1)


def _ledger_info(info: pb.ManagedLedgerInfo, ledger_id: int) -> pb.ManagedLedgerInfo.LedgerInfo:
    return next(li for li in info.ledgerInfo if li.ledgerId == ledger_id)
