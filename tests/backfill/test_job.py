"""The backfill driver: planning and metadata edits alone, then whole runs on local[2] Spark
against the embedded metadata store and the filesystem tier."""

from __future__ import annotations

import math
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from offloadd import wiring
from offloadd._proto import mldataformats_pb2 as pb
from offloadd.backfill.job import BackfillFailed, run_backfill
from offloadd.backfill.plan import HistorySizes, closed_ledgers, make_plan
from offloadd.commit import epochs
from offloadd.errors import Conflict, IllegalTransition
from offloadd.ledger.local import LocalLedgerSource, ledger_files
from offloadd.metadata import managed_ledger
from offloadd.metadata.embedded import EmbeddedMetadataStore
from offloadd.model import Position, catalog
from offloadd.model.catalog import LedgerRange, reassign
from offloadd.read.verify import verify
from tests.backfill.support import TOPIC, Rig, make_rig, write_config, write_ledgers

MiB = 1024 * 1024
# Twelve ledgers of different sizes and entry sizes, ~6.3 MiB in all.
LEDGERS = [(300, 1000), (40, 20_000), (1, 100), (2000, 300), (50, 9000), (700, 1500),
           (10, 4000), (1200, 800), (3, 70_000), (900, 1100), (25, 30_000), (400, 900)]


def _info(ranges_per_segment: list[list[LedgerRange]]) -> tuple[pb.ManagedLedgerInfo,
                                                                list[uuid.UUID]]:
    info = pb.ManagedLedgerInfo()
    for lid in sorted({r.ledger_id for rs in ranges_per_segment for r in rs}):
        info.ledgerInfo.add(ledgerId=lid, entries=100, size=1000)
    uids = []
    for rs in ranges_per_segment:
        uid = uuid.uuid4()
        catalog.add_assigned(info, uid, rs, 1, catalog.driver_metadata("filesystem", {}))
        uids.append(uid)
    return info, uids


class TestReassign:
    """A redo gives an ASSIGNED segment a fresh uuid in place, wherever it sits."""

    def test_a_middle_segment_keeps_its_ranges_under_the_new_uuid(self) -> None:
        info, (_, b, _) = _info([[LedgerRange(1, 0, 9)], [LedgerRange(1, 10, 99),
                                                          LedgerRange(2, 0, 4)],
                                 [LedgerRange(2, 5, 99)]])
        before = [(s.uid, s.ranges) for s in catalog.segments(info)]
        new = uuid.uuid4()
        reassign(info, b, new, 2)
        after = [(s.uid, s.ranges) for s in catalog.segments(info)]
        assert after == [before[0], (new, before[1][1]), before[2]]
        assert all(not s.complete for s in catalog.segments(info))

    def test_an_offloaded_or_unknown_segment_is_refused(self) -> None:
        info, (a,) = _info([[LedgerRange(1, 0, 9)]])
        catalog.mark_offloaded(info, a, 3)
        with pytest.raises(IllegalTransition, match="offloaded to assigned"):
            reassign(info, a, uuid.uuid4(), 4)
        with pytest.raises(KeyError, match="no longer recorded"):
            reassign(info, uuid.uuid4(), uuid.uuid4(), 4)


