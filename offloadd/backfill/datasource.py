"""``spark.read.format("offloadd")``: a topic's committed segments as a DataFrame, no broker.

Schema (one row per entry)::

    ledger_id long, entry_id long, payload binary, segment_uuid string

Options:

==================== =====================================================================
``config``           path of the offloadd TOML config (default: built-in defaults + environment)
``topic``            ``persistent://tenant/ns/topic`` (required)
``from`` / ``to``    positions ``L:E``, inclusive: only entries in this range of the log
``blocksPerPartition`` split each segment into partitions of this many blocks (reads the
                     indexes while planning); 0, the default, is one partition per segment
``pushdown``         ``false`` turns filter push-down off (for sessions where
                     ``spark.sql.python.filterPushdown.enabled`` is not set; PySpark refuses
                     a reader with push-down there)
==================== =====================================================================

Planning (one Python worker on the driver) lists the committed segments from the metadata
store; each partition is read on an executor straight from the blob store through the project's
own driver and :class:`~offloadd.read.reader.TierReader` (every block checked: magic, lengths,
CRC32C). Push-down: comparisons (``=``, ``<``, ``<=``, ``>``, ``>=``, ``IN``) of ``ledger_id``
and ``entry_id`` against integers prune segments while planning, start each partition at the
first block that can match, and are applied exactly to the rows, so Spark need not re-check
them. Other filters stay with Spark.

Use :func:`offloadd.backfill.spark.session` (registers the source and enables push-down), or
call :func:`register` on an existing session.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.types import StructType

from offloadd import config as config_mod
from offloadd.config import Settings
from offloadd.errors import ConfigError
from offloadd.model import Position, TopicName
from offloadd.model.catalog import Segment, SegmentKind

SCHEMA = "ledger_id long, entry_id long, payload binary, segment_uuid string"
_COLUMNS = ("ledger_id", "entry_id")
_BATCH_ROWS = 4096


def register(spark: Any) -> None:
    """Register the source on ``spark`` and enable Python filter push-down."""
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(OffloaddDataSource)


# ---- bounds (pure) -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Bounds:
    """What rows may match: per-column intervals and sets, and a position range."""

    ledger_lo: int | None = None
    ledger_hi: int | None = None
    entry_lo: int | None = None
    entry_hi: int | None = None
    ledgers: frozenset[int] | None = None
    entries: frozenset[int] | None = None
    pos_from: Position | None = None
    pos_to: Position | None = None

    def accepts(self, pos: Position) -> bool:
        return (self._ledger_ok(pos.ledger_id) and self._entry_ok(pos.entry_id)
                and (self.pos_from is None or pos >= self.pos_from)
                and (self.pos_to is None or pos <= self.pos_to))

    def _ledger_ok(self, ledger_id: int) -> bool:
        return ((self.ledger_lo is None or ledger_id >= self.ledger_lo)
                and (self.ledger_hi is None or ledger_id <= self.ledger_hi)
                and (self.ledgers is None or ledger_id in self.ledgers))

    def _entry_ok(self, entry_id: int) -> bool:
        return ((self.entry_lo is None or entry_id >= self.entry_lo)
                and (self.entry_hi is None or entry_id <= self.entry_hi)
                and (self.entries is None or entry_id in self.entries))

    def first_in(self, ledger_id: int, first: int, last: int) -> Position | None:
        """The first position of ``ledger_id:first..last`` that may match, or None."""
        if not self._ledger_ok(ledger_id):
            return None
        lo, hi = first, last
        if self.entry_lo is not None:
            lo = max(lo, self.entry_lo)
        if self.entry_hi is not None:
            hi = min(hi, self.entry_hi)
        if self.pos_from is not None:
            if ledger_id < self.pos_from.ledger_id:
                return None
            if ledger_id == self.pos_from.ledger_id:
                lo = max(lo, self.pos_from.entry_id)
        if self.pos_to is not None:
            if ledger_id > self.pos_to.ledger_id:
                return None
            if ledger_id == self.pos_to.ledger_id:
                hi = min(hi, self.pos_to.entry_id)
        if self.entries is not None:
            inside = [e for e in self.entries if lo <= e <= hi]
            return Position(ledger_id, min(inside)) if inside else None
        return Position(ledger_id, lo) if lo <= hi else None

    def segment_start(self, seg: Segment) -> Position | None:
        """Where reading ``seg`` must start, or None when no entry of it can match."""
        for r in seg.ranges:
            pos = self.first_in(r.ledger_id, r.first, r.last)
            if pos is not None:
                return pos
        return None

    def past(self, pos: Position) -> bool:
        """True when no position at or after ``pos`` can match (the scan may stop)."""
        if self.pos_to is not None and pos > self.pos_to:
            return True
        if self.ledger_hi is not None and pos.ledger_id > self.ledger_hi:
            return True
        return self.ledgers is not None and pos.ledger_id > max(self.ledgers, default=-1)

    def push(self, f: Filter) -> Bounds | None:
        """These bounds narrowed by ``f``, or None when ``f`` is not one we apply."""
        attr: tuple[str, ...] = getattr(f, "attribute", ())
        if len(attr) != 1 or attr[0] not in _COLUMNS:
            return None
        col = attr[0]
        if isinstance(f, IsNotNull):
            return self  # our columns are never null
        if isinstance(f, In):
            values = f.value
            if not all(_is_int(v) for v in values):
                return None
            return self._with_set(col, frozenset(int(v) for v in values))
        value = getattr(f, "value", None)
        if not isinstance(value, int) or isinstance(value, bool):
            return None
        v = value
        if isinstance(f, EqualTo):
            return self._with_set(col, frozenset((v,)))
        if isinstance(f, GreaterThan):
            return self._with_lo(col, v + 1)
        if isinstance(f, GreaterThanOrEqual):
            return self._with_lo(col, v)
        if isinstance(f, LessThan):
            return self._with_hi(col, v - 1)
        if isinstance(f, LessThanOrEqual):
            return self._with_hi(col, v)
        return None

    def _with_lo(self, col: str, v: int) -> Bounds:
        if col == "ledger_id":
            return replace(self, ledger_lo=v if self.ledger_lo is None else max(self.ledger_lo, v))
        return replace(self, entry_lo=v if self.entry_lo is None else max(self.entry_lo, v))

    def _with_hi(self, col: str, v: int) -> Bounds:
        if col == "ledger_id":
            return replace(self, ledger_hi=v if self.ledger_hi is None else min(self.ledger_hi, v))
        return replace(self, entry_hi=v if self.entry_hi is None else min(self.entry_hi, v))

    def _with_set(self, col: str, values: frozenset[int]) -> Bounds:
        if col == "ledger_id":
            return replace(self, ledgers=values if self.ledgers is None
                           else self.ledgers & values)
        return replace(self, entries=values if self.entries is None else self.entries & values)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# ---- partitions --------------------------------------------------------------------------------

class SegmentPartition(InputPartition):
    """A segment, or the blocks of it from ``start`` up to (not including) ``stop``."""

    def __init__(self, segment: Segment, start: Position, stop: Position | None) -> None:
        super().__init__((str(segment.uid), str(start), str(stop) if stop else None))
        self.segment = segment
        self.start = start
        self.stop = stop


def plan_partitions(segments: Sequence[Segment], bounds: Bounds,
                    block_starts: dict[str, list[Position]] | None,
                    blocks_per_partition: int) -> list[SegmentPartition]:
    """Partitions for ``segments`` under ``bounds`` (pure). ``block_starts``: per segment uuid,
    the first position of each block in order (needed only when splitting by blocks)."""
    out: list[SegmentPartition] = []
    for seg in segments:
        start = bounds.segment_start(seg)
        if start is None:
            continue
        starts = (block_starts or {}).get(str(seg.uid))
        if blocks_per_partition <= 0 or not starts:
            out.append(SegmentPartition(seg, start, None))
            continue
        cuts = starts[::blocks_per_partition]
        for i, cut in enumerate(cuts):
            stop = cuts[i + 1] if i + 1 < len(cuts) else None
            if stop is not None and stop <= start:
                continue
            if bounds.past(max(cut, start)):
                break
            out.append(SegmentPartition(seg, max(cut, start), stop))
    return out


# ---- the data source ---------------------------------------------------------------------------

class OffloaddDataSource(DataSource):
    """``spark.read.format("offloadd").option("config", path).option("topic", t).load()``"""

    @classmethod
    def name(cls) -> str:
        return "offloadd"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = {k.lower(): v for k, v in self.options.items()}
        if str(opts.get("pushdown", "true")).lower() == "false":
            return OffloaddReader(opts)
        return PushdownReader(opts)


class OffloaddReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        path = options.get("config")
        self.config_path = os.path.abspath(path) if path else None
        topic = options.get("topic")
        if not topic:
            raise ConfigError('the offloadd data source needs .option("topic", '
                              '"persistent://tenant/ns/topic")')
        self.topic = TopicName.parse(topic)
        self.settings: Settings = _absolute(config_mod.load(self.config_path))
        try:
            self.bounds = Bounds(
                pos_from=Position.parse(options["from"]) if options.get("from") else None,
                pos_to=Position.parse(options["to"]) if options.get("to") else None)
            self.blocks_per_partition = int(options.get("blocksperpartition", "0"))
        except ValueError as exc:
            raise ConfigError(f"offloadd data source option: {exc}") from exc

    def partitions(self) -> list[InputPartition]:
        return list(_run(self._plan()))

    async def _plan(self) -> list[SegmentPartition]:
        from offloadd import wiring
        from offloadd.read.reader import TierReader

        md = await wiring.open_metadata(self.settings)
        try:
            bs = await wiring.open_blobstore(self.settings)
            try:
                reader = TierReader(md, bs)
                segs = [s for s in await reader.segments(self.topic)
                        if self.bounds.segment_start(s) is not None]
                starts: dict[str, list[Position]] = {}
                if self.blocks_per_partition > 0:
                    for s in segs:
                        starts[str(s.uid)] = await _block_starts(reader, s)
                return plan_partitions(segs, self.bounds, starts, self.blocks_per_partition)
            finally:
                await bs.close()
        finally:
            await md.close()

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, SegmentPartition):
            return iter(())  # Spark's stand-in partition when nothing matched
        return self._read(partition)

    def _read(self, part: SegmentPartition) -> Iterator[Any]:
        import pyarrow as pa
        import uvloop

        from offloadd import wiring
        from offloadd.metadata.memory import MemoryMetadataStore
        from offloadd.read.reader import TierReader

        schema = pa.schema([("ledger_id", pa.int64()), ("entry_id", pa.int64()),
                            ("payload", pa.binary()), ("segment_uuid", pa.string())])
        uid = str(part.segment.uid)
        loop = uvloop.new_event_loop()
        try:
            bs = loop.run_until_complete(wiring.open_blobstore(self.settings))
            # read_segment consults only the blob store; the metadata store is never used.
            reader = TierReader(MemoryMetadataStore(), bs,
                                prefetch=self.settings.offload.prefetch_blocks())
            entries = reader.read_segment(part.segment, part.start)
            try:
                while True:
                    rows, done = loop.run_until_complete(
                        _take(entries, _BATCH_ROWS, self.bounds, part.stop))
                    if rows[0]:
                        yield pa.RecordBatch.from_arrays(
                            [pa.array(rows[0], pa.int64()), pa.array(rows[1], pa.int64()),
                             pa.array(rows[2], pa.binary()),
                             pa.array([uid] * len(rows[0]), pa.string())], schema=schema)
                    if done:
                        break
            finally:
                loop.run_until_complete(entries.aclose())
                loop.run_until_complete(bs.close())
        finally:
            loop.close()


class PushdownReader(OffloaddReader):
    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        for f in filters:
            narrowed = self.bounds.push(f)
            if narrowed is None:
                yield f
            else:
                self.bounds = narrowed


async def _take(entries: AsyncIterator[Any], n: int, bounds: Bounds, stop: Position | None
                ) -> tuple[tuple[list[int], list[int], list[bytes]], bool]:
    """Up to ``n`` matching rows; ``done`` once the partition has nothing more to give."""
    lids: list[int] = []
    eids: list[int] = []
    payloads: list[bytes] = []
    async for e in entries:
        pos = e.position
        if (stop is not None and pos >= stop) or bounds.past(pos):
            return (lids, eids, payloads), True
        if bounds.accepts(pos):
            lids.append(pos.ledger_id)
            eids.append(pos.entry_id)
            payloads.append(bytes(e.payload))
            if len(lids) >= n:
                return (lids, eids, payloads), False
    return (lids, eids, payloads), True


async def _block_starts(reader: Any, seg: Segment) -> list[Position]:
    from offloadd.format import LedgerIndex, StreamingIndex
    from offloadd.model.keys import ledger_index_key, streaming_index_key

    if seg.kind is SegmentKind.STREAMING:
        idx = await reader.index(streaming_index_key(seg.uid))
        assert isinstance(idx, StreamingIndex)
        return [Position(r.ledger_id, b.first_entry_id) for r in seg.ranges
                for b in idx.section(r.ledger_id).blocks]
    (r,) = seg.ranges
    lidx = await reader.index(ledger_index_key(seg.uid, r.ledger_id))
    assert isinstance(lidx, LedgerIndex)
    return [Position(r.ledger_id, b.first_entry_id) for b in lidx.blocks]


def _run(coro: Any) -> Any:
    import uvloop

    return uvloop.run(coro)


def _absolute(settings: Settings) -> Settings:
    from offloadd.backfill.task import absolute_paths

    return absolute_paths(settings)
