"""Issue 22, "memory follows data": the read arrays catching up pooled are given back once the
offload buffer has been quiet for a while, not kept resident for ever."""

from __future__ import annotations

import pytest

from offloadd.offload.buffer import OffloadBuffer
from offloadd.shell.memtrim import MemoryTrim

pytestmark = pytest.mark.timeout(30)


async def test_pooled_arrays_are_dropped_once_the_buffer_is_quiet() -> None:
    now = [0.0]
    buf = OffloadBuffer(1 << 20)
    trim = MemoryTrim(buf, quiet_s=10.0, clock=lambda: now[0])
    await buf.reserve(4096)
    arrays = [buf.lease(4096), buf.lease(4096)]
    assert not trim.due()
    buf.release(4096)
    for a in arrays:
        buf.give_back(a)
    assert buf.pooled == 8192  # catching up leaves arrays in the pool
    assert not trim.due()  # it just moved
    now[0] += 9.0
    assert not trim.due()  # not quiet long enough
    now[0] += 2.0
    assert trim.due()
    assert buf.pooled == 0
    now[0] += 60.0
    assert not trim.due()  # the same quiet spell: trimmed once
    # traffic refills the pool as before, and a read is served from it
    again = buf.lease(4096)
    buf.give_back(again)
    assert buf.lease(4096) is again


async def test_a_busy_buffer_keeps_its_pool() -> None:
    now = [0.0]
    buf = OffloadBuffer(1 << 20)
    buf.give_back(bytearray(4096))
    trim = MemoryTrim(buf, quiet_s=10.0, clock=lambda: now[0])
    for _ in range(5):
        now[0] += 5.0
        buf.give_back(buf.lease(4096))  # in use between passes (leased count moves)
        await buf.reserve(1)  # and bytes taken: the buffer is busy
        assert not trim.due()
    assert buf.pooled == 4096


async def test_every_quiet_spell_is_trimmed_once_even_with_nothing_pooled() -> None:
    """What catching up leaves in the C allocator is not in the pool: an idle daemon whose
    pool is empty (copied short reads, a capped pool) trims all the same, once a spell."""
    now = [0.0]
    buf = OffloadBuffer(1 << 20)
    trim = MemoryTrim(buf, quiet_s=10.0, clock=lambda: now[0])
    for _ in range(2):  # two spells of traffic, each followed by quiet
        await buf.reserve(4096)
        buf.release(4096)
        assert buf.pooled == 0
        assert not trim.due()  # it just moved
        now[0] += 11.0
        assert trim.due()  # quiet: trim, nothing pooled or not
        now[0] += 60.0
        assert not trim.due()  # once per spell
