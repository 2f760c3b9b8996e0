"""The offload buffer's arrays stay warm: a read of an odd size (the rest of a segment or of a
ledger) takes a free array it fills at least a quarter of, instead of a new zero-filled one
(issue 22)."""

from __future__ import annotations

import mmap
import os
from itertools import pairwise
from pathlib import Path

from offloadd.offload.buffer import LEASE_SLACK, MMAP_FROM, OffloadBuffer

MiB = 1024 * 1024


def test_a_shorter_read_reuses_a_free_block_sized_array() -> None:
    buf = OffloadBuffer(256 * MiB)
    block = buf.lease(64)  # stands for a 64 MiB block array: lengths are what count
    buf.give_back(block)
    # the rest of a segment: a little under half a block (the old rule wanted >= half)
    got = buf.lease(31)
    assert got is block and buf.leased == 64


def test_the_smallest_fitting_array_is_taken_and_tiny_reads_get_their_own() -> None:
    buf = OffloadBuffer(256 * MiB)
    big, mid, small = buf.lease(400), buf.lease(150), buf.lease(120)
    for b in (big, mid, small):
        buf.give_back(b)
    assert buf.lease(100) is small
    n = 150 // LEASE_SLACK - 1  # under a quarter of any free array: none is pinned for it
    tiny = buf.lease(n)
    assert tiny is not big and tiny is not mid and len(tiny) == n
    assert buf.lease(400) is big


async def test_a_new_large_array_is_a_mapping_that_reads_land_in(tmp_path: Path) -> None:
    """A new block-sized array is an anonymous mapping (its pages are zero until a read writes
    them: no zero-fill pass of ours), and a source reads into it as into a bytearray."""
    from offloadd.ledger.local import LocalLedgerSource, LocalLedgerWriter
    from offloadd.metadata.memory import MemoryMetadataStore
    from offloadd.model import TopicName
    from offloadd.offload.runs import RunReader

    topic = TopicName.parse("persistent://public/default/mapped")
    metadata = MemoryMetadataStore()
    writer = LocalLedgerWriter(tmp_path, metadata)
    payloads = [os.urandom(64 * 1024) for _ in range(40)]  # 2.5 MiB of frames
    pos = await writer.append(topic, payloads)
    source = LocalLedgerSource(tmp_path, metadata, verify_crc=True)
    buf = OffloadBuffer(256 * MiB)
    assert isinstance(buf.lease(MMAP_FROM), mmap.mmap)  # and a small one stays a bytearray
    assert isinstance(buf.lease(MMAP_FROM - 1), bytearray)
    reader = RunReader(source, buf, topic)
    run = await reader.read(pos.ledger_id, 0, pos.entry_id, 4 * MiB)
    assert isinstance(run.entries.data.obj, mmap.mmap)
    got = [bytes(run.entries.data[a + 12:b]) for a, b in pairwise(run.entries.offsets)]
    assert got == payloads
    array = run.entries.data.obj
    run.release()
    del run, got
    again = await reader.read(pos.ledger_id, 0, pos.entry_id, 4 * MiB)
    assert again.entries.data.obj is array  # given back, and taken again warm
    again.release()
    await writer.close()
