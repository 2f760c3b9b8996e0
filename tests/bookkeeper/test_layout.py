"""BookKeeper's metadata layout and the mirror edit (pure)."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from offloadd._proto import mldataformats_pb2 as mlpb
from offloadd.errors import FormatError
from offloadd.ledger.bookkeeper.layout import (
    HIERARCHICAL_FACTORY,
    LedgerMetadata,
    LedgerStateBK,
    PulsarLedger,
    PulsarList,
    check_layout,
    decode_ledger_metadata,
    ledger_id_from_path,
    ledger_path,
    lost_ledgers,
    mirror_edit,
    mirrored_list,
    write_set,
)
from offloadd.model import catalog
from offloadd.model.catalog import LedgerRange
from tests.fixtures.bookie_wire import encode_ledger_metadata


class TestLedgerPaths:
    """Hierarchical paths: 10 digits split 2-4-4 below 2^31-1, else 19 digits 3-4-4-4-4."""

    @pytest.mark.parametrize(("ledger_id", "path"), [
        (0, "/ledgers/00/0000/L0000"),
        (1234567, "/ledgers/00/0123/L4567"),
        (2**31 - 2, "/ledgers/21/4748/L3646"),
        (2**31 - 1, "/ledgers/000/0000/0021/4748/L3647"),
        (2**63 - 1, "/ledgers/922/3372/0368/5477/L5807"),
    ])
    def test_documented_examples(self, ledger_id: int, path: str) -> None:
        assert ledger_path(ledger_id) == path
        assert ledger_id_from_path(path) == ledger_id

    def test_custom_root(self) -> None:
        assert ledger_path(5, "/pulsar/ledgers/") == "/pulsar/ledgers/00/0000/L0005"

    @given(st.integers(0, 2**63 - 1))
    def test_round_trip(self, ledger_id: int) -> None:
        assert ledger_id_from_path(ledger_path(ledger_id)) == ledger_id

    @pytest.mark.parametrize("path", ["/ledgers/00/0000/0000", "/ledgers/0/0000/L0000",
                                      "/ledgers/00/0000/L000x", "/other/00/0000/L0001",
                                      "/ledgers/000/0000/0000/0000/L0001"])
    def test_non_ledger_paths(self, path: str) -> None:
        with pytest.raises(ValueError, match=r"ledger|under"):
            ledger_id_from_path(path)


class TestLayoutNode:
    def test_hierarchical_is_accepted(self) -> None:
        check_layout(f"2\n{HIERARCHICAL_FACTORY}:1".encode(), "/ledgers/LAYOUT")

    def test_other_layouts_are_refused_by_name(self) -> None:
        with pytest.raises(FormatError, match="FlatLedgerManagerFactory"):
            check_layout(b"2\norg.apache.bookkeeper.meta.FlatLedgerManagerFactory:1", "L")

    def test_junk(self) -> None:
        with pytest.raises(FormatError):
            check_layout(b"hello", "L")


META = LedgerMetadata(
    ledger_id=7, ensemble_size=3, write_quorum=2, ack_quorum=2, state=LedgerStateBK.CLOSED,
    last_entry_id=99, length=1234, digest_type=3, password=b"pw", ctime_ms=1700000000000,
    segments=((0, ("a:1", "b:1", "c:1")), (50, ("a:1", "d:1", "c:1"))))


class TestLedgerMetadata:
    """Format version 3: header line, varint length, LedgerMetadataFormat."""

    def test_round_trip(self) -> None:
        data = encode_ledger_metadata(META)
        assert data.startswith(b"BookieMetadataFormatVersion\t3\n")
        assert decode_ledger_metadata(data, 7, "n") == META

    def test_open_ledger_has_no_last_entry(self) -> None:
        m = LedgerMetadata(1, 1, 1, 1, LedgerStateBK.OPEN, -1, 0, 3, None, 0, ((0, ("a:1",)),))
        assert decode_ledger_metadata(encode_ledger_metadata(m), 1, "n") == m

    @pytest.mark.parametrize("data", [
        b"", b"junk", b"BookieMetadataFormatVersion\t2\nquorumSize: 2\n",
        b"BookieMetadataFormatVersion\t3\n", b"BookieMetadataFormatVersion\t3\n\x05ab",
        b"BookieMetadataFormatVersion\t3\n\x02\x08\x01",
    ])
    def test_junk_and_truncation(self, data: bytes) -> None:
        with pytest.raises(FormatError):
            decode_ledger_metadata(data, 1, "/ledgers/00/0000/L0001")

    def test_ensembles_must_match_their_size(self) -> None:
        bad = LedgerMetadata(1, 3, 2, 2, LedgerStateBK.OPEN, -1, 0, 3, None, 0,
                             ((0, ("a:1", "b:1")),))
        with pytest.raises(FormatError, match="ensembleSize"):
            decode_ledger_metadata(encode_ledger_metadata(bad), 1, "n")


class TestWriteSets:
    def test_write_set_walks_the_ensemble(self) -> None:
        assert write_set(0, 3, 2) == [0, 1]
        assert write_set(2, 3, 2) == [2, 0]
        assert write_set(4, 5, 3) == [4, 0, 1]

    def test_ensemble_changes_apply_from_their_first_entry(self) -> None:
        assert META.bookies_for(49) == ["b:1", "c:1"]  # 49 % 3 == 1 -> positions 1, 2
        assert META.bookies_for(52) == ["d:1", "c:1"]  # same positions, new ensemble
        assert META.bookies_for(50) == ["c:1", "a:1"]
        assert META.all_bookies() == {"a:1", "b:1", "c:1", "d:1"}

    @given(st.integers(0, 120), st.integers(0, 60))
    def test_groups_agree_with_per_entry_write_sets(self, first: int, n: int) -> None:
        groups = META.write_set_groups(first, first + n)
        seen = sorted(e for ids in groups.values() for e in ids)
        assert seen == list(range(first, first + n + 1))
        for ws, ids in groups.items():
            for e in ids:
                assert list(ws) == META.bookies_for(e)


def _info(*ledgers: tuple[int, int | None]) -> mlpb.ManagedLedgerInfo:
    info = mlpb.ManagedLedgerInfo()
    for lid, entries in ledgers:
        li = info.ledgerInfo.add(ledgerId=lid, timestamp=lid * 1000)
        if entries is not None:
            li.entries, li.size = entries, entries * 10
    return info


def pl(ledgers: list[PulsarLedger], mzxid: int = 100, version: int = 7) -> PulsarList:
    """Pulsar's list as one read (at ``mzxid``/``version``) saw it."""
    return PulsarList(tuple(ledgers), version, mzxid)


