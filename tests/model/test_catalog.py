"""The segment catalog derived from ManagedLedgerInfo: pure edits and reads."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from offloadd._proto import mldataformats_pb2 as pb
from offloadd.model import Position, catalog
from offloadd.model.catalog import LedgerRange
from offloadd.model.keys import msb_lsb_to_uuid, uuid_to_msb_lsb

DRIVER = catalog.driver_metadata("filesystem", {"managedLedgerOffloadDriver": "filesystem"})


def info_with(ledgers: dict[int, int | None]) -> pb.ManagedLedgerInfo:
    info = pb.ManagedLedgerInfo()
    for lid, n in ledgers.items():
        li = info.ledgerInfo.add(ledgerId=lid)
        if n is not None:
            li.entries = n
    return info


class TestSegmentsFromRecords:
    """A segment is one OffloadSegment per ledger it touches; begins are implicit."""

    def test_a_segment_spanning_ledgers_reads_back_with_its_ranges(self) -> None:
        info = info_with({3: 10, 5: 4, 9: None})
        uid = uuid.uuid4()
        ranges = (LedgerRange(3, 0, 9), LedgerRange(5, 0, 3), LedgerRange(9, 0, 6))
        catalog.add_assigned(info, uid, ranges, 1000, DRIVER)
        (seg,) = catalog.segments(info)
        assert seg.uid == uid and seg.ranges == ranges and not seg.complete
        assert seg.begin == Position(3, 0) and seg.end == Position(9, 6)
        catalog.mark_offloaded(info, uid, 2000)
        (seg,) = catalog.segments(info)
        assert seg.complete and seg.offloaded_ms == 2000 and seg.driver == "filesystem"
        assert catalog.next_position(info) == Position(9, 7)

    def test_segments_inside_one_ledger_continue_where_the_last_ended(self) -> None:
        info = info_with({1: None})
        a, b = uuid.uuid4(), uuid.uuid4()
        catalog.add_assigned(info, a, [LedgerRange(1, 0, 99)], 1, DRIVER)
        catalog.add_assigned(info, b, [LedgerRange(1, 100, 150)], 2, DRIVER)
        segs = catalog.segments(info)
        assert [s.uid for s in segs] == [a, b]
        assert segs[1].ranges == (LedgerRange(1, 100, 150),)

    def test_a_range_that_would_leave_a_gap_or_overlap_is_refused(self) -> None:
        info = info_with({1: None})
        catalog.add_assigned(info, uuid.uuid4(), [LedgerRange(1, 0, 9)], 1, DRIVER)
        with pytest.raises(ValueError, match="continues at entry 10"):
            catalog.add_assigned(info, uuid.uuid4(), [LedgerRange(1, 11, 20)], 1, DRIVER)
        with pytest.raises(ValueError, match="continues at entry 10"):
            catalog.add_assigned(info, uuid.uuid4(), [LedgerRange(1, 5, 20)], 1, DRIVER)

    def test_removing_an_abandoned_attempt_leaves_the_others(self) -> None:
        info = info_with({1: None, 2: None})
        a, b = uuid.uuid4(), uuid.uuid4()
        catalog.add_assigned(info, a, [LedgerRange(1, 0, 9)], 1, DRIVER)
        catalog.mark_offloaded(info, a, 2)
        catalog.add_assigned(info, b, [LedgerRange(1, 10, 12), LedgerRange(2, 0, 3)], 3, DRIVER)
        assert catalog.remove_segment(info, b)
        assert [s.uid for s in catalog.segments(info)] == [a]
        assert catalog.next_position(info) == Position(1, 10)
        assert not catalog.remove_segment(info, b)

    def test_a_ledger_offloaded_whole_counts_as_a_ledger_segment(self) -> None:
        info = info_with({4: 7})
        uid = uuid.uuid4()
        ctx = info.ledgerInfo[0].offloadContext
        ctx.uidMsb, ctx.uidLsb = uuid_to_msb_lsb(uid)
        ctx.complete = True
        (seg,) = catalog.segments(info)
        assert seg.kind is catalog.SegmentKind.LEDGER and seg.ranges == (LedgerRange(4, 0, 6),)

    def test_without_segments_offload_starts_at_the_first_ledger(self) -> None:
        assert catalog.next_position(info_with({7: 3, 8: None})) == Position(7, 0)
        assert catalog.next_position(pb.ManagedLedgerInfo()) is None


@given(st.uuids())
def test_uuid_halves_round_trip_as_signed_int64(uid: uuid.UUID) -> None:
    msb, lsb = uuid_to_msb_lsb(uid)
    assert -(2**63) <= msb < 2**63 and -(2**63) <= lsb < 2**63
    assert msb_lsb_to_uuid(msb, lsb) == uid
