"""The roller: roll reasons, read sizes, and one turn of the streaming loop on a fake clock."""

from __future__ import annotations

import pytest

from offloadd.model import LedgerDesc, LedgerState, Position
from offloadd.offload import roller
from offloadd.offload.roller import Action, Decision, OpenSegment, RollPolicy, RollReason

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


# ---- one turn of the streaming loop, on a fake clock --------------------------------------------
#
#   ledger 1 (closed) 0 .. 9        ledger 2 (open)   0 .. 4 readable
#   ├────────────────────────┤      ├──────────────┤
#   segment open since t=0, holding 1:0 .. 1:9 (frames: 5_000 bytes)

ENTRY = 100  # payload bytes per entry: 112 frame bytes


def ledger(lid: int, last: int, closed: bool) -> LedgerDesc:
    return LedgerDesc(lid, LedgerState.CLOSED if closed else LedgerState.OPEN, last,
                      (last + 1) * ENTRY, 1_000)


LEDGERS = [ledger(1, 9, True), ledger(2, 4, False)]
OPEN = OpenSegment(frame_bytes=5_000, opened_at=0.0, end=Position(1, 9), close_target=None)


def decide(now: float, *, segment: OpenSegment | None = OPEN, pos: Position | None = None,
           manual: bool = False, stopping: bool = False, pending_since: float | None = None,
           ledgers: list[LedgerDesc] = LEDGERS, bytes_before: int | None = None) -> Decision:
    pos = pos or Position(2, 0)
    desc = next((d for d in ledgers if d.ledger_id == pos.ledger_id), None)
    return roller.decide(POL, now=now, ledgers=ledgers, pos=pos, desc=desc, segment=segment,
                         pending_since=pending_since, manual=manual, stopping=stopping,
                         bytes_before=bytes_before, idle_poll_s=1.0)


class TestDecide:
    """What the streaming loop does next, from what it knows and the clock's now alone."""

    def test_a_young_segment_waits_for_a_full_block_in_an_open_ledger(self) -> None:
        d = decide(10.0, bytes_before=0)  # 5 entries readable: far less than a block
        assert (d.action, d.close_target) == (Action.WAIT, None)
        assert d.wait_s == 1.0  # the idle poll, well before the segment's age is up

    def test_the_wait_never_outlasts_the_segments_age(self) -> None:
        assert decide(59.5, bytes_before=0).wait_s == pytest.approx(0.5)

    def test_at_its_age_the_segment_closes_at_the_tail_as_it_is_now(self) -> None:
        d = decide(60.0, bytes_before=0)
        # the roll reads the rest up to the tail it saw (2:4), then closes
        assert (d.action, d.close_target, d.entries) == (Action.READ, Position(2, 4), 5)
        after = decide(61.0, segment=OpenSegment(5_560, 0.0, Position(2, 4), Position(2, 4)),
                       pos=Position(2, 5),
                       ledgers=[LEDGERS[0], ledger(2, 9, False)])  # 5 more came meanwhile
        assert (after.action, after.close_target) == (Action.CLOSE, Position(2, 4))

    def test_a_full_segment_closes_at_what_it_holds(self) -> None:
        d = decide(1.0, segment=OpenSegment(10_000, 0.0, Position(1, 9), None))
        assert (d.action, d.close_target) == (Action.CLOSE, Position(1, 9))

    def test_a_trigger_closes_at_the_tail_and_is_used_up(self) -> None:
        d = decide(1.0, manual=True)
        assert (d.action, d.close_target, d.trigger_used) == (Action.READ, Position(2, 4), True)

    def test_a_trigger_with_nothing_to_offload_is_a_no_op(self) -> None:
        d = decide(1.0, segment=None, pos=Position(2, 5), manual=True)
        assert (d.action, d.trigger_used, d.pending_since) == (Action.WAIT, True, None)

    def test_the_next_segments_age_counts_from_its_first_readable_entry(self) -> None:
        first = decide(100.0, segment=None, bytes_before=0)
        assert (first.action, first.pending_since) == (Action.WAIT, 100.0)
        late = decide(160.0, segment=None, pending_since=first.pending_since, bytes_before=0)
        assert (late.action, late.entries) == (Action.READ, 5)  # overdue: a partial block

    def test_stopping_closes_a_segment_that_holds_entries_and_stops_without_one(self) -> None:
        d = decide(1.0, stopping=True)
        assert (d.action, d.close_target) == (Action.CLOSE, Position(1, 9))
        assert decide(1.0, segment=None, stopping=True).action is Action.STOP


class TestNormalise:
    """The position moves over ended and vanished ledgers, reporting what vanished."""

    def test_past_a_closed_ledger_the_position_moves_to_the_next(self) -> None:
        pos, desc, lost = roller.normalise(LEDGERS, Position(1, 10))
        assert (pos, desc, lost) == (Position(2, 0), LEDGERS[1], [])

    def test_a_vanished_ledger_is_skipped_and_reported(self) -> None:
        pos, desc, lost = roller.normalise(LEDGERS[1:], Position(1, 3))
        assert (pos, desc, lost) == (Position(2, 0), LEDGERS[1], [Position(1, 3)])

    def test_no_position_yet_starts_at_the_first_ledger(self) -> None:
        assert roller.normalise(LEDGERS, None)[0] == Position(1, 0)
