"""The segment state machine, alone: every legal transition, the illegal ones refused."""

from __future__ import annotations

import uuid

import pytest

from offloadd._proto import mldataformats_pb2 as pb
from offloadd.errors import OffloaddError, Retriable
from offloadd.model import catalog
from offloadd.model.catalog import LedgerRange
from offloadd.model.segment_state import (
    IllegalTransition,
    SegmentState,
    Tracked,
    advance,
    is_valid,
    move_all,
    stored,
)


class TestStateMachine:
    """Every legal transition, and the illegal ones refused."""

    def test_the_happy_path_and_the_retry_loop(self) -> None:
        s = advance(SegmentState.ASSIGNED, SegmentState.FAILED)
        s = advance(s, SegmentState.ASSIGNED)
        s = advance(s, SegmentState.OFFLOADED)
        assert advance(s, SegmentState.DELETED) is SegmentState.DELETED

    def test_illegal_transitions_are_refused(self) -> None:
        assert not is_valid(SegmentState.OFFLOADED, SegmentState.ASSIGNED)
        with pytest.raises(IllegalTransition):
            advance(SegmentState.DELETED, SegmentState.OFFLOADED)
        with pytest.raises(IllegalTransition):
            advance(SegmentState.OFFLOADED, SegmentState.FAILED)

    def test_self_transitions_allow_idempotent_retries(self) -> None:
        assert all(is_valid(s, s) for s in SegmentState)

    def test_a_new_attempt_is_assigned_or_fails_before_it_is_recorded(self) -> None:
        assert advance(SegmentState.NEW, SegmentState.ASSIGNED) is SegmentState.ASSIGNED
        assert advance(SegmentState.NEW, SegmentState.FAILED) is SegmentState.FAILED
        for never in (SegmentState.OFFLOADED, SegmentState.DELETED):
            with pytest.raises(IllegalTransition):
                advance(SegmentState.NEW, never)

    def test_nothing_goes_back_to_new_or_leaves_deleted(self) -> None:
        assert not any(is_valid(s, SegmentState.NEW) for s in SegmentState
                       if s is not SegmentState.NEW)
        assert [s for s in SegmentState if is_valid(SegmentState.DELETED, s)] == [
            SegmentState.DELETED]

    def test_a_merge_replaces_offloaded_segments_which_gc_deletes_later(self) -> None:
        assert advance(SegmentState.OFFLOADED, SegmentState.MERGED) is SegmentState.MERGED
        assert advance(SegmentState.MERGED, SegmentState.DELETED) is SegmentState.DELETED
        for src in (SegmentState.NEW, SegmentState.ASSIGNED, SegmentState.FAILED,
                    SegmentState.DELETED):
            assert not is_valid(src, SegmentState.MERGED)  # only committed data is merged
        assert [s for s in SegmentState if is_valid(SegmentState.MERGED, s)] == [
            SegmentState.DELETED, SegmentState.MERGED]

    def test_what_the_catalog_stores_is_assigned_or_offloaded(self) -> None:
        assert stored(False) is SegmentState.ASSIGNED
        assert stored(True) is SegmentState.OFFLOADED

    def test_a_tracked_segment_moves_only_along_the_table(self) -> None:
        assert Tracked().state is SegmentState.NEW
        seg = Tracked()
        seg.to(SegmentState.ASSIGNED)
        with pytest.raises(IllegalTransition):
            seg.to(SegmentState.DELETED)
        assert seg.state is SegmentState.ASSIGNED  # a refused move changes nothing
        seg.to(SegmentState.OFFLOADED)
        assert seg.to(SegmentState.DELETED) is SegmentState.DELETED


class TestWhereTheStateLives:
    """The catalog's edits check the stored state; a process's view moves only with its write."""

    def test_an_illegal_change_is_an_offloadd_error(self) -> None:
        # so a topic's attempt fails and is retried (failing), never the process (stopped)
        assert issubclass(IllegalTransition, OffloaddError)

    def test_an_offloaded_segment_is_not_redone_or_reassigned(self) -> None:
        info, uid = _one_segment(complete=True)
        with pytest.raises(IllegalTransition, match="offloaded to assigned"):
            catalog.reassign(info, uid, uuid.uuid4(), 2)
        with pytest.raises(IllegalTransition, match="offloaded to assigned"):
            catalog.add_assigned(info, uid, [LedgerRange(1, 5, 9)], 2, pb.OffloadDriverMetadata())

    def test_only_committed_segments_are_merged(self) -> None:
        info = pb.ManagedLedgerInfo()
        li = info.ledgerInfo.add(ledgerId=1, entries=10, size=100)
        a, b = uuid.uuid4(), uuid.uuid4()
        catalog.add_assigned(info, a, [LedgerRange(1, 0, 4)], 1, pb.OffloadDriverMetadata())
        catalog.mark_offloaded(info, a, 2)
        catalog.add_assigned(info, b, [LedgerRange(1, 5, 9)], 1, pb.OffloadDriverMetadata())
        assert len(li.offloadContext.offloadSegment) == 2
        with pytest.raises(IllegalTransition, match="assigned to merged"):
            catalog.merge_segments(info, catalog.segments(info), uuid.uuid4(), 3)

    def test_a_ledger_offloaded_whole_is_not_assigned_again(self) -> None:
        info = pb.ManagedLedgerInfo()
        info.ledgerInfo.add(ledgerId=7, entries=3, size=30)
        uid = uuid.uuid4()
        catalog.assign_ledger(info, 7, uid, 1, pb.OffloadDriverMetadata())
        catalog.complete_ledger(info, 7, uid, 2)
        with pytest.raises(IllegalTransition):
            catalog.assign_ledger(info, 7, uuid.uuid4(), 3, pb.OffloadDriverMetadata())

    async def test_a_move_follows_its_write_and_nothing_else(self) -> None:
        segs = [Tracked(), Tracked(SegmentState.FAILED)]
        writes: list[str] = []

        async def failing() -> None:
            writes.append("tried")
            raise Retriable("the store went away")

        with pytest.raises(Retriable):
            await move_all(segs, SegmentState.ASSIGNED, failing)
        assert [s.state for s in segs] == [SegmentState.NEW, SegmentState.FAILED]

        async def ok() -> str:
            writes.append("written")
            return "stored"

        assert await move_all(segs, SegmentState.ASSIGNED, ok) == "stored"
        assert [s.state for s in segs] == [SegmentState.ASSIGNED] * 2
        done = Tracked(SegmentState.DELETED)
        with pytest.raises(IllegalTransition):
            await done.move(SegmentState.ASSIGNED, ok)
        assert writes == ["tried", "written"]  # the illegal move wrote nothing


def _one_segment(*, complete: bool) -> tuple[pb.ManagedLedgerInfo, uuid.UUID]:
    info = pb.ManagedLedgerInfo()
    info.ledgerInfo.add(ledgerId=1, entries=10, size=100)
    uid = uuid.uuid4()
    catalog.add_assigned(info, uid, [LedgerRange(1, 0, 4)], 1, pb.OffloadDriverMetadata())
    if complete:
        catalog.mark_offloaded(info, uid, 2)
    return info, uid
