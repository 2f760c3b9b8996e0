"""Retention decisions, pure: which ledgers go, which source copies go, records and orphans."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from offloadd import config
from offloadd._proto import mldataformats_pb2 as pb
from offloadd.blobstore.base import ObjectInfo
from offloadd.errors import FormatError
from offloadd.model import catalog
from offloadd.model.catalog import LedgerRange, Segment, SegmentKind
from offloadd.model.keys import ledger_data_key, ledger_index_key, streaming_data_key
from offloadd.retention.policy import (
    DeletionRecord,
    LedgerView,
    RetentionLimits,
    SegmentRecord,
    ledger_views,
    ledgers_to_delete,
    object_keys,
    orphans,
    source_copies_to_trim,
)

DRIVER = catalog.driver_metadata("filesystem", {})
MiB = 1024 * 1024


def topic_info(ledgers: list[tuple[int, int | None, int]]) -> pb.ManagedLedgerInfo:
    """Ledgers as (id, entries or None when open, timestamp ms); size = 100 bytes per entry."""
    info = pb.ManagedLedgerInfo()
    for lid, n, ts in ledgers:
        li = info.ledgerInfo.add(ledgerId=lid, timestamp=ts)
        if n is not None:
            li.entries, li.size = n, 100 * n
    return info


def commit(info: pb.ManagedLedgerInfo, ranges: list[LedgerRange], at_ms: int,
           complete: bool = True) -> uuid.UUID:
    uid = uuid.uuid4()
    catalog.add_assigned(info, uid, ranges, at_ms - 1, DRIVER)
    if complete:
        catalog.mark_offloaded(info, uid, at_ms)
    return uid


def view(lid: int, *, size: int = 100, closed_ms: int = 0, offloaded: bool = True,
         entries: int | None = 1, offloaded_ms: int | None = 0,
         source_deleted: bool = False, cursor: bool = False) -> LedgerView:
    return LedgerView(lid, entries, size, closed_ms, offloaded,
                      offloaded_ms if offloaded else None, source_deleted, cursor)


class TestLedgerViews:
    """A ledger is offloaded when committed segments hold every entry of it."""

    def test_coverage_follows_committed_segments_only(self) -> None:
        # ledgers 1, 2 (10 entries each), 3 open
        #   S1 = 1:0..1:9 + 2:0..2:3 (committed)   S2 = 2:4..2:9 (assigned)
        info = topic_info([(1, 10, 1000), (2, 10, 2000), (3, None, 3000)])
        commit(info, [LedgerRange(1, 0, 9), LedgerRange(2, 0, 3)], 5000)
        commit(info, [LedgerRange(2, 4, 9)], 6000, complete=False)
        v1, v2, v3 = ledger_views(info)
        assert v1.offloaded and v1.offloaded_ms == 5000
        assert not v2.offloaded and v2.offloaded_ms is None
        assert v3.open and not v3.offloaded
        # the offloader's cursor is where the last committed segment ends
        assert [v.cursor for v in (v1, v2, v3)] == [False, True, False]

    def test_a_ledger_offloaded_by_two_segments_takes_the_later_commit_time(self) -> None:
        info = topic_info([(1, 10, 1000), (2, None, 2000)])
        commit(info, [LedgerRange(1, 0, 4)], 5000)
        commit(info, [LedgerRange(1, 5, 9)], 7000)
        assert ledger_views(info)[0].offloaded_ms == 7000

    def test_close_time_is_the_later_of_its_own_and_the_next_ledgers_timestamp(self) -> None:
        info = topic_info([(1, 10, 1000), (2, 10, 4000), (3, None, 2500)])
        v1, v2, v3 = ledger_views(info)
        assert (v1.closed_ms, v2.closed_ms, v3.closed_ms) == (4000, 4000, 2500)

    def test_an_empty_ledger_counts_as_offloaded_once_a_later_one_is(self) -> None:
        info = topic_info([(1, 0, 1000), (2, 5, 2000), (3, 0, 3000), (4, None, 4000)])
        commit(info, [LedgerRange(2, 0, 4)], 9000)
        v1, v2, v3, _ = ledger_views(info)
        assert v1.offloaded and v1.offloaded_ms == 9000
        assert v2.offloaded
        assert not v3.offloaded  # nothing after it is offloaded yet

    def test_whole_ledger_segments_count(self) -> None:
        info = topic_info([(1, 10, 1000), (2, None, 2000)])
        uid = uuid.uuid4()
        catalog.assign_ledger(info, 1, uid, 3000, DRIVER)
        assert not ledger_views(info)[0].offloaded
        catalog.complete_ledger(info, 1, uid, 4000)
        assert ledger_views(info)[0].offloaded

    def test_the_bookkeeper_deleted_flag_is_the_source_deleted_mark(self) -> None:
        info = topic_info([(1, 10, 1000), (2, None, 2000)])
        commit(info, [LedgerRange(1, 0, 9)], 5000)
        info.ledgerInfo[0].offloadContext.bookkeeperDeleted = True
        assert ledger_views(info)[0].source_deleted


class TestRetention:
    """Oldest offloaded ledgers go while past the time or over the size; never the current one."""

    def test_no_limit_deletes_nothing(self) -> None:
        assert ledgers_to_delete([view(1), view(2)], RetentionLimits(), 10**12) == []

    def test_time_deletes_the_expired_prefix_only(self) -> None:
        views = [view(1, closed_ms=100), view(2, closed_ms=900), view(3, closed_ms=200),
                 view(4, closed_ms=100)]
        # ledger 3 is old again, but retention stops at the first young ledger
        assert ledgers_to_delete(views, RetentionLimits(max_age_ms=500), 1000) == [1]

    def test_size_follows_pulsar_deleting_while_the_topic_is_over_quota(self) -> None:
        views = [view(i, size=10) for i in (1, 2, 3, 4, 5)]  # 50 bytes
        # 50 > 25: drop 1; 40 > 25: drop 2; 30 > 25: drop 3; 20 <= 25: stop
        assert ledgers_to_delete(views, RetentionLimits(max_size_bytes=25), 0) == [1, 2, 3]

    def test_the_current_ledger_is_never_deleted(self) -> None:
        views = [view(1, closed_ms=0), view(2, closed_ms=0)]
        assert ledgers_to_delete(views, RetentionLimits(max_age_ms=0), 10) == [1]

    def test_a_ledger_not_yet_offloaded_stops_retention(self) -> None:
        views = [view(1), view(2, offloaded=False), view(3), view(4)]
        assert ledgers_to_delete(views, RetentionLimits(max_size_bytes=0), 10) == [1]

    def test_the_offloaders_cursor_ledger_stops_retention(self) -> None:
        views = [view(1), view(2, cursor=True), view(3, offloaded=False), view(4)]
        assert ledgers_to_delete(views, RetentionLimits(max_size_bytes=0), 10) == [1]

    def test_an_open_ledger_stops_retention(self) -> None:
        views = [view(1, entries=None, offloaded=False), view(2)]
        assert ledgers_to_delete(views, RetentionLimits(max_size_bytes=0), 10) == []

    @given(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 2000), st.booleans(),
                              st.booleans()), max_size=12),
           st.one_of(st.none(), st.integers(0, 1500)), st.one_of(st.none(), st.integers(0, 5000)))
    def test_the_choice_is_an_offloaded_prefix_that_obeys_the_limits(
            self, rows: list[tuple[int, int, bool, bool]], max_age: int | None,
            max_size: int | None) -> None:
        views = [view(i, size=s, closed_ms=c, offloaded=o, cursor=k)
                 for i, (s, c, o, k) in enumerate(rows)]
        limits = RetentionLimits(max_age, max_size)
        now = 2000
        chosen = ledgers_to_delete(views, limits, now)
        assert chosen == [v.ledger_id for v in views[:len(chosen)]]
        assert len(chosen) < max(len(views), 1)
        total = sum(v.size for v in views)
        freed = 0
        for v in views[:len(chosen)]:
            assert v.offloaded and not v.cursor
            expired = max_age is not None and now - v.closed_ms > max_age
            assert expired or (max_size is not None and total - freed > max_size)
            freed += v.size
        if len(chosen) < len(views) - 1:  # it stopped for a reason
            nxt = views[len(chosen)]
            expired = max_age is not None and now - nxt.closed_ms > max_age
            over = max_size is not None and total - freed > max_size
            assert not nxt.offloaded or nxt.cursor or not (expired or over)

    def test_limits_from_config_treat_negative_as_off(self) -> None:
        assert RetentionLimits.from_config(-1, -1) == RetentionLimits(None, None)
        assert not RetentionLimits.from_config(-1, -1).active
        assert RetentionLimits.from_config(2, 0.5) == RetentionLimits(120_000, MiB // 2)


class TestDeletionLag:
    """A source copy goes only once offloaded, and more than the lag ago."""

    def test_the_lag_must_have_passed(self) -> None:
        views = [view(1, offloaded_ms=1000), view(2)]
        assert source_copies_to_trim(views, 500, 1500) == []
        assert source_copies_to_trim(views, 500, 1501) == [1]

    def test_never_the_current_an_open_a_trimmed_or_an_unoffloaded_ledger(self) -> None:
        views = [view(1, source_deleted=True), view(2, offloaded=False), view(3),
                 view(4, offloaded_ms=0)]
        assert source_copies_to_trim(views, 0, 10) == [3]
        assert source_copies_to_trim([view(1, entries=None, offloaded=False), view(2)], 0,
                                     10) == []

    def test_pulsars_deletion_lag_setting_is_an_alias(self, tmp_path: Path) -> None:
        cfg = tmp_path / "c.toml"
        cfg.write_text("[offload]\nmanagedLedgerOffloadDeletionLagInMillis = 1234\n"
                       "[retention]\ndefaultRetentionTimeInMinutes = 5\n"
                       "defaultRetentionSizeInMB = 7\ntrim_source = true\n")
        s = config.load(cfg)
        assert s.offload.deletion_lag_ms == 1234
        assert (s.retention.max_age_minutes, s.retention.max_size_mbytes) == (5, 7)
        assert s.retention.trim_source and s.retention.orphan_grace_s == 3600


class TestRecords:
    """Segment and deletion records survive the ledgers they describe."""

    def test_a_segment_is_fully_deleted_only_when_every_ledger_is_marked(self) -> None:
        rec = SegmentRecord(uuid.uuid4(), "t/ns/persistent/x", SegmentKind.STREAMING, (3, 4, 5))
        part = rec.marked({4, 5, 9})
        assert part.deleted == (3,) and not part.fully_deleted
        assert part.marked({4, 5}) is part  # nothing new: the same record
        full = part.marked({9})
        assert full.deleted == (3, 4, 5) and full.fully_deleted

    def test_marks_are_never_taken_back(self) -> None:
        rec = SegmentRecord(uuid.uuid4(), "a/b/persistent/c", SegmentKind.STREAMING, (1, 2),
                            deleted=(1,))
        assert rec.marked({1, 2}).deleted == (1,)

    @given(st.uuids(), st.lists(st.integers(0, 2**62), min_size=1, max_size=6, unique=True),
           st.data())
    def test_segment_records_round_trip(self, uid: uuid.UUID, ledgers: list[int],
                                        data: st.DataObject) -> None:
        deleted = data.draw(st.lists(st.sampled_from(ledgers), unique=True))
        rec = SegmentRecord(uid, "t/ns/persistent/x", SegmentKind.STREAMING, tuple(ledgers),
                            tuple(deleted), 17)
        assert SegmentRecord.decode(rec.encode(), "/p") == rec

    @given(st.uuids(), st.sampled_from(SegmentKind), st.integers(0, 100),
           st.one_of(st.none(), st.text(max_size=40)))
    def test_deletion_records_round_trip(self, uid: uuid.UUID, kind: SegmentKind,
                                         attempts: int, error: str | None) -> None:
        rec = DeletionRecord(uid, "t/ns/persistent/x", kind, (7,), 1, attempts,
                             None if error is None else 5, error)
        assert DeletionRecord.decode(rec.encode(), "/p") == rec

    @given(st.uuids(), st.uuids(), st.integers(0, 2**40), st.integers(0, 2**40))
    def test_a_merges_deletion_records_round_trip_and_wait_for_the_lag(
            self, uid: uuid.UUID, into: uuid.UUID, now: int, lag: int) -> None:
        seg = Segment(uid, SegmentKind.STREAMING, (LedgerRange(3, 0, 9),), True)
        rec = DeletionRecord.merged(seg, "t/ns/persistent/x", into, now, lag)
        assert DeletionRecord.decode(rec.encode(), "/p") == rec
        assert rec.merged_into == into and rec.not_before_ms == now + lag
        assert rec.due(now + lag) and (lag == 0 or not rec.due(now + lag - 1))

    def test_records_without_the_merge_fields_are_due_at_once(self) -> None:
        old = (b'{"v": 1, "uid": "00000000-0000-0000-0000-000000000001", "ml": "a", '
               b'"kind": "streaming", "ledgers": [1], "created_ms": 5}')
        rec = DeletionRecord.decode(old, "/p")
        assert rec.not_before_ms == 0 and rec.merged_into is None and rec.due(0)
        with pytest.raises(FormatError):
            DeletionRecord.decode(old[:-1] + b', "merged_into": "nope"}', "/p")

    def test_a_failure_counts_an_attempt_and_keeps_the_error(self) -> None:
        rec = DeletionRecord(uuid.uuid4(), "t/ns/persistent/x", SegmentKind.STREAMING, (1,), 10)
        twice = rec.failed(20, "boom").failed(30, "bang")
        assert (twice.attempts, twice.last_attempt_ms, twice.last_error) == (2, 30, "bang")

    @pytest.mark.parametrize("junk", [b"", b"\xff", b"[]", b'{"v": 2}', b'{"v": 1}',
                                      b'{"v": 1, "uid": "x", "ml": "a", "kind": "streaming"}',
                                      b'{"v": 1, "uid": "00000000-0000-0000-0000-000000000001",'
                                      b' "ml": "a", "kind": "streaming", "ledgers": ["1"]}',
                                      b'{"v": 1, "uid": "00000000-0000-0000-0000-000000000001",'
                                      b' "ml": "a", "kind": "streaming", "ledgers": []}'])
    def test_junk_records_are_format_errors(self, junk: bytes) -> None:
        with pytest.raises(FormatError):
            SegmentRecord.decode(junk, "/offloadd/segments/a/x")

    def test_a_left_behind_write_probe_is_an_orphan_after_the_grace(self) -> None:
        probe = ObjectInfo("offloadd-probe-0123abcd", 5, {}, 100.0)
        other = ObjectInfo("offloadd-probes.txt", 5, {}, 100.0)  # not the probe's prefix+hex
        assert orphans([probe, other], (), 60, 200.0) == ["offloadd-probe-0123abcd"]
        assert orphans([probe], (), 600, 200.0) == []

    def test_object_keys_cover_both_formats_index_first(self) -> None:
        uid = uuid.uuid4()
        assert object_keys(uid, SegmentKind.STREAMING, (1, 2)) == [f"{uid}-index", f"{uid}"]
        assert object_keys(uid, SegmentKind.LEDGER, (5,)) == [
            ledger_index_key(uid, 5), ledger_data_key(uid, 5)]


class TestOrphans:
    """Only keys of ours, unreferenced and older than the grace period, are orphans."""

    def test_selection(self) -> None:
        live, dead, young = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
        objs = [ObjectInfo(streaming_data_key(live), 1, mtime=0),
                ObjectInfo(streaming_data_key(dead), 1, mtime=0),
                ObjectInfo(ledger_index_key(dead, 3), 1, mtime=0),
                ObjectInfo(streaming_data_key(young), 1, mtime=95),
                ObjectInfo("README.txt", 1, mtime=0),
                ObjectInfo(f"{dead}-something-else", 1, mtime=0)]
        assert orphans(objs, {live}, 10, 100) == [
            streaming_data_key(dead), ledger_index_key(dead, 3)]
        assert len(orphans(objs, {live}, 0, 100)) == 3

    def test_keys_under_some_path_are_not_ours(self) -> None:
        # a driver strips its own key prefix from what it lists: ours are bare uuid keys
        uid = uuid.uuid4()
        objs = [ObjectInfo(f"other/{uid}", 1), ObjectInfo(f"{uid}", 1)]
        assert orphans(objs, set(), 0, 10) == [f"{uid}"]