class TestMirror:
    """The mirror follows Pulsar's list and never edits an offload context."""

    def test_new_topic_gets_pulsar_ledgers_in_order(self) -> None:
        info = mlpb.ManagedLedgerInfo()
        ch = mirror_edit(info, pl([PulsarLedger(3, True, 5, 50, 7), PulsarLedger(4, False)]),
                         1)
        assert ch.added == [3, 4] and ch.changed
        assert [(li.ledgerId, li.HasField("entries")) for li in info.ledgerInfo] == \
            [(3, True), (4, False)]
        assert info.ledgerInfo[0].entries == 5 and info.ledgerInfo[0].size == 50

    def test_closing_fills_entries_and_keeps_offload_context(self) -> None:
        info = _info((1, 10), (2, None))
        uid = uuid.uuid4()
        catalog.add_assigned(info, uid, [LedgerRange(1, 0, 9), LedgerRange(2, 0, 3)], 5,
                             catalog.driver_metadata("filesystem", {}))
        before = info.ledgerInfo[1].offloadContext.SerializeToString()
        ch = mirror_edit(info, pl([PulsarLedger(1, True, 10, 100, 1000),
                                   PulsarLedger(2, True, 8, 80, 2000),
                                   PulsarLedger(3, False, timestamp_ms=3000)]), 9)
        assert ch.closed == [2] and ch.added == [3] and not ch.dropped
        assert info.ledgerInfo[1].entries == 8
        assert info.ledgerInfo[1].offloadContext.SerializeToString() == before
        assert [s.uid for s in catalog.segments(info)] == [uid]

    def test_no_change_is_no_write(self) -> None:
        info = _info((1, 10), (2, None))
        want = [PulsarLedger(1, True, 10, 100), PulsarLedger(2, False)]
        first = mirror_edit(info, pl(want), 1)  # a mirror without a recorded list: record it
        assert first.stamped and not (first.added or first.closed or first.dropped)
        assert mirrored_list(info) == (100, 7)
        assert not mirror_edit(info, pl(want), 1).changed

    def test_ledger_deleted_before_offload_is_dropped_and_recorded_once(self) -> None:
        info = _info((1, 10), (2, 5), (3, None))
        ch = mirror_edit(info, pl([PulsarLedger(2, True, 5, 50), PulsarLedger(3, False)]), 77)
        assert ch.dropped == [1]
        assert [(lost.ledger_id, lost.first, lost.last, lost.bytes) for lost in ch.lost] == \
            [(1, 0, 9, 100)]
        assert [li.ledgerId for li in info.ledgerInfo] == [2, 3]
        assert lost_ledgers(info)[0].entries == 10 and lost_ledgers(info)[0].at_ms == 77
        again = mirror_edit(info, pl([PulsarLedger(2, True, 5, 50), PulsarLedger(3, False)]),
                            78)
        assert not again.changed and len(lost_ledgers(info)) == 1

    def test_partly_offloaded_ledger_reports_only_the_rest(self) -> None:
        info = _info((1, 10), (2, None))
        uid = uuid.uuid4()
        catalog.add_assigned(info, uid, [LedgerRange(1, 0, 5)], 5,
                             catalog.driver_metadata("filesystem", {}))
        catalog.mark_offloaded(info, uid, 6)
        ch = mirror_edit(info, pl([PulsarLedger(2, False)]), 1)
        assert [(lost.first, lost.last, lost.bytes) for lost in ch.lost] == [(6, 9, -1)]

    def test_fully_offloaded_ledger_is_dropped_without_loss(self) -> None:
        info = _info((1, 10), (2, None))
        uid = uuid.uuid4()
        catalog.add_assigned(info, uid, [LedgerRange(1, 0, 9)], 5,
                             catalog.driver_metadata("filesystem", {}))
        catalog.mark_offloaded(info, uid, 6)
        ch = mirror_edit(info, pl([PulsarLedger(2, False)]), 1)
        assert ch.dropped == [1] and ch.lost == []

    def test_a_segment_assigned_but_not_committed_offloaded_nothing(self) -> None:
        """Found by the long soak: a ledger deleted under an assigned segment (the daemon was
        killed before its commit) was recorded lost only after the segment's end, or not at
        all — its entries silently gone."""
        info = _info((1, 30), (2, None))
        done, pending = uuid.uuid4(), uuid.uuid4()
        drv = catalog.driver_metadata("filesystem", {})
        catalog.add_assigned(info, done, [LedgerRange(1, 0, 9)], 5, drv)
        catalog.mark_offloaded(info, done, 6)
        catalog.add_assigned(info, pending, [LedgerRange(1, 10, 29), LedgerRange(2, 0, 3)],
                             7, drv)
        ch = mirror_edit(info, pl([PulsarLedger(2, False)]), 8)
        assert [(lost.first, lost.last) for lost in ch.lost] == [(10, 29)]
        # and the segment can no longer be committed over what is left of it
        with pytest.raises(KeyError, match="lost the records of ledgers"):
            catalog.mark_offloaded(info, pending, 9, [1, 2])

    def test_a_ledger_deleted_before_its_close_was_mirrored_reports_its_final_end(
            self) -> None:
        info = _info((1, None))
        ch = mirror_edit(info, pl([]), 1, known_last={1: (4, 40)})
        assert [(lost.first, lost.last) for lost in ch.lost] == [(0, 4)]
        info2 = _info((1, None))
        ch2 = mirror_edit(info2, pl([]), 1)
        assert [(lost.first, lost.last) for lost in ch2.lost] == [(0, -1)]  # end unknown

    def test_ledgers_held_by_pulsars_own_offloader_are_not_lost(self) -> None:
        info = _info((1, 10), (2, None))
        ch = mirror_edit(info, pl([PulsarLedger(2, False)]), 1, exempt={1})
        assert ch.dropped == [1] and ch.lost == []

    def test_empty_ledger_deleted_is_no_loss(self) -> None:
        info = _info((1, 0), (2, None))
        assert mirror_edit(info, pl([PulsarLedger(2, False)]), 1).lost == []


