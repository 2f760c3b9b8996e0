"""Which blocks must carry a checksum is recorded in the index's own bytes, so it survives the
loss of the objects' user metadata; without any record (Pulsar's own objects, or offloadd's older
ones whose metadata was lost), an object some of whose blocks carry the mark and one does not is
refused, never read with that one block unchecked."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

import offloadd.format as fmt
from offloadd.blobstore.memory import MemoryBlobStore
from offloadd.errors import FormatError
from offloadd.format.checksum import CHECKSUM_OFFSET
from offloadd.ledger.local import RolloverPolicy
from offloadd.model.catalog import Segment
from offloadd.model.keys import streaming_data_key, streaming_index_key
from offloadd.offload.context import OffloadMode
from offloadd.offload.roller import RollPolicy
from offloadd.read.reader import TierReader
from tests.offload.test_pipeline import TOPIC, Rig, stop, until
from tests.read.support import offload_one_segment

pytestmark = pytest.mark.timeout(60)

KiB = 1024


# ---- the record in the index bytes ----------------------------------------------------------
def test_a_streaming_index_records_checksums_in_a_field_pulsar_parses() -> None:
    from offloadd._proto.mldataformats_pb2 import ManagedLedgerInfo
    from offloadd.format._index import IndexEntry

    sections = [fmt.SectionInput(7, 10, 100, 0, [IndexEntry(0, 1, 0)]),
                fmt.SectionInput(8, 5, 50, 0, [IndexEntry(0, 2, 300)])]
    plain = fmt.decode_index(fmt.encode_streaming_index(600, sections), "idx")
    marked = fmt.decode_index(fmt.encode_streaming_index(600, sections, checksummed=True), "idx")
    assert isinstance(plain, fmt.StreamingIndex) and isinstance(marked, fmt.StreamingIndex)
    assert not plain.records_checksums and marked.records_checksums
    for s in marked.sections:  # what Pulsar does with the bytes: parse, build (required fields)
        info = ManagedLedgerInfo.LedgerInfo.FromString(s.ledger_info)
        assert info.IsInitialized() and (info.ledgerId, info.entries) == (s.ledger_id, s.entries)
    assert [(s.entries, s.size, s.blocks) for s in marked.sections] == \
        [(s.entries, s.size, s.blocks) for s in plain.sections]


def test_a_ledger_index_records_checksums_in_the_custom_metadata() -> None:
    from offloadd.format._index import IndexEntry

    def index(custom: dict[str, bytes | str]) -> fmt.LedgerIndex:
        meta = fmt.build_ledger_metadata(last_entry_id=3, length=40, custom_metadata=custom)
        idx = fmt.decode_index(fmt.encode_ledger_index(500, meta, [IndexEntry(0, 1, 0)]), "idx")
        assert isinstance(idx, fmt.LedgerIndex)
        return idx

    assert not index({"application": b"pulsar"}).records_checksums
    assert index({"offloadd-block-checksum": "crc32c"}).records_checksums


# ---- objects without any record ---------------------------------------------------------------
async def offloaded(tmp: Path) -> tuple[Rig, Segment]:
    """One segment of 8 blocks (4 KiB blocks, one ledger) in a memory store."""
    rig = Rig(tmp, RolloverPolicy(max_entries=100_000), RollPolicy(1 << 20, 600, 4 * KiB))
    await rig.write(28)
    return rig, await offload_one_segment(rig)


def forget_records(blob: MemoryBlobStore, seg: Segment) -> fmt.StreamingIndex:
    """Both objects without user metadata, the index re-encoded without its record: a pair
    as Pulsar writes it, or offloadd's older one whose metadata was lost."""
    ikey, dkey = streaming_index_key(seg.uid), streaming_data_key(seg.uid)
    idx = fmt.decode_index(blob.objects[ikey].data, ikey)
    assert isinstance(idx, fmt.StreamingIndex) and idx.records_checksums
    raw = fmt.encode_streaming_index(idx.data_object_length, [
        fmt.SectionInput(s.ledger_id, s.entries, s.size, s.timestamp, s.blocks)
        for s in idx.sections])
    blob.objects[ikey] = dataclasses.replace(blob.objects[ikey], data=raw, metadata={})
    blob.objects[dkey] = dataclasses.replace(blob.objects[dkey], metadata={})
    return idx


def rot(blob: MemoryBlobStore, key: str, *at: int) -> None:
    data = bytearray(blob.objects[key].data)
    for i in at:
        data[i] ^= 0xFF
    blob.objects[key] = dataclasses.replace(blob.objects[key], data=bytes(data))


