"""The lakehouse as operators see it: per table rows, files, last snapshot and lag; the
warehouse's files and bytes (``offloadd status``, ``/metrics``, the dashboard).

Table lag is how far the table trails the tier: the committed entries after the table's last
projected position (``offloadd.last-position``), and how long the oldest of them has waited —
now minus the commit time of the oldest committed segment not fully in the table (0 when the
table has everything). It reads the table's current metadata and the managed ledger only.
"""

from __future__ import annotations

import asyncio
import fnmatch
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table

from offloadd.config import Settings
from offloadd.errors import NotFound
from offloadd.lakehouse import cleanup
from offloadd.lakehouse.tables import (
    catalog_properties,
    identifier,
    last_position,
    open_catalog,
    warehouse_location,
)
from offloadd.lakehouse.transactions import hidden_totals, last_held
from offloadd.metadata import managed_ledger
from offloadd.metadata.base import MetadataStore
from offloadd.model import Position, TopicName
from offloadd.model import catalog as segments_catalog

__all__ = ["TableLag", "TableStats", "lag", "lakehouse_status", "projected", "table_stats"]


@dataclass(frozen=True)
class TableLag:
    entries: int
    seconds: float


@dataclass(frozen=True)
class TableStats:
    topic: str
    table: str
    rows: int = 0
    data_files: int = 0
    data_bytes: int = 0
    snapshots: int = 0
    last_snapshot_id: int | None = None
    last_snapshot_ms: int | None = None
    last_position: str | None = None
    lag_entries: int | None = None  # None: the topic's managed ledger could not be read
    lag_seconds: float | None = None
    # read-committed (docs/lakehouse.md): entries held behind an undecided transaction (as of
    # the follower's last pass, or else of the table's last commit), and the running totals of
    # what it hid (markers, aborted and timed-out messages) and the transactions it decided
    held_entries: int = 0
    read_committed: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def lag(segments: Sequence[segments_catalog.Segment], last: Position | None,
        now_ms: int) -> TableLag:
    """Committed entries after ``last`` and the age of the oldest commit holding some."""
    entries, oldest = 0, None
    for seg in segments:
        if not seg.complete or (last is not None and seg.end <= last):
            continue
        for r in seg.ranges:
            first = r.first
            if last is not None and r.ledger_id == last.ledger_id:
                first = max(first, last.entry_id + 1)
            elif last is not None and r.ledger_id < last.ledger_id:
                continue
            entries += max(0, r.last - first + 1)
        if seg.offloaded_ms:
            oldest = seg.offloaded_ms if oldest is None else min(oldest, seg.offloaded_ms)
    seconds = max(0.0, (now_ms - oldest) / 1000) if entries and oldest is not None else 0.0
    return TableLag(entries, seconds)


def table_stats(topic: TopicName, table: Table | None, segments: Sequence[Any] | None,
                now_ms: int, *, held_entries: int | None = None) -> TableStats:
    """A table's figures (blocking: reads nothing but the loaded metadata). ``held_entries``:
    as the follower last saw them; by default as the table's last commit recorded them."""
    name = ".".join(identifier(topic))
    last = last_position(table) if table is not None else None
    lg = lag(segments, last, now_ms) if segments is not None else None
    base = TableStats(str(topic), name, last_position=str(last) if last else None,
                      lag_entries=lg.entries if lg else None,
                      lag_seconds=round(lg.seconds, 3) if lg else None)
    snap = table.current_snapshot() if table is not None else None
    if table is None or snap is None:
        return base
    s = snap.summary
    return TableStats(
        base.topic, name, int(s["total-records"] or 0) if s else 0,
        int(s["total-data-files"] or 0) if s else 0, int(s["total-files-size"] or 0) if s else 0,
        len(table.metadata.snapshots), snap.snapshot_id, snap.timestamp_ms, base.last_position,
        base.lag_entries, base.lag_seconds,
        last_held(table) if held_entries is None else held_entries,
        hidden_totals(table).to_json())


def projected(settings: Settings, names: Sequence[TopicName]) -> list[TopicName]:
    """The topics ``[lakehouse] topics`` selects."""
    pats = settings.lakehouse.topics
    return [t for t in names if not pats or any(fnmatch.fnmatchcase(str(t), p) for p in pats)]


async def lakehouse_status(settings: Settings, md: MetadataStore,
                           topics: Sequence[TopicName], now_ms: int, *,
                           catalog: Catalog | None = None,
                           warehouse: bool = True) -> dict[str, Any]:
    """``tables``: :class:`TableStats` per projected topic among ``topics``; ``warehouse``:
    its location, files and bytes (one listing of it: LIST requests on S3)."""
    cat = catalog if catalog is not None else await asyncio.to_thread(
        open_catalog, settings, create=False)
    tables = []
    for topic in projected(settings, topics):
        try:
            info, _ = await managed_ledger.load(md, topic.managed_ledger)
            segs: list[Any] | None = segments_catalog.segments(info)
        except NotFound:
            segs = None

        def load(t: TopicName = topic, c: Catalog = cat) -> Table | None:
            try:
                return c.load_table(identifier(t))
            except NoSuchTableError:
                return None

        table = await asyncio.to_thread(load)
        tables.append(table_stats(topic, table, segs, now_ms).to_json())
    out: dict[str, Any] = {"tables": tables}
    if warehouse:
        loc = warehouse_location(settings)
        use = await asyncio.to_thread(cleanup.usage, catalog_properties(settings), loc)
        out["warehouse"] = {"location": loc, "files": use.files, "bytes": use.bytes}
    return out
