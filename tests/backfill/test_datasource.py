"""``spark.read.format("offloadd")``: push-down bounds alone (pure, with hypothesis), then
DataFrames over a backfilled topic on local[2] Spark."""

from __future__ import annotations

import operator
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
import uvloop
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
    StringStartsWith,
)

from offloadd.backfill.datasource import Bounds, plan_partitions
from offloadd.backfill.job import run_backfill
from offloadd.metadata import managed_ledger
from offloadd.metadata.embedded import EmbeddedMetadataStore
from offloadd.model import Position, catalog
from offloadd.model.catalog import LedgerRange, Segment, SegmentKind
from tests.backfill.support import TOPIC, Rig, make_rig, source_truth

OPS: dict[type[Filter], Callable[[int, Any], bool]] = {
    EqualTo: operator.eq, GreaterThan: operator.gt, GreaterThanOrEqual: operator.ge,
    LessThan: operator.lt, LessThanOrEqual: operator.le, In: lambda v, vs: v in vs,
}


def _seg(*ranges: tuple[int, int, int]) -> Segment:
    return Segment(uuid.uuid4(), SegmentKind.STREAMING,
                   tuple(LedgerRange(*r) for r in ranges), True)


# Three segments over ledgers 3, 5 and 8 (entries 0..9 each), cut inside ledgers.
SEGMENTS = [_seg((3, 0, 6)), _seg((3, 7, 9), (5, 0, 2)), _seg((5, 3, 9), (8, 0, 9))]
POSITIONS = [Position(r.ledger_id, e) for s in SEGMENTS for r in s.ranges
             for e in range(r.first, r.last + 1)]
# Blocks of 3 entries within each ledger of each segment.
BLOCKS = {str(s.uid): [Position(r.ledger_id, e) for r in s.ranges
                       for e in range(r.first, r.last + 1, 3)] for s in SEGMENTS}


def _scan(bounds: Bounds, blocks_per_partition: int) -> list[Position]:
    """What the reader yields: each partition from its start, stopping where read() stops."""
    out: list[Position] = []
    for part in plan_partitions(SEGMENTS, bounds, BLOCKS, blocks_per_partition):
        seg_positions = [p for p in POSITIONS if part.segment.contains(p)]
        for pos in seg_positions:
            if pos < part.start:
                continue
            if (part.stop is not None and pos >= part.stop) or bounds.past(pos):
                break
            if bounds.accepts(pos):
                out.append(pos)
    return out


filters = st.one_of(
    st.builds(lambda cls, col, v: cls((col,), v),
              st.sampled_from([EqualTo, GreaterThan, GreaterThanOrEqual, LessThan,
                               LessThanOrEqual]),
              st.sampled_from(["ledger_id", "entry_id"]), st.integers(-1, 11)),
    st.builds(lambda col, vs: In((col,), tuple(vs)), st.sampled_from(["ledger_id", "entry_id"]),
              st.lists(st.integers(0, 10), max_size=4)),
)


class TestBounds:
    """Pushed filters prune partitions yet every matching row is still read exactly once."""

    @settings(max_examples=400, deadline=None)
    @given(fs=st.lists(filters, max_size=4), bpp=st.sampled_from([0, 1, 2]),
           span=st.one_of(st.none(), st.tuples(st.sampled_from(POSITIONS),
                                               st.sampled_from(POSITIONS))))
    def test_pruned_partitions_yield_exactly_the_matching_rows(
            self, fs: list[Filter], bpp: int, span: tuple[Position, Position] | None) -> None:
        bounds = Bounds(pos_from=span[0] if span else None, pos_to=span[1] if span else None)
        for f in fs:
            pushed = bounds.push(f)
            assert pushed is not None
            bounds = pushed

        def matches(p: Position) -> bool:
            if span and not span[0] <= p <= span[1]:
                return False
            return all(OPS[type(f)](p.ledger_id if cast(Any, f).attribute == ("ledger_id",)
                                    else p.entry_id, cast(Any, f).value) for f in fs)

        assert _scan(bounds, bpp) == [p for p in POSITIONS if matches(p)]

    def test_a_ledger_filter_keeps_only_the_segments_holding_that_ledger(self) -> None:
        bounds = Bounds().push(EqualTo(("ledger_id",), 8))
        assert bounds is not None
        parts = plan_partitions(SEGMENTS, bounds, None, 0)
        assert [p.segment for p in parts] == [SEGMENTS[2]]
        assert parts[0].start == Position(8, 0)

    def test_filters_it_cannot_apply_are_left_to_spark(self) -> None:
        assert Bounds().push(EqualTo(("payload",), b"x")) is None
        assert Bounds().push(StringStartsWith(("segment_uuid",), "a")) is None
        assert Bounds().push(EqualTo(("ledger_id",), 1.5)) is None
        assert Bounds().push(IsNotNull(("entry_id",))) == Bounds()


