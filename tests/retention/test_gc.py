"""Retention and gc on the embedded store with a filesystem tier.

Every test starts from the same topic: 60 entries in ledgers of 10, offloaded in segments of
25 entries (the last one closed by a trigger)::

    ledger   0          1          2          3          4          5          6 (open, empty)
    S1       [0..9]     [0..9]     [0..4]
    S2                             [5..9]     [0..9]     [0..9]
    S3                                                              [0..9]
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from offloadd import wiring
from offloadd.errors import NotFound
from offloadd.ledger.local import ledger_files
from offloadd.metadata import managed_ledger
from offloadd.metadata.embedded import EmbeddedMetadataStore
from offloadd.model import catalog
from offloadd.model.catalog import LedgerRange, Segment
from offloadd.model.keys import (
    deletion_path,
    ledger_data_key,
    managed_ledger_path,
    segment_record_path,
    segment_records_path,
    streaming_data_key,
    streaming_index_key,
)
from offloadd.retention.gc import gc_pass
from offloadd.retention.policy import DeletionRecord, SegmentRecord
from tests.retention.rig import TOPIC, Rig, settings

pytestmark = pytest.mark.timeout(60)

ML = TOPIC.managed_ledger


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    r = await Rig.open(tmp_path)
    try:
        await r.write(60)
        await r.offload_all()
        yield r
    finally:
        await r.close()


async def layout(rig: Rig) -> tuple[Segment, Segment, Segment]:
    s1, s2, s3 = await rig.segments()
    assert [r.ledger_id for r in s1.ranges] == [0, 1, 2]
    assert [r.ledger_id for r in s2.ranges] == [2, 3, 4]
    assert [r.ledger_id for r in s3.ranges] == [5]
    return s1, s2, s3


def objects_of(seg: Segment) -> set[str]:
    return {streaming_data_key(seg.uid), streaming_index_key(seg.uid)}


def payloads_of(rig: Rig, ledgers: set[int]) -> dict[tuple[int, int], bytes]:
    return {pos: p for pos, p in rig.payloads.items() if pos[0] in ledgers}


async def verify_ok(rig: Rig) -> None:
    rep = await rig.verify()
    assert rep.ok, rep.to_json()


class Probe:
    """Shaped like offloadd.metrics.Metrics: a per-topic probe with delete_op(succeeded)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bool]] = []

    def topic_named(self, topic: str) -> Probe.Topic:
        return Probe.Topic(self, topic)

    class Topic:
        def __init__(self, probe: Probe, topic: str) -> None:
            self.probe, self.topic = probe, topic

        def delete_op(self, succeeded: bool = True) -> None:
            self.probe.calls.append((self.topic, succeeded))