class TestPlan:
    """Planning skips OFFLOADED segments, redoes ASSIGNED ones and splits what follows."""

    async def test_sizes_from_the_offset_files_match_the_entries_read(self, tmp_path: Path
                                                                      ) -> None:
        rig = await make_rig(tmp_path, LEDGERS[:4])
        md, src, info = await _open(rig)
        try:
            sizes = HistorySizes(src, closed_ledgers(info))
            first = info.ledgerInfo[0].ledgerId
            run = await src.read(TOPIC, first, 7, 123)
            assert sizes(Position(first, 124)) - sizes(Position(first, 7)) == len(run.data)
            second = info.ledgerInfo[1].ledgerId
            assert sizes(Position(second, 0)) == sizes(Position(first, 300))
            assert src.cumulative_bytes(first, 300) == sizes(Position(first, 300))
        finally:
            await md.close()

    async def test_plan_redoes_assigned_skips_offloaded_and_splits_the_rest(
            self, tmp_path: Path) -> None:
        rig = await make_rig(tmp_path, LEDGERS[:6])
        md, src, info = await _open(rig)
        try:
            l0, l1 = info.ledgerInfo[0].ledgerId, info.ledgerInfo[1].ledgerId
            done, pending = uuid.uuid4(), uuid.uuid4()
            drv = catalog.driver_metadata("filesystem", {})
            catalog.add_assigned(info, done, [LedgerRange(l0, 0, 99)], 1, drv)
            catalog.mark_offloaded(info, done, 2)
            catalog.add_assigned(info, pending, [LedgerRange(l0, 100, 299),
                                                 LedgerRange(l1, 0, 9)], 1, drv)
            plan = make_plan(info, TOPIC, HistorySizes(src, closed_ledgers(info)), MiB)
        finally:
            await md.close()
        assert plan.skipped == 1
        assert plan.work[0].redo and plan.work[0].uid == pending
        assert plan.start == Position(l1, 10)
        new = plan.work[1:]
        assert new and not any(w.redo for w in new)
        assert new[0].ranges[0] == LedgerRange(l1, 10, 39)
        covered = [(r.ledger_id, e) for w in plan.work for r in w.ranges
                   for e in range(r.first, r.last + 1)]
        assert len(covered) == len(set(covered)) == sum(n for n, _ in LEDGERS[:6]) - 100


async def _open(rig: Rig) -> tuple[EmbeddedMetadataStore, LocalLedgerSource,
                                   pb.ManagedLedgerInfo]:
    md = await EmbeddedMetadataStore.open(rig.settings.metadata.url[len("embedded:"):])
    info, _ = await managed_ledger.load(md, TOPIC.managed_ledger)
    return md, LocalLedgerSource(rig.settings.source.path, md), info


async def _segments(rig: Rig) -> list[catalog.Segment]:
    md, _, info = await _open(rig)
    await md.close()
    return catalog.segments(info)


async def _verify(rig: Rig) -> Any:
    md = await wiring.open_metadata(rig.settings)
    bs = await wiring.open_blobstore(rig.settings)
    try:
        src = wiring.local_view(LocalLedgerSource(rig.settings.source.path, md))
        return await verify(md, bs, src, [TOPIC],
                            grace_s=0.0)
    finally:
        await bs.close()
        await md.close()


def _no_spark() -> Any:
    raise AssertionError("Spark must not start for this run")


