"""The daemon's read-back check (``read/check.py``, ``TierReader.check_segment``) on blocks of the
sizes production writes: blocks are up to 64 MiB while the check fetches only the head of the
last one, so a block longer than the fetched head is the normal case, not a truncated block."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from offloadd.blobstore.memory import MemoryBlobStore
from offloadd.errors import FormatError
from offloadd.ledger.local import RolloverPolicy
from offloadd.model.catalog import Segment
from offloadd.model.keys import streaming_data_key, streaming_index_key
from offloadd.offload.roller import RollPolicy
from offloadd.read.check import read_back
from offloadd.read.reader import TierReader
from tests.offload.test_pipeline import TOPIC, Rig
from tests.read.support import offload_one_segment

pytestmark = pytest.mark.timeout(120)

MiB = 1 << 20


class Errors:
    """A read probe that counts what the reader reports."""

    def __init__(self) -> None:
        self.errors = 0
        self.data_reads = 0
        self.rereads = 0

    def index_read(self, seconds: float) -> None: pass
    def data_read(self, seconds: float) -> None: self.data_reads += 1
    def read_offload(self, nbytes: int) -> None: pass
    def read_error(self) -> None: self.errors += 1
    def reread(self) -> None: self.rereads += 1


async def offload_one_big_block(tmp: Path) -> tuple[Rig, Segment]:
    """One committed segment of ~3 MiB in one block (the default 64 MiB block size)."""
    rig = Rig(tmp, RolloverPolicy(max_entries=100_000),
              RollPolicy(256 * MiB, 600, 64 * MiB), buffer_cap=64 * MiB)
    await rig.write(3 * 1024, size=1024)
    return rig, await offload_one_segment(rig, timeout=60)


async def test_check_of_a_multi_mib_block_reads_only_its_head_and_passes(tmp_path: Path
                                                                         ) -> None:
    rig, seg = await offload_one_big_block(tmp_path)
    idx = await TierReader(rig.metadata, rig.blob).index(streaming_index_key(seg.uid))
    data_len = idx.data_object_length
    assert data_len > 3 * MiB  # one block, far longer than the 64 KiB the check fetches
    probe = Errors()
    assert await read_back(rig.metadata, rig.blob, TOPIC, probe) == seg
    assert probe.errors == 0 and probe.data_reads == 1
    assert await rig.read_back() == rig.payloads
    await rig.verify_ok()


async def test_check_still_refuses_a_head_that_disagrees_with_the_index(tmp_path: Path) -> None:
    """The head-only parse keeps the checks a head can support: the block length against the
    index (here one byte off)."""
    rig, seg = await offload_one_big_block(tmp_path)
    blob = rig.blob
    assert isinstance(blob, MemoryBlobStore)
    obj = blob.objects[streaming_data_key(seg.uid)]
    data = bytearray(obj.data)
    data[19] ^= 0x01  # the low byte of the header's block length
    blob.objects[streaming_data_key(seg.uid)] = dataclasses.replace(obj, data=bytes(data))
    probe = Errors()
    with pytest.raises(FormatError, match="disagrees with the index"):
        await TierReader(rig.metadata, blob, probe=probe).check_segment(seg)
    # read again once, the same bytes came back: the stored block is what is wrong
    assert (probe.errors, probe.rereads) == (1, 1)
