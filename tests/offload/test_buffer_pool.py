"""The offload buffer's arrays stay warm: a read of an odd size (the rest of a segment or of a
ledger) takes a free array it fills at least a quarter of, instead of a new zero-filled one
(issue 22)."""

from __future__ import annotations

from offloadd.offload.buffer import LEASE_SLACK, OffloadBuffer

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