class TestPartialDeletion:
    """A segment's objects go only when every ledger it touches is deleted."""

    async def test_deleting_part_of_a_segment_keeps_it_deleting_the_rest_removes_it(
            self, rig: Rig) -> None:
        s1, s2, s3 = await layout(rig)
        first = await rig.gc()
        assert first.tracked == 3 and first.ok

        await rig.delete_ledgers([0, 1])  # S1 keeps ledger 2
        rep = await rig.gc()
        assert rep.ok and rep.deleted_segments == []
        assert {(m.ledger_id, m.segment) for m in rep.marked} == {(0, str(s1.uid)),
                                                                 (1, str(s1.uid))}
        assert objects_of(s1) | objects_of(s2) | objects_of(s3) <= rig.objects()
        node = await rig.metadata.get(segment_record_path(ML, s1.uid))
        assert SegmentRecord.decode(node.data, "").deleted == (0, 1)
        assert await rig.read_back() == payloads_of(rig, {2, 3, 4, 5})
        await verify_ok(rig)

        await rig.delete_ledgers([2])  # the last of S1; S2 loses its first ledger
        rep = await rig.gc()
        assert rep.ok and [d.segment for d in rep.deleted_segments] == [str(s1.uid)]
        assert rig.objects() == objects_of(s2) | objects_of(s3)
        assert not await rig.metadata.exists(segment_record_path(ML, s1.uid))
        assert not await rig.metadata.exists(deletion_path(s1.uid))
        assert await rig.read_back() == payloads_of(rig, {3, 4, 5})
        await verify_ok(rig)

        again = await rig.gc()
        assert again.ok and again.deleted_segments == [] and again.marked == []

    async def test_concurrent_passes_agree(self, rig: Rig) -> None:
        s1, s2, s3 = await layout(rig)
        await rig.gc()
        await rig.delete_ledgers([0, 1, 2])
        other = await EmbeddedMetadataStore.open(rig.tmp / "metadata")  # a second client
        try:
            reps = await asyncio.gather(
                rig.gc(), gc_pass(other, wiring.filesystem_view(rig.blob),
                                  wiring.local_view(rig.store.source),
                                  wiring.gc_settings(settings()),
                                  now=time.time(), grace_s=0))
        finally:
            await other.close()
        assert all(r.ok for r in reps), [r.to_json() for r in reps]
        assert {d.segment for r in reps for d in r.deleted_segments} == {str(s1.uid)}
        assert rig.objects() == objects_of(s2) | objects_of(s3)
        assert not await rig.metadata.exists(deletion_path(s1.uid))

    async def test_a_deleted_topic_takes_all_its_segments_with_it(self, rig: Rig) -> None:
        await rig.gc()
        await rig.store.writer.close()
        await rig.metadata.delete(managed_ledger_path(ML))
        rep = await rig.gc()
        assert rep.ok and len(rep.deleted_segments) == 3
        assert rig.objects() == set()
        assert not await rig.metadata.exists(segment_records_path(ML))


class TestFailedDeletions:
    """A failed deletion is recorded with its error and retried until it succeeds."""

    async def test_injected_delete_failures_are_retried_on_the_next_pass(
            self, rig: Rig) -> None:
        s1, s2, s3 = await layout(rig)
        await rig.gc()
        await rig.delete_ledgers([0, 1, 2])
        rig.blob.fails = lambda key: True
        probe = Probe()
        for attempt in (1, 2):
            rep = await gc_pass(rig.metadata, wiring.filesystem_view(rig.blob),
                                wiring.local_view(rig.store.source), wiring.gc_settings(settings()),
                                now=time.time(), grace_s=0, probe=probe)
            assert not rep.ok
            (failed,) = rep.failed
            assert failed.segment == str(s1.uid) and failed.attempts == attempt
            assert "injected failure" in (failed.error or "")
            node = await rig.metadata.get(deletion_path(s1.uid))
            rec = DeletionRecord.decode(node.data, "")
            assert rec.attempts == attempt and "injected failure" in (rec.last_error or "")
            assert objects_of(s1) <= rig.objects()
        assert probe.calls == [(str(TOPIC), False), (str(TOPIC), False)]
        # pending objects are tracked, not orphans: verify stays clean meanwhile
        await verify_ok(rig)

        rig.blob.fails = lambda key: False
        rep = await gc_pass(rig.metadata, wiring.filesystem_view(rig.blob),
                                wiring.local_view(rig.store.source), wiring.gc_settings(settings()),
                            now=time.time(), grace_s=0, probe=probe)
        assert rep.ok and [d.segment for d in rep.deleted_segments] == [str(s1.uid)]
        assert rep.deleted_segments[0].attempts == 2
        assert probe.calls[-1] == (str(TOPIC), True)
        assert rig.objects() == objects_of(s2) | objects_of(s3)
        assert not await rig.metadata.exists(deletion_path(s1.uid))
        await verify_ok(rig)

    async def test_a_half_done_deletion_finishes_on_retry(self, rig: Rig) -> None:
        s1, _, _ = await layout(rig)
        await rig.gc()
        await rig.delete_ledgers([0, 1, 2])
        data = streaming_data_key(s1.uid)
        rig.blob.fails = lambda key: key == data  # the index goes, the data object stays
        rep = await rig.gc()
        assert len(rep.failed) == 1 and data in (rep.failed[0].error or "")
        assert streaming_index_key(s1.uid) not in rig.objects() and data in rig.objects()
        rig.blob.fails = lambda key: False
        rep = await rig.gc()
        assert rep.ok and objects_of(s1).isdisjoint(rig.objects())