@pytest.mark.integration
class TestBackfillOnSpark:
    """Whole runs: upload, verify, rerun, failures, ownership."""

    @pytest.mark.timeout(180)
    async def test_closed_history_is_uploaded_in_target_sized_segments_that_verify(
            self, tmp_path: Path, spark: Any) -> None:
        cfg = write_config(tmp_path, segment_mbytes=1, block_bytes=256 * 1024)
        from offloadd import config

        settings = config.load(cfg)
        await write_ledgers(settings, TOPIC, LEDGERS, close_last=False)  # last ledger open
        rig = Rig(tmp_path, cfg, settings)
        report = await run_backfill(settings, TOPIC, spark=lambda: spark)

        segs = await _segments(rig)
        assert report.ok and report.offloaded_segments == report.new_segments == len(segs)
        assert all(s.complete for s in segs)
        md, src, info = await _open(rig)
        await md.close()
        open_ledger = info.ledgerInfo[-1]
        assert not open_ledger.HasField("entries")
        # Everything closed is covered, the open ledger is left to streaming.
        assert catalog.next_position(info) == Position(info.ledgerInfo[-2].ledgerId,
                                                       info.ledgerInfo[-2].entries)
        assert segs[-1].end.ledger_id == info.ledgerInfo[-2].ledgerId
        sizes = HistorySizes(src, closed_ledgers(info))
        frame = [sum(sizes.range_bytes(r) for r in s.ranges) for s in segs]
        largest_entry = max(size for _, size in LEDGERS) + 4 + 12
        assert all(MiB <= b < MiB + largest_entry for b in frame[:-1])
        assert report.bytes == sum(frame)
        n = sum(li.entries for li in closed_ledgers(info))
        assert report.size_lookups <= 2 + len(segs) * math.ceil(math.log2(n + 1))
        rep = await _verify(rig)
        assert rep.ok, rep.to_json()
        assert rep.topics[0].entries == n
        # each segment recorded what it costs in the tier: its objects as stored
        tier = [f for f in settings.blobstore.path.rglob("*")  # objects, not their .meta
                if f.is_file() and not {".uploads", ".meta"} & set(f.parts)]
        usage = [catalog.usage_of(s) for s in segs]
        assert all(u is not None for u in usage)
        assert sum(u.objects for u in usage if u) == len(tier)
        assert sum(u.stored_bytes for u in usage if u) == sum(f.stat().st_size for f in tier)

    @pytest.mark.timeout(180)
    async def test_a_rerun_skips_what_is_offloaded_and_starts_no_spark(
            self, tmp_path: Path, spark: Any) -> None:
        rig = await make_rig(tmp_path, LEDGERS[:5])
        first = await run_backfill(rig.settings, TOPIC, spark=lambda: spark)
        again = await run_backfill(rig.settings, TOPIC, spark=_no_spark)
        assert again.skipped_segments == first.offloaded_segments > 0
        assert again.new_segments == again.redone_segments == again.offloaded_segments == 0
        assert {s.uid for s in await _segments(rig)} == {uuid.UUID(u) for u in first.segments}

    @pytest.mark.timeout(180)
    async def test_a_failing_segment_stays_assigned_and_the_next_run_redoes_it(
            self, tmp_path: Path, spark: Any) -> None:
        rig = await make_rig(tmp_path, LEDGERS)
        md, _, info = await _open(rig)
        await md.close()
        victim = ledger_files(rig.settings.source.path, info.ledgerInfo[5].ledgerId).log
        hidden = victim.with_suffix(".hidden")
        os.rename(victim, hidden)
        with pytest.raises(BackfillFailed) as err:
            await run_backfill(rig.settings, TOPIC, spark=lambda: spark, max_attempts=2)
        failed = err.value.report
        assert failed.failed_segments >= 1
        assert failed.failed_attempts == 2 * failed.failed_segments
        assigned = [s for s in await _segments(rig) if not s.complete]
        assert len(assigned) == failed.failed_segments
        assert all(info.ledgerInfo[5].ledgerId in s.ledger_ids() for s in assigned)

        os.rename(hidden, victim)
        again = await run_backfill(rig.settings, TOPIC, spark=lambda: spark)
        assert again.redone_segments == failed.failed_segments and again.new_segments == 0
        segs = await _segments(rig)
        assert all(s.complete for s in segs)
        assert not {s.uid for s in assigned} & {s.uid for s in segs}  # redone under new uuids
        rep = await _verify(rig)
        assert rep.ok, rep.to_json()  # no orphans: the failed attempts' objects are gone

    @pytest.mark.timeout(120)
    async def test_a_topic_owned_by_another_session_is_refused_without_starting_spark(
            self, tmp_path: Path, spark: Any) -> None:
        rig = await make_rig(tmp_path, LEDGERS[:2])
        ml = TOPIC.managed_ledger
        other = await EmbeddedMetadataStore.open(rig.settings.metadata.url[len("embedded:"):])
        try:
            assert await epochs.try_acquire(other, ml, "daemon-a") == 1
            with pytest.raises(Conflict, match="owned by 'daemon-a'"):
                await run_backfill(rig.settings, TOPIC, spark=_no_spark)
        finally:
            await other.close()
        assert await _segments(rig) == []
        # Once the daemon's session is gone the backfill takes the topic at the next epoch,
        # and gives it back when done.
        await run_backfill(rig.settings, TOPIC, spark=lambda: spark, owner_id="backfill-x")
        md = await EmbeddedMetadataStore.open(rig.settings.metadata.url[len("embedded:"):])
        try:
            state = await epochs.read_state(md, ml)
            assert state is not None and (state.epoch, state.owner) == (2, "backfill-x")
            assert await epochs.current_owner(md, ml) is None
        finally:
            await md.close()