@pytest.fixture(scope="module")
def backfilled(tmp_path_factory: pytest.TempPathFactory, spark: Any) -> Rig:
    """A topic of eight ledgers (~3 MiB) backfilled in ~512 KiB segments."""
    root = tmp_path_factory.mktemp("tier")

    async def build() -> Rig:
        rig = await make_rig(root, [(200, 1000), (30, 9000), (1, 10), (900, 500), (64, 4096),
                                    (500, 700), (7, 30_000), (333, 1333)],
                             segment_mbytes=0.5, block_bytes=64 * 1024)
        await run_backfill(rig.settings, TOPIC, spark=lambda: spark)
        return rig

    rig: Rig = uvloop.run(build())
    return rig


def _read(spark: Any, rig: Rig, **options: str) -> Any:
    r = spark.read.format("offloadd").option("config", str(rig.config)).option("topic",
                                                                               str(TOPIC))
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def _committed(rig: Rig) -> list[Segment]:
    async def go() -> list[Segment]:
        md = await EmbeddedMetadataStore.open(rig.settings.metadata.url[len("embedded:"):])
        try:
            info, _ = await managed_ledger.load(md, TOPIC.managed_ledger)
        finally:
            await md.close()
        return [s for s in catalog.segments(info) if s.complete]

    return uvloop.run(go())


@pytest.mark.integration
class TestDataFrame:
    """The tier read as a DataFrame equals the source, in parallel and with push-down."""

    @pytest.mark.timeout(180)
    def test_row_count_and_checksum_equal_the_source(self, spark: Any, backfilled: Rig) -> None:
        from pyspark.sql import functions as F

        df = _read(spark, backfilled)
        segs = _committed(backfilled)
        assert df.rdd.getNumPartitions() == len(segs) > 2
        row = df.agg(F.count("*").alias("n"), F.sum(F.crc32("payload")).alias("crc"),
                     F.countDistinct("ledger_id", "entry_id").alias("distinct"),
                     F.countDistinct("segment_uuid").alias("segments")).first()
        n, crc = uvloop.run(source_truth(backfilled.settings, TOPIC))
        assert (row["n"], row["crc"], row["distinct"]) == (n, crc, n)
        assert row["segments"] == len(segs)

    @pytest.mark.timeout(180)
    def test_position_filters_prune_partitions_and_return_exactly_the_range(
            self, spark: Any, backfilled: Rig) -> None:
        from pyspark.sql import functions as F

        segs = _committed(backfilled)
        ledger = segs[len(segs) // 2].ranges[0].ledger_id
        df = _read(spark, backfilled).filter(
            (F.col("ledger_id") == ledger) & (F.col("entry_id") >= 10)
            & (F.col("entry_id") < 20))
        holding = [s for s in segs if ledger in s.ledger_ids()]
        assert df.rdd.getNumPartitions() <= len(holding) < len(segs)
        rows = sorted((r.ledger_id, r.entry_id) for r in df.collect())
        assert rows == [(ledger, e) for e in range(10, 20)]

    @pytest.mark.timeout(180)
    def test_from_and_to_bound_the_rows_in_log_order(self, spark: Any,
                                                     backfilled: Rig) -> None:
        segs = _committed(backfilled)
        start = Position(segs[1].ranges[0].ledger_id, segs[1].ranges[0].first + 3)
        stop = Position(segs[-2].end.ledger_id, segs[-2].end.entry_id)
        df = _read(spark, backfilled, **{"from": str(start), "to": str(stop)})
        got = [Position(r.ledger_id, r.entry_id) for r in df.collect()]
        everything = [Position(r.ledger_id, e) for s in segs for r in s.ranges
                      for e in range(r.first, r.last + 1)]
        assert sorted(got) == [p for p in everything if start <= p <= stop]
        assert df.rdd.getNumPartitions() == len(segs) - 2

    @pytest.mark.timeout(180)
    def test_block_range_partitions_read_the_same_rows(self, spark: Any,
                                                       backfilled: Rig) -> None:
        from pyspark.sql import functions as F

        df = _read(spark, backfilled, blocksPerPartition="2")
        assert df.rdd.getNumPartitions() > len(_committed(backfilled))
        row = df.agg(F.count("*").alias("n"), F.sum(F.crc32("payload")).alias("crc")).first()
        assert (row["n"], row["crc"]) == uvloop.run(source_truth(backfilled.settings, TOPIC))

    @pytest.mark.timeout(120)
    def test_a_topic_with_nothing_offloaded_reads_as_empty(self, spark: Any,
                                                          tmp_path: Path) -> None:
        rig = uvloop.run(make_rig(tmp_path, [(10, 100)]))
        assert _read(spark, rig).count() == 0
        assert _read(spark, rig, pushdown="false").count() == 0