class TestOrphans:
    """gc removes what nothing references, and never what a managed ledger references."""

    async def test_planted_orphans_go_committed_and_assigned_objects_stay(
            self, rig: Rig) -> None:
        s1, s2, s3 = await layout(rig)
        ghost = uuid.uuid4()
        planted = {streaming_data_key(ghost), streaming_index_key(ghost),
                   ledger_data_key(uuid.uuid4(), 3)}
        for key in planted | {"notes/readme.txt"}:
            await rig.blob.put(key, [b"x"], {})
        # an assigned segment (upload in progress) with its data object already there
        await rig.write(5)
        pending = uuid.uuid4()

        def assign(info: managed_ledger.ManagedLedgerInfo) -> bool:
            return catalog.add_assigned(info, pending, [LedgerRange(6, 0, 4)], 1,
                                        catalog.driver_metadata("filesystem", {}))

        await managed_ledger.update(rig.metadata, ML, assign)
        await rig.blob.put(streaming_data_key(pending), [b"partial"], {})
        committed = objects_of(s1) | objects_of(s2) | objects_of(s3)

        young = await rig.gc(grace_s=3600)
        assert young.orphans_removed == [] and planted <= rig.objects()

        rep = await rig.gc(grace_s=0)
        assert rep.ok and set(rep.orphans_removed) == planted
        assert rig.objects() == committed | {"notes/readme.txt", streaming_data_key(pending)}

    async def test_a_segment_deleted_before_gc_ever_saw_it_is_swept_as_an_orphan(
            self, rig: Rig) -> None:
        s1, s2, s3 = await layout(rig)
        await rig.delete_ledgers([0, 1, 2])  # no record of S1 was ever made
        kept = await rig.gc(grace_s=3600)
        assert kept.deleted_segments == [] and objects_of(s1) <= rig.objects()
        rep = await rig.gc(grace_s=0)
        assert set(rep.orphans_removed) == objects_of(s1)
        assert rig.objects() == objects_of(s2) | objects_of(s3)
        await verify_ok(rig)

    async def test_a_deletion_record_for_a_live_segment_is_refused(self, rig: Rig) -> None:
        _, s2, _ = await layout(rig)
        await rig.gc()
        bogus = DeletionRecord(s2.uid, ML, s2.kind, s2.ledger_ids(), 0)
        await rig.metadata.create(deletion_path(s2.uid), bogus.encode())
        rep = await rig.gc()
        assert not rep.ok and len(rep.refused) == 1 and str(s2.uid) in rep.refused[0]
        assert objects_of(s2) <= rig.objects()
        assert not await rig.metadata.exists(deletion_path(s2.uid))
        assert (await rig.gc()).ok
        await verify_ok(rig)

    async def test_a_dry_run_reports_and_changes_nothing(self, rig: Rig) -> None:
        s1, _, _ = await layout(rig)
        await rig.gc()
        await rig.delete_ledgers([0, 1, 2])
        ghost = streaming_data_key(uuid.uuid4())
        await rig.blob.put(ghost, [b"x"], {})
        before = rig.objects()
        rep = await rig.gc(dry_run=True)
        assert rep.dry_run and [d.segment for d in rep.deleted_segments] == [str(s1.uid)]
        assert rep.orphans_removed == [ghost]
        assert rig.objects() == before
        assert await rig.metadata.exists(segment_record_path(ML, s1.uid))
        assert not await rig.metadata.exists(deletion_path(s1.uid))
        assert json.loads(json.dumps(rep.to_json()))["dry_run"] is True


