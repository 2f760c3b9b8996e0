"""Multipart parts apart from blocks: blocks sized by content, parts of whole blocks.

::

    blocks  |b1 |b2      |b3|b4          |b5 |b6|   (a ledger boundary cuts a block short)
    parts   |part 1 >= size      |part 2 >= size |last|
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest
from crc32c import crc32c as crc32c_of
from hypothesis import given, settings
from hypothesis import strategies as st

from offloadd.blobstore.base import Buffers, MultipartUpload, ObjectInfo
from offloadd.blobstore.memory import MemoryBlobStore
from offloadd.errors import Fatal
from offloadd.format import StreamingIndex, decode_index, parse_block_header
from offloadd.format.block import HEADER_LEN, MIN_PADDING
from offloadd.format.checksum import stamp_blocks
from offloadd.format.layout import Block, BlockPlan
from offloadd.ledger.memory import MemoryLedgerSource
from offloadd.metadata.memory import MemoryMetadataStore
from offloadd.model import TopicName
from offloadd.model.catalog import LedgerRange, Segment, SegmentKind
from offloadd.model.keys import streaming_data_key, streaming_index_key
from offloadd.offload.attempt import Uploads, open_streaming
from offloadd.offload.buffer import OffloadBuffer
from offloadd.offload.parts import PartAssembler, UploadPart
from offloadd.offload.runs import Run, RunReader
from offloadd.read.reader import TierReader

pytestmark = pytest.mark.timeout(60)

TOPIC = TopicName.parse("persistent://public/default/parts")
KiB = 1024


def blocks_of(lengths: list[int]) -> list[Block]:
    out, offset = [], 0
    for i, n in enumerate(lengths):
        plan = BlockPlan(0, i, i, 0, 0, n)
        out.append(Block(i + 1, offset, (b"\0" * n,), n, plan))
        offset += n
    return out


class TestPartAssembler:
    """Any block sizes: parts tile the object, every part but the last reaches the part size,
    every block lies wholly inside one part."""

    @settings(max_examples=300, deadline=None)
    @given(lengths=st.lists(st.integers(1, 5000), min_size=1, max_size=60),
           part_size=st.integers(1, 20000), chunks=st.lists(st.integers(0, 8), max_size=20))
    def test_parts_tile_the_object(self, lengths: list[int], part_size: int,
                                   chunks: list[int]) -> None:
        blocks = blocks_of(lengths)
        asm = PartAssembler(part_size)
        parts, i = [], 0
        for c in chunks:  # blocks arrive in batches of any size (one batch per run)
            parts += asm.add(blocks[i:i + c])
            i += c
        parts += asm.add(blocks[i:])
        last = asm.finish()
        if last is not None:
            parts.append(last)
        assert [p.number for p in parts] == list(range(1, len(parts) + 1))
        offset = 0
        for p in parts:
            assert p.offset == offset and p.length == sum(b.length for b in p.blocks)
            inner = p.offset
            for b in p.blocks:  # blocks consecutive, each one's offset its header's start
                assert b.offset == inner
                inner += b.length
            offset += p.length
        assert offset == sum(lengths)
        assert [b for p in parts for b in p.blocks] == blocks
        for p in parts[:-1]:
            assert p.length >= part_size
            assert p.length - p.blocks[-1].length < part_size  # cut as soon as it is full
        assert asm.pending == () and asm.pending_bytes == 0

    def test_blocks_out_of_order_are_refused(self) -> None:
        _, b = blocks_of([10, 10])
        asm = PartAssembler(100)
        with pytest.raises(ValueError, match="expected 0"):
            asm.add([b])

    def test_nothing_pending_means_no_last_part(self) -> None:
        asm = PartAssembler(10)
        assert len(asm.add(blocks_of([10, 10]))) == 2
        assert asm.finish() is None


@dataclass
class PartLog:
    sizes: dict[str, list[int]] = field(default_factory=dict)
    # per key: (the CRC32C of the bytes sent, the CRC32C the uploader gave with them)
    crcs: dict[str, list[tuple[int, int | None]]] = field(default_factory=dict)


class _Recording(MultipartUpload):
    def __init__(self, inner: MultipartUpload, sizes: list[int],
                 crcs: list[tuple[int, int | None]]) -> None:
        self.inner, self.sizes, self.crcs = inner, sizes, crcs
        self.key = inner.key

    async def put_part(self, part_number: int, offset: int, data: Buffers, *,
                       crc32c: int | None = None) -> None:
        self.sizes.append(sum(len(b) for b in data))
        self.crcs.append((crc32c_of(b"".join(data)), crc32c))
        await self.inner.put_part(part_number, offset, data, crc32c=crc32c)

    async def complete(self) -> ObjectInfo:
        return await self.inner.complete()

    async def abort(self) -> None:
        await self.inner.abort()


class RecordingStore(MemoryBlobStore):
    """A memory store that records the size of every part it is sent."""

    def __init__(self) -> None:
        super().__init__()
        self.log = PartLog()

    async def start_upload(  # type: ignore[override]  # a wrapper, not a MemoryUpload
            self, key: str, metadata: Mapping[str, str]) -> MultipartUpload:
        inner = await super().start_upload(key, metadata)
        return _Recording(inner, self.log.sizes.setdefault(key, []),
                          self.log.crcs.setdefault(key, []))


def small_ledgers(n: int, entries: int, size: int) -> MemoryLedgerSource:
    src = MemoryLedgerSource()
    for i in range(n):
        src.append(TOPIC, [bytes([i % 251]) * size for _ in range(entries)])
        src.close_ledger(TOPIC)
    return src


class CountingReader:
    """Runs whose release is counted: each run must be released exactly once."""

    def __init__(self, reader: RunReader) -> None:
        self.reader = reader
        self.read = 0
        self.released: dict[int, int] = {}

    def wrap(self, run: Run) -> Run:
        n = self.read
        self.read += 1
        self.released[n] = 0

        def release() -> None:
            self.released[n] += 1
            run.release()

        return Run(run.entries, release, run.park)


class TestSegmentParts:
    """A segment of many small ledgers: blocks are content-sized (no padding to the part size),
    and the data object travels in parts of at least the part size, but the last."""

    async def upload(self, store: RecordingStore, src: MemoryLedgerSource, ledgers: int,
                     last: int, buf: OffloadBuffer, part_size: int,
                     counting: CountingReader | None = None,
                     throttled: list[int] | None = None) -> tuple[str, int]:
        reader = RunReader(src, buf, TOPIC)

        async def acquire(n: int) -> None:
            if throttled is not None:
                throttled.append(n)

        att = await open_streaming(Uploads(store, TOPIC.managed_ledger, 2, acquire=acquire,
                                           part_size=part_size),
                                   max_block_size=16 * KiB, opened_at=0.0)
        for lid in range(ledgers):
            async for run in reader.runs(LedgerRange(lid, 0, last), 8 * KiB,
                                         att.wait_for_room):
                att.feed(counting.wrap(run) if counting else run)
        await att.seal()
        return streaming_data_key(att.uid), att.length

    async def test_parts_group_blocks_and_offsets_point_at_headers(self) -> None:
        store, ledgers = RecordingStore(), 12
        throttled: list[int] = []
        src = small_ledgers(ledgers, 7, 1000)  # ~7 KiB per ledger: one short block each
        buf = OffloadBuffer(1 << 20)
        key, length = await self.upload(store, src, ledgers, 6, buf, part_size=20 * KiB,
                                        throttled=throttled)
        sizes = store.log.sizes[key]
        assert sum(sizes) == length and len(sizes) < ledgers
        assert sorted(throttled) == sorted(sizes)  # the throttle takes each part's bytes
        assert all(s >= 20 * KiB for s in sizes[:-1])
        data = await store.get_range(key, 0, length)
        ikey = streaming_index_key(uuid.UUID(key))
        idx = decode_index(await store.get_range(ikey, 0, (await store.head(ikey)).size), ikey)
        assert isinstance(idx, StreamingIndex) and idx.data_object_length == length
        payload = 0
        for section in idx.sections:
            for b in section.blocks:
                hdr = parse_block_header(data, b.offset, key)
                assert hdr.ledger_id == section.ledger_id
                assert hdr.first_entry_id == b.first_entry_id
                assert idx.block_end(b) == b.offset + hdr.block_len
            payload += section.size
        # content-sized: header + frames + the minimum padding, nothing more
        blocks = sum(len(s.blocks) for s in idx.sections)
        assert length == payload + blocks * (HEADER_LEN + MIN_PADDING) + 12 * 7 * ledgers
        assert [b.part_id for s in idx.sections for b in s.blocks] == \
            list(range(1, blocks + 1))  # part ids count blocks (Pulsar's numbering)

    async def test_reads_fetch_one_range_per_part(self) -> None:
        """The reader's GETs are cut by the writer's rule: one ranged GET per part, each a
        run of whole blocks; every entry comes back."""
        store, ledgers = RecordingStore(), 12
        src = small_ledgers(ledgers, 7, 1000)
        key, _ = await self.upload(store, src, ledgers, 6, OffloadBuffer(1 << 20),
                                   part_size=20 * KiB)
        gets: list[str] = []
        store.fault = lambda op, k: gets.append(k) if op == "get_range" else None
        uid = uuid.UUID(key)
        ranges = tuple(LedgerRange(lid, 0, 6) for lid in range(ledgers))
        seg = Segment(uid, SegmentKind.STREAMING, ranges, True)
        reader = TierReader(MemoryMetadataStore(), store, prefetch=2, range_bytes=20 * KiB)
        got = [(e.position.ledger_id, e.position.entry_id, bytes(e.payload))
               async for e in reader.read_segment(seg)]
        assert got == [(lid, e, bytes([lid % 251]) * 1000) for lid in range(ledgers)
                       for e in range(7)]
        assert gets.count(key) == len(store.log.sizes[key]) < 12  # a GET per part, not block

    async def test_a_buffer_smaller_than_a_part_does_not_stall(self) -> None:
        """Blocks waiting for their part to fill do not hold buffer room: a 16 KiB buffer
        uploads 40 KiB parts (their runs would otherwise fill it and wait on each other)."""
        store, ledgers = RecordingStore(), 20
        src = small_ledgers(ledgers, 4, 1000)
        buf = OffloadBuffer(16 * KiB)
        counting = CountingReader(RunReader(src, buf, TOPIC))
        key, _ = await self.upload(store, src, ledgers, 3, buf, part_size=40 * KiB,
                                   counting=counting)
        assert len(store.log.sizes[key]) >= 2 and all(
            s >= 40 * KiB for s in store.log.sizes[key][:-1])
        assert buf.used == 0
        assert set(counting.released.values()) == {1}  # each run released once

    async def test_an_abort_releases_the_runs_of_blocks_that_never_left(self) -> None:
        store = RecordingStore()
        src = small_ledgers(3, 4, 1000)
        buf = OffloadBuffer(1 << 20)
        reader = RunReader(src, buf, TOPIC)
        counting = CountingReader(reader)
        att = await open_streaming(Uploads(store, TOPIC.managed_ledger, 2, part_size=1 << 20),
                                   max_block_size=16 * KiB, opened_at=0.0)
        for lid in range(3):
            async for run in reader.runs(LedgerRange(lid, 0, 3), 8 * KiB):
                att.feed(counting.wrap(run))
        assert att.parts is not None and len(att.parts.pending) == 3  # none sent yet
        await att.abort()
        assert set(counting.released.values()) == {1} and buf.used == 0
        assert [o async for o in store.list()] == []


class TestPartChecksums:
    """Each part goes with its CRC32C, combined from its blocks' (no pass over its bytes): the
    store checks the bytes against it (S3's ``x-amz-checksum-crc32c``), so bytes that changed
    after they were read and stamped are refused."""

    async def test_every_part_is_sent_with_the_crc_of_its_bytes(self) -> None:
        store, ledgers = RecordingStore(), 12
        key, _ = await TestSegmentParts().upload(store, small_ledgers(ledgers, 7, 1000),
                                                 ledgers, 6, OffloadBuffer(1 << 20),
                                                 part_size=20 * KiB)
        sent = store.log.crcs[key]
        assert len(sent) > 1 and all(given == crc for crc, given in sent)

    @settings(max_examples=100, deadline=None)
    @given(lengths=st.lists(st.integers(1, 3000), min_size=1, max_size=20),
           part_size=st.integers(1, 9000))
    def test_a_parts_crc_is_combined_from_its_blocks(self, lengths: list[int],
                                                     part_size: int) -> None:
        blocks = [Block(b.number, b.offset, (bytes([b.number % 251]) * b.length,),
                       b.length, b.plan, crc32c_of(bytes([b.number % 251]) * b.length))
                  for b in blocks_of(lengths)]
        asm = PartAssembler(part_size)
        parts = asm.add(blocks)
        last = asm.finish()
        for p in [*parts, *([last] if last else [])]:
            assert p.crc32c == crc32c_of(b"".join(p.buffers))
        unstamped = UploadPart(1, 0, 2, tuple(blocks_of([1, 1])))
        assert unstamped.crc32c is None  # a block's CRC not known: none for the part

    async def test_bytes_changed_after_stamping_are_refused_by_the_store(self) -> None:
        from offloadd.format import StreamingObjectBuilder
        from offloadd.model import EntryRun

        data = bytearray(b"".join((900).to_bytes(4, "big") + i.to_bytes(8, "big") + bytes(900)
                                  for i in range(20)))
        run = EntryRun(1, 0, memoryview(data), list(range(0, len(data) + 1, 912)))
        blocks = stamp_blocks(StreamingObjectBuilder(max_block_size=4 * KiB,
                                                    min_block_size=0).add_run(run))
        asm = PartAssembler(8 * KiB)
        parts = asm.add(blocks)
        last = asm.finish()
        part = parts[0] if parts else last
        assert part is not None
        store = MemoryBlobStore()
        upload = await store.start_upload("obj", {})
        data[500] ^= 1  # the buffer changes under the part after its blocks were stamped
        with pytest.raises(Fatal, match="BadDigest"):
            await upload.put_part(part.number, part.offset, part.buffers, crc32c=part.crc32c)
