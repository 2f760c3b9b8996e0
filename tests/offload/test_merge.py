"""Merging small segments (``offload/merge.py``, ``catalog.merge_segments``): the plan, the pure
swap, and whole merges on the embedded store with a filesystem tier (``tests/retention/rig``).

The rig's topic: entries of 1 KiB in ledgers of ``per_ledger`` entries, segments rolled every
``per_segment`` entries, so segments span ledgers and ledgers span segments::

    ledger    0 ............ 1 ............ 2 ...
    segments  [S1 ][S2 ][S3 ][S4 ][S5 ] ...          (merged: [   M1   ][   M2   ] ...)
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from offloadd._proto import mldataformats_pb2 as pb
from offloadd.commit.fence import EpochFence, NoFence, take
from offloadd.errors import Fenced, IllegalTransition
from offloadd.model import catalog
from offloadd.model.catalog import LedgerRange, Segment, SegmentKind
from offloadd.model.keys import (
    deletion_path,
    segment_record_path,
    streaming_data_key,
    uuid_to_msb_lsb,
)
from offloadd.offload.attempt import Uploads
from offloadd.offload.merge import MergeReport, MergeSettings, Sized, compact_topic, plan
from offloadd.read.reader import TierReader
from offloadd.retention.policy import DeletionRecord
from tests.retention.rig import TOPIC, Rig, settings

pytestmark = pytest.mark.timeout(120)

ML = TOPIC.managed_ledger
KiB = 1024


def seg(n: int, ranges: tuple[tuple[int, int, int], ...], *, complete: bool = True,
        kind: SegmentKind = SegmentKind.STREAMING) -> Segment:
    return Segment(uuid.UUID(int=n), kind, tuple(LedgerRange(*r) for r in ranges), complete)


class TestPlan:
    """Runs of adjacent small committed streaming segments, grouped greedily within the
    target; anything else ends a run."""

    def test_groups_stay_within_the_target(self) -> None:
        segs = [Sized(seg(i, ((1, i * 10, i * 10 + 9),)), 30) for i in range(10)]
        groups = plan(segs, 100)
        assert [len(g) for g in groups] == [3, 3, 3]  # the tenth alone is not merged
        assert [s.uid for g in groups for s in g] == [s.segment.uid for s in segs[:9]]

    def test_big_assigned_and_ledger_based_segments_end_runs(self) -> None:
        segs = [Sized(seg(0, ((1, 0, 9),)), 10), Sized(seg(1, ((1, 10, 19),)), 10),
                Sized(seg(2, ((1, 20, 29),)), 500),  # big
                Sized(seg(3, ((1, 30, 39),)), 10), Sized(seg(4, ((1, 40, 49),)), 10),
                Sized(seg(5, ((2, 0, 9),), kind=SegmentKind.LEDGER), 10),
                Sized(seg(6, ((3, 0, 9),)), 10),
                Sized(seg(7, ((3, 10, 19),), complete=False), 0),  # an attempt in flight
                Sized(seg(8, ((3, 20, 29),)), 10)]
        assert [[s.uid.int for s in g] for g in plan(segs, 100)] == [[0, 1], [3, 4]]


def info_with(*records: tuple[int, list[tuple[int, int, bool]]]) -> pb.ManagedLedgerInfo:
    """Ledgers with ``(uid int, endEntryId, complete)`` records."""
    info = pb.ManagedLedgerInfo()
    for lid, recs in records:
        li = info.ledgerInfo.add(ledgerId=lid, entries=100, timestamp=lid)
        for n, end, done in recs:
            s = li.offloadContext.offloadSegment.add()
            s.uidMsb, s.uidLsb = uuid_to_msb_lsb(uuid.UUID(int=n))
            s.complete, s.endEntryId, s.offloadedTimestamp = done, end, 100 + n
    return info


class TestMergeSegments:
    """The pure swap: the group's records become one record per ledger, in place."""

    def test_records_replaced_in_place(self) -> None:
        # ledger 1: S1 [0..39] S2 [40..99]; ledger 2: S2 [0..9] S3 [10..49] S4 [50..59] (open)
        info = info_with((1, [(1, 39, True), (2, 99, True)]),
                         (2, [(2, 9, True), (3, 49, True), (4, 59, False)]))
        old = catalog.segments(info)[:3]
        new = uuid.uuid4()
        assert catalog.merge_segments(info, old, new, now_ms=7)
        segs = catalog.segments(info)
        assert [s.uid for s in segs] == [new, uuid.UUID(int=4)]
        assert segs[0].ranges == (LedgerRange(1, 0, 99), LedgerRange(2, 0, 49))
        assert segs[0].complete and segs[0].offloaded_ms == 103  # when the data first landed
        assert segs[1].ranges == (LedgerRange(2, 50, 59),) and not segs[1].complete

    def test_the_merged_segment_records_its_own_usage(self) -> None:
        info = info_with((1, [(1, 39, True), (2, 99, True), (3, 120, True)]))
        for uid in (1, 2, 3):  # every old segment recorded what it cost
            catalog.mark_offloaded(info, uuid.UUID(int=uid), 5,
                                   usage=catalog.TierUsage(2, 1000 * uid, 900, 4))
        old = catalog.segments(info)[:2]
        assert catalog.merge_segments(info, old, uuid.uuid4(), now_ms=7,
                                      usage=catalog.TierUsage(2, 2500, 1800, 5))
        segs = catalog.segments(info)
        assert catalog.usage_of(segs[0]) == catalog.TierUsage(2, 2500, 1800, 5)
        assert catalog.usage_of(segs[1]) == catalog.TierUsage(2, 3000, 900, 4)
        unsized = info_with((1, [(1, 39, True), (2, 99, True)]))
        catalog.mark_offloaded(unsized, uuid.UUID(int=1), 5,
                               usage=catalog.TierUsage(2, 1000, 900, 4))
        catalog.merge_segments(unsized, catalog.segments(unsized), uuid.uuid4(), now_ms=7)
        assert catalog.usage_of(catalog.segments(unsized)[0]) is None  # not S1's figures

    def test_a_moved_catalog_is_refused(self) -> None:
        info = info_with((1, [(1, 39, True), (2, 99, True), (3, 120, True)]))
        old = catalog.segments(info)[:2]
        moved = info_with((1, [(1, 39, True), (9, 99, True), (3, 120, True)]))  # S2 replaced
        before = moved.SerializeToString()
        with pytest.raises(ValueError, match="no longer where"):
            catalog.merge_segments(moved, old, uuid.uuid4(), now_ms=1)
        not_done = info_with((1, [(1, 39, True), (2, 99, False)]))
        with pytest.raises(IllegalTransition, match="assigned to merged"):
            catalog.merge_segments(not_done, old, uuid.uuid4(), now_ms=1)
        assert moved.SerializeToString() == before


