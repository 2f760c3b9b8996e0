"""The segment state machine, alone: every legal transition, the illegal ones refused."""

from __future__ import annotations

import pytest

from offloadd.commit.state import (
    IllegalTransition,
    SegmentState,
    Tracked,
    is_valid,
    stored,
    transition,
)


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

    def test_a_new_attempt_is_assigned_or_fails_before_it_is_recorded(self) -> None:
        assert transition(SegmentState.NEW, SegmentState.ASSIGNED) is SegmentState.ASSIGNED
        assert transition(SegmentState.NEW, SegmentState.FAILED) is SegmentState.FAILED
        for never in (SegmentState.OFFLOADED, SegmentState.DELETED):
            with pytest.raises(IllegalTransition):
                transition(SegmentState.NEW, never)

    def test_nothing_goes_back_to_new_or_leaves_deleted(self) -> None:
        assert not any(is_valid(s, SegmentState.NEW) for s in SegmentState
                       if s is not SegmentState.NEW)
        assert [s for s in SegmentState if is_valid(SegmentState.DELETED, s)] == [
            SegmentState.DELETED]

    def test_a_merge_replaces_offloaded_segments_which_gc_deletes_later(self) -> None:
        assert transition(SegmentState.OFFLOADED, SegmentState.MERGED) is SegmentState.MERGED
        assert transition(SegmentState.MERGED, SegmentState.DELETED) is SegmentState.DELETED
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