async def read(rig: Rig, seg: Segment) -> list[bytes]:
    return [bytes(e.payload) async for e in TierReader(rig.metadata, rig.blob).read_segment(seg)]


async def test_without_metadata_the_index_record_keeps_the_check(tmp_path: Path) -> None:
    rig, seg = await offloaded(tmp_path)
    blob = rig.blob
    assert isinstance(blob, MemoryBlobStore)
    key = streaming_data_key(seg.uid)
    for k in (key, streaming_index_key(seg.uid)):
        blob.objects[k] = dataclasses.replace(blob.objects[k], metadata={})
    assert await read(rig, seg) == rig.payloads
    block = fmt.decode_index(blob.objects[streaming_index_key(seg.uid)].data, "i")
    assert isinstance(block, fmt.StreamingIndex)
    at = block.sections[0].blocks[2].offset
    rot(blob, key, at + CHECKSUM_OFFSET, at + 128 + 12 + 3)  # the mark and a payload byte
    with pytest.raises(FormatError, match=r"\(block 3 at byte \d+\) at byte 36: block "
                                          "checksum mark damaged"):
        await read(rig, seg)


async def test_one_unmarked_block_among_marked_ones_is_refused(tmp_path: Path) -> None:
    rig, seg = await offloaded(tmp_path)
    blob = rig.blob
    assert isinstance(blob, MemoryBlobStore)
    idx = forget_records(blob, seg)
    blocks = idx.sections[0].blocks
    assert len(blocks) >= 4
    assert await read(rig, seg) == rig.payloads  # all marked: checked, read
    at = blocks[2].offset
    key = streaming_data_key(seg.uid)
    rot(blob, key, at + CHECKSUM_OFFSET, at + 128 + 12 + 3)
    got: list[bytes] = []

    async def consume() -> None:
        async for e in TierReader(rig.metadata, blob).read_segment(seg):
            got.append(bytes(e.payload))

    with pytest.raises(FormatError, match=r"\(block 3 at byte \d+\) at byte 36: block checksum "
                                          "mark damaged: block 3 lacks the mark"):
        await consume()
    assert got == []  # one ranged read holds every block: refused before any entry


async def test_an_object_without_marks_reads_unchecked_as_pulsar_s_own(tmp_path: Path) -> None:
    rig, seg = await offloaded(tmp_path)
    blob = rig.blob
    assert isinstance(blob, MemoryBlobStore)
    idx = forget_records(blob, seg)
    key = streaming_data_key(seg.uid)
    data = bytearray(blob.objects[key].data)
    for b in idx.sections[0].blocks:  # no block carries the mark, as Pulsar writes them
        data[b.offset + CHECKSUM_OFFSET:b.offset + CHECKSUM_OFFSET + 8] = bytes(8)
    blob.objects[key] = dataclasses.replace(blob.objects[key], data=bytes(data))
    assert await read(rig, seg) == rig.payloads


async def test_verify_reports_a_ledger_object_without_its_metadata(tmp_path: Path) -> None:
    """Ledger-based pairs too: the index records the checksum (the ledger metadata's custom
    metadata), and verify names an object whose user metadata is gone."""
    from offloadd import wiring
    from offloadd.read.verify import verify

    rig = Rig(tmp_path, RolloverPolicy(max_entries=9), RollPolicy(1 << 20, 600, 4 * KiB))
    rig.mode = OffloadMode.LEDGER
    await rig.write(20)
    off = rig.offloader()
    task = asyncio.create_task(off.run())

    async def two() -> bool:
        return sum(s.complete for s in await rig.segments()) >= 2

    await until(two)
    await stop(task, off)
    await rig.verify_ok()
    blob = rig.blob
    assert isinstance(blob, MemoryBlobStore)
    seg = next(s for s in await rig.segments() if s.complete)
    ikey = f"{seg.uid}-ledger-{seg.ranges[0].ledger_id}-index"
    idx = await TierReader(rig.metadata, blob).index(ikey)
    assert isinstance(idx, fmt.LedgerIndex) and idx.records_checksums
    blob.objects[ikey] = dataclasses.replace(blob.objects[ikey], metadata={})
    rep = await verify(rig.metadata, blob, wiring.local_view(rig.store.source),
                       [TOPIC], grace_s=0)
    assert not rep.ok
    assert any(e.startswith(f"{ikey}: its user metadata is missing") for t in rep.topics
               for e in t.errors), rep.to_json()