def merge_settings(target: int, lag_ms: int = 0) -> MergeSettings:
    return MergeSettings(target_bytes=target, max_block_size=64 * KiB, deletion_lag_ms=lag_ms)


async def compact(rig: Rig, target: int, *, lag_ms: int = 0, fence: object = None,
                  reader: TierReader | None = None) -> MergeReport:
    return await compact_topic(TOPIC, rig.metadata, reader or TierReader(rig.metadata, rig.blob),
                               Uploads(rig.blob, ML, 4), fence or NoFence(),  # type: ignore
                               merge_settings(target, lag_ms),
                               wall_ms=lambda: int(time.time() * 1000))


async def data_bytes(rig: Rig) -> int:
    reader = TierReader(rig.metadata, rig.blob)
    return sum([(await reader.index(f"{s.uid}-index")).data_object_length
                for s in await rig.segments()])


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    r = await Rig.open(tmp_path, per_ledger=45, per_segment=10)
    try:
        await r.write(300)  # 30 segments of ~10 KiB across 7 ledgers
        await r.offload_all()
        yield r
    finally:
        await r.close()


class TestCompact:
    """Whole merges: nothing lost or duplicated, old objects kept for the lag, then gc'd."""

    async def test_merges_to_the_bound_and_reads_back_everything(self, rig: Rig) -> None:
        before = await rig.segments()
        assert len(before) >= 29
        total = await data_bytes(rig)
        target = 64 * KiB
        rep = await compact(rig, target)
        after = await rig.segments()
        assert len(after) == rep.segments_after < len(before)
        assert len(after) <= math.ceil(total / target) + 1
        assert after[0].begin == before[0].begin and after[-1].end == before[-1].end
        assert await rig.read_back() == rig.payloads  # every entry once, in its place
        assert (await rig.verify()).ok
        # the old segments wait in deletion records; gc (lag 0) deletes them, no orphan left
        old = {s.uid for s in before} - {s.uid for s in after}
        assert all([await rig.metadata.exists(deletion_path(u)) for u in old])
        gc = await rig.gc()
        assert gc.ok and not gc.orphans_removed
        assert {d.segment for d in gc.deleted_segments} == {str(u) for u in old}
        assert all(d.state == "deleted" for d in gc.deleted_segments)
        assert rig.objects() == {k for s in after for k in (str(s.uid), f"{s.uid}-index")}
        assert await rig.read_back() == rig.payloads
        assert (await rig.verify()).ok

    async def test_a_reader_of_the_old_catalog_reads_until_the_lag_has_passed(
            self, rig: Rig) -> None:
        old = await rig.segments()
        await rig.gc()  # retention tracks the old segments
        await compact(rig, 64 * KiB, lag_ms=3_600_000)
        reader = TierReader(rig.metadata, rig.blob)
        got = {tuple(e.position): bytes(e.payload) for s in old  # the old catalog, read now
               async for e in reader.read_segment(s)}
        assert got == rig.payloads
        rec = DeletionRecord.decode((await rig.metadata.get(deletion_path(old[0].uid))).data,
                                    "x")
        assert rec.merged_into is not None and rec.not_before_ms > time.time() * 1000
        gc = await rig.gc()  # within the lag: nothing deleted
        assert gc.ok and not gc.deleted_segments and gc.lagging == len(old)
        assert all(streaming_data_key(s.uid) in rig.objects() for s in old)
        # retention's records of the old segments went with the merge; the merged are tracked
        assert not any([await rig.metadata.exists(segment_record_path(ML, s.uid))
                        for s in old])
        gc = await rig.gc(now=time.time() + 3601)
        assert gc.ok and len(gc.deleted_segments) == len(old)
        assert not any(streaming_data_key(s.uid) in rig.objects() for s in old)
        assert await rig.read_back() == rig.payloads

    async def test_two_merges_racing_one_wins_the_other_gives_up(self, rig: Rig) -> None:
        first, second = await asyncio.gather(compact(rig, 64 * KiB), compact(rig, 64 * KiB))
        merged = {m["into"] for r in (first, second) for m in r.merged}
        assert first.skipped or second.skipped  # the same groups: each swapped once
        segs = await rig.segments()
        assert {m["into"] for m in first.merged} | {m["into"] for m in second.merged} == merged
        assert merged <= {str(s.uid) for s in segs}  # every swap made is in the catalog
        assert await rig.read_back() == rig.payloads
        gc = await rig.gc()
        assert gc.ok and not gc.orphans_removed  # the losers deleted their own objects
        assert rig.objects() == {k for s in segs for k in (str(s.uid), f"{s.uid}-index")}

    async def test_a_stale_owner_cannot_swap(self, rig: Rig) -> None:
        fence = await take(rig.metadata, ML, "first")
        assert isinstance(fence, EpochFence)
        await rig.metadata.delete(f"/offloadd/owners/{ML}")  # its session "expired"
        assert await take(rig.metadata, ML, "second") is not None  # a newer owner
        before = await rig.info()
        with pytest.raises(Fenced):
            await compact(rig, 64 * KiB, fence=fence)
        assert (await rig.info()).SerializeToString() == before.SerializeToString()
        gc = await rig.gc()
        assert gc.ok and not gc.orphans_removed  # it deleted what it wrote
        assert await rig.read_back() == rig.payloads

    async def test_a_periodic_merger_reads_each_index_once(self, rig: Rig) -> None:
        class Counting(TierReader):
            reads = 0

            async def index(self, key: str) -> Any:
                Counting.reads += 1
                return await super().index(key)

        sizes: dict[uuid.UUID, int] = {}

        async def once() -> MergeReport:
            return await compact_topic(TOPIC, rig.metadata, Counting(rig.metadata, rig.blob),
                                       Uploads(rig.blob, ML, 4), NoFence(),
                                       merge_settings(64 * KiB), wall_ms=lambda: 0,
                                       sizes=sizes)

        first = await once()
        assert first.merged and Counting.reads == first.segments_before
        assert set(sizes) == {s.uid for s in await rig.segments()}  # old ones forgotten
        Counting.reads = 0
        second = await once()
        assert not second.merged and Counting.reads == 0
        assert await rig.read_back() == rig.payloads

    async def test_retention_still_deletes_merged_segments(self, rig: Rig) -> None:
        await compact(rig, 64 * KiB)
        await rig.gc()
        merged = await rig.segments()
        cfg = settings(retention__max_size_mbytes=0)  # delete all that may go
        rep = await rig.gc(cfg)
        assert rep.ok and rep.deleted_ledgers
        gone = {a.ledger_id for a in rep.deleted_ledgers}
        freed = [s for s in merged if set(s.ledger_ids()) <= gone]
        assert freed  # a merged segment whose every ledger went is deleted with them
        rep = await rig.gc(cfg)
        objects = rig.objects()
        assert all(streaming_data_key(s.uid) not in objects for s in freed)
        left = await rig.segments()
        assert left and all(s.uid in {m.uid for m in merged} for s in left)

