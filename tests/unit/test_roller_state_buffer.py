"""Pure pieces of the pipeline: roll decisions, the segment state machine, the buffer."""

from __future__ import annotations

import asyncio

import pytest

from offloadd.commit.state import IllegalTransition, SegmentState, is_valid, transition
from offloadd.offload import roller
from offloadd.offload.buffer import OffloadBuffer
from offloadd.offload.roller import RollPolicy, RollReason

POL = RollPolicy(max_bytes=10_000, max_age_s=60, max_block_size=1_000)


class TestRoller:
    """Segments close by size, age or trigger; reads are sized to fill a block."""

    def test_no_open_segment_or_an_empty_one_never_rolls(self) -> None:
        assert roller.roll_reason(POL, 0, None, 1e9, True) is None
        assert roller.roll_reason(POL, 0, 0.0, 1e9, True) is None

    def test_trigger_size_and_age_each_roll(self) -> None:
        assert roller.roll_reason(POL, 1, 0.0, 1.0, True) is RollReason.MANUAL
        assert roller.roll_reason(POL, 10_000, 0.0, 1.0, False) is RollReason.SIZE
        assert roller.roll_reason(POL, 1, 0.0, 60.0, False) is RollReason.TIME
        assert roller.roll_reason(POL, 1, 0.0, 59.9, False) is None

    def test_reads_never_pass_the_block_or_the_segment_budget(self) -> None:
        assert roller.read_budget(POL, 0) == 1_000 - 132
        assert roller.read_budget(POL, 9_900) == 100
        assert roller.read_budget(POL, 10_000) == 1

    def test_a_partial_block_is_read_only_when_it_must_be(self) -> None:
        kw = dict(seg_bytes=0, avail_entries=2, avail_payload=100)
        assert not roller.should_read(POL, **kw, ledger_closed=False, closing=False)
        assert roller.should_read(POL, **kw, ledger_closed=True, closing=False)
        assert roller.should_read(POL, **kw, ledger_closed=False, closing=True)
        assert roller.should_read(POL, seg_bytes=0, avail_entries=80, avail_payload=800,
                                  ledger_closed=False, closing=False)
        assert not roller.should_read(POL, seg_bytes=0, avail_entries=0, avail_payload=0,
                                      ledger_closed=True, closing=True)


class TestStateMachine:
    """Every legal transition, and the illegal ones refused."""

    def test_the_happy_path_and_the_retry_loop(self) -> None:
        s = transition(SegmentState.ASSIGNED, SegmentState.FAILED)
        s = transition(s, SegmentState.ASSIGNED)
        s = transition(s, SegmentState.OFFLOADED)
        assert transition(s, SegmentState.DELETED) is SegmentState.DELETED

    def test_illegal_transitions_are_refused(self) -> None:
        assert not is_valid(SegmentState.OFFLOADED, SegmentState.ASSIGNED)
        with pytest.raises(IllegalTransition):
            transition(SegmentState.DELETED, SegmentState.OFFLOADED)
        with pytest.raises(IllegalTransition):
            transition(SegmentState.OFFLOADED, SegmentState.FAILED)

    def test_self_transitions_allow_idempotent_retries(self) -> None:
        assert all(is_valid(s, s) for s in SegmentState)


class TestBuffer:
    """Reservations wait FIFO for room; an oversize request passes when the buffer is empty."""

    async def test_reservations_wait_for_room_in_order(self) -> None:
        buf = OffloadBuffer(100)
        await buf.reserve(80)
        order: list[int] = []

        async def want(n: int) -> None:
            await buf.reserve(n)
            order.append(n)

        t1 = asyncio.create_task(want(30))
        t2 = asyncio.create_task(want(10))  # fits, but must not overtake the first waiter
        await asyncio.sleep(0.01)
        assert order == []
        buf.release(80)
        await asyncio.wait_for(asyncio.gather(t1, t2), 1)
        assert order == [30, 10] and buf.used == 40

    async def test_an_oversize_request_is_admitted_into_an_empty_buffer(self) -> None:
        buf = OffloadBuffer(100)
        await asyncio.wait_for(buf.reserve(250), 1)
        assert buf.used == 250 and buf.high_water == 250

    async def test_a_cancelled_waiter_gives_way(self) -> None:
        buf = OffloadBuffer(100)
        await buf.reserve(100)
        t = asyncio.create_task(buf.reserve(50))
        await asyncio.sleep(0.01)
        t.cancel()
        await asyncio.gather(t, return_exceptions=True)
        buf.release(100)
        assert buf.used == 0 and buf.try_reserve(100)