class TestMirrorFollowsOnlyNewerLists:
    """Issue 13 defect 1: "missing ⇒ deleted" holds only for a list at least as new as the one
    the mirror follows. A list read before Pulsar added a ledger lacks it without proving
    anything; applying it dropped committed segments and reported false losses."""

    def test_an_older_list_changes_nothing(self) -> None:
        info = mlpb.ManagedLedgerInfo()
        newer = pl([PulsarLedger(1, True, 10, 100), PulsarLedger(2, True, 5, 50),
                    PulsarLedger(3, False)], mzxid=340, version=34)
        mirror_edit(info, newer, 1)
        catalog.add_assigned(info, uuid.uuid4(), [LedgerRange(2, 0, 4), LedgerRange(3, 0, 2)],
                             5, catalog.driver_metadata("filesystem", {}))
        before = info.SerializeToString()
        # read at version 32, before ledger 3 existed and while 2 was still open
        older = pl([PulsarLedger(1, True, 10, 100), PulsarLedger(2, False)], mzxid=320,
                   version=32)
        ch = mirror_edit(info, older, 2)
        assert ch.stale and not ch.changed
        assert info.SerializeToString() == before
        assert lost_ledgers(info) == [] and mirrored_list(info) == (340, 34)

    def test_a_newer_list_drops_what_pulsar_deleted(self) -> None:
        info = mlpb.ManagedLedgerInfo()
        mirror_edit(info, pl([PulsarLedger(1, True, 10, 100), PulsarLedger(2, False)],
                             mzxid=50), 1)
        ch = mirror_edit(info, pl([PulsarLedger(2, False)], mzxid=51, version=8), 2)
        assert ch.dropped == [1] and [x.ledger_id for x in ch.lost] == [1]
        assert mirrored_list(info) == (51, 8)

    def test_the_same_read_applied_twice_is_one_write(self) -> None:
        info = mlpb.ManagedLedgerInfo()
        listed = pl([PulsarLedger(1, False)], mzxid=9)
        assert mirror_edit(info, listed, 1).changed
        again = mirror_edit(info, listed, 2)
        assert not again.changed and not again.stale

    def test_a_recreated_topic_is_newer_although_its_version_restarts(self) -> None:
        info = mlpb.ManagedLedgerInfo()
        mirror_edit(info, pl([PulsarLedger(1, True, 3, 30)], mzxid=500, version=40), 1)
        ch = mirror_edit(info, pl([PulsarLedger(9, False)], mzxid=900, version=0), 2)
        assert not ch.stale and ch.dropped == [1] and ch.added == [9]

    def test_a_false_loss_record_is_withdrawn_and_the_real_deletion_reported(self) -> None:
        # what an older offloadd left: ledger 5 recorded lost from a stale list, then re-added
        info = _info((5, None), (6, None))
        info.properties.add(key="offloadd.lost.5", value='{"at_ms": 1, "bytes": -1, '
                            '"first": 0, "last": -1}')
        ch = mirror_edit(info, pl([PulsarLedger(5, True, 4, 40), PulsarLedger(6, False)],
                                  mzxid=10), 2)
        assert ch.cleared == [5] and lost_ledgers(info) == []
        # Pulsar really deletes ledger 5 later, before offloadd offloaded it: reported
        ch = mirror_edit(info, pl([PulsarLedger(6, False)], mzxid=11), 3)
        assert [(x.ledger_id, x.first, x.last) for x in ch.lost] == [(5, 0, 3)]
        assert [(x.ledger_id, x.last) for x in lost_ledgers(info)] == [(5, 3)]

    @given(st.lists(st.integers(1, 6), min_size=1, max_size=12))
    def test_any_order_of_reads_never_drops_a_listed_ledger(self, order: list[int]) -> None:
        """Pulsar's list over time: ledgers appended, the oldest deleted. Reads are applied in
        any order (slow derivations finishing late); the mirror never lacks a ledger that the
        newest read applied so far still lists, and never reports a ledger lost that no applied
        read had already seen deleted."""
        history = {1: [1], 2: [1, 2], 3: [1, 2, 3], 4: [2, 3], 5: [2, 3, 4], 6: [3, 4, 5]}
        info = mlpb.ManagedLedgerInfo()
        newest = 0
        for v in order:
            mirror_edit(info, pl([PulsarLedger(x, False) for x in history[v]], mzxid=v,
                                 version=v), v)
            newest = max(newest, v)
            assert [li.ledgerId for li in info.ledgerInfo] == history[newest]
            deleted = set().union(*(history[k] for k in range(1, newest + 1))) - \
                set(history[newest])
            assert {x.ledger_id for x in lost_ledgers(info)} <= deleted