class TestTopicRetention:
    """Time and size retention delete the oldest offloaded ledgers, then their objects."""

    async def test_size_retention_deletes_a_prefix_and_frees_whole_segments(
            self, rig: Rig) -> None:
        s1, s2, s3 = await layout(rig)
        # 60 KiB of payload; at 30 KiB the rule stops after ledgers 0, 1, 2
        cfg = settings(retention__max_size_mbytes=30 / 1024)
        before = rig.objects()
        dry = await rig.gc(cfg, dry_run=True)
        assert dry.ok and [a.ledger_id for a in dry.deleted_ledgers] == [0, 1, 2]
        assert [d.segment for d in dry.deleted_segments] == [str(s1.uid)]
        assert rig.objects() == before and await rig.ledger_ids() == list(range(7))

        rep = await rig.gc(cfg)
        assert rep.ok and [a.ledger_id for a in rep.deleted_ledgers] == [0, 1, 2]
        assert [d.segment for d in rep.deleted_segments] == [str(s1.uid)]
        assert await rig.ledger_ids() == [3, 4, 5, 6]
        assert rig.objects() == objects_of(s2) | objects_of(s3)
        assert await rig.read_back() == payloads_of(rig, {3, 4, 5})
        await verify_ok(rig)

    async def test_retention_keeps_the_offloaders_ledger_and_all_after_it(
            self, rig: Rig) -> None:
        _, _, s3 = await layout(rig)
        await rig.write(12)  # ledger 6 full and closed but not offloaded; 7 open
        rep = await rig.gc(settings(retention__max_size_mbytes=0))
        # ledger 5 holds the end of the last committed segment: the offloader's cursor
        assert [a.ledger_id for a in rep.deleted_ledgers] == [0, 1, 2, 3, 4]
        assert await rig.ledger_ids() == [5, 6, 7]
        assert len(rep.deleted_segments) == 2 and rig.objects() == objects_of(s3)
        await verify_ok(rig)

    async def test_time_retention_waits_for_the_age(self, rig: Rig) -> None:
        await layout(rig)
        cfg = settings(retention__max_age_minutes=1)
        assert (await rig.gc(cfg)).deleted_ledgers == []
        rep = await rig.gc(cfg, now=time.time() + 120)
        assert [a.ledger_id for a in rep.deleted_ledgers] == [0, 1, 2, 3, 4]
        assert len(rep.deleted_segments) == 2


class TestSourceTrim:
    """Local copies of offloaded ledgers go after the deletion lag; reads use the tier."""

    async def test_local_copies_go_only_after_the_lag(self, rig: Rig) -> None:
        await layout(rig)
        cfg = settings(retention__trim_source=True, offload__deletion_lag_ms=60_000)
        path = rig.store.source.path
        assert (await rig.gc(cfg)).trimmed == []
        assert all(ledger_files(path, lid).log.exists() for lid in range(7))

        rep = await rig.gc(cfg, now=time.time() + 120)
        assert rep.ok and sorted(a.ledger_id for a in rep.trimmed) == [0, 1, 2, 3, 4, 5]
        assert not any(p.exists() for lid in range(6) for p in ledger_files(path, lid).all())
        assert ledger_files(path, 6).log.exists()  # the current ledger stays
        info = await rig.info()
        assert [li.offloadContext.bookkeeperDeleted for li in info.ledgerInfo] == \
            [True] * 6 + [False]
        assert await rig.ledger_ids() == list(range(7))
        assert await rig.read_back() == rig.payloads
        await verify_ok(rig)
        assert (await rig.gc(cfg, now=time.time() + 120)).trimmed == []

    async def test_trimmed_ledgers_can_still_be_deleted_by_retention(self, rig: Rig) -> None:
        await layout(rig)
        later = time.time() + 120
        await rig.gc(settings(retention__trim_source=True, offload__deletion_lag_ms=0),
                     now=later)
        rep = await rig.gc(settings(retention__max_age_minutes=1), now=later)
        assert [a.ledger_id for a in rep.deleted_ledgers] == [0, 1, 2, 3, 4]
        assert len(rep.deleted_segments) == 2
        with pytest.raises(NotFound):
            await rig.store.source.read(TOPIC, 0, 0, 0)
