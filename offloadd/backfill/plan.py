"""Planning a backfill: the segments to upload, from the catalog and the store's offsets (pure,
but for the size look-ups, which read the embedded store's offset files).

``make_plan`` keeps the segments already OFFLOADED, redoes the ASSIGNED ones a killed run left
(their attempts failed) and cuts the closed ledgers after ``catalog.next_position`` into new
splits (:func:`offloadd.backfill.split.split_history`).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from offloadd._proto import mldataformats_pb2 as pb
from offloadd.backfill.split import LedgerExtent, Split, split_history
from offloadd.ledger.local import LocalLedgerSource
from offloadd.model import FRAME_OVERHEAD, Position, TopicName, catalog
from offloadd.model.catalog import LedgerRange, SegmentKind
from offloadd.model.segment_state import SegmentState, Tracked, stored

__all__ = ["HistorySizes", "Plan", "Work", "closed_ledgers", "make_plan"]


@dataclass
class Work:
    """One segment to upload: a new split, or an ASSIGNED record left by an earlier run."""

    uid: uuid.UUID
    ranges: tuple[LedgerRange, ...]
    nbytes: int
    redo: bool
    state: Tracked = field(default_factory=Tracked)

    def failed(self) -> None:
        """Its attempt failed: it is redone under a fresh uuid."""
        self.state.to(SegmentState.FAILED)
        self.redo = True

    @property
    def end(self) -> Position:
        return Position(self.ranges[-1].ledger_id, self.ranges[-1].last)


@dataclass
class Plan:
    topic: TopicName
    work: list[Work]
    skipped: int  # segments already OFFLOADED
    start: Position | None  # where the new splits begin
    size_lookups: int = 0


def _frame_total(li: pb.ManagedLedgerInfo.LedgerInfo) -> int:
    return li.size + FRAME_OVERHEAD * li.entries


class HistorySizes:
    """``size_at`` for the splitter over the closed ledgers of the embedded store.

    Whole ledgers are sized from their ``LedgerInfo`` (entries, payload size); a position inside
    a ledger costs one read of its ``.off`` file. Counts the reads it makes.
    """

    def __init__(self, source: LocalLedgerSource, ledgers: Sequence[pb.ManagedLedgerInfo.LedgerInfo]
                 ) -> None:
        self._source = source
        self._base: dict[int, int] = {}
        self._entries: dict[int, int] = {}
        total = 0
        for li in ledgers:
            self._base[li.ledgerId] = total
            self._entries[li.ledgerId] = li.entries
            total += _frame_total(li)
        self._end = {li.ledgerId: _frame_total(li) for li in ledgers}
        self.lookups = 0

    def __call__(self, pos: Position) -> int:
        base = self._base[pos.ledger_id]
        if pos.entry_id <= 0:
            return base
        if pos.entry_id >= self._entries[pos.ledger_id]:
            return base + self._end[pos.ledger_id]
        self.lookups += 1
        return base + self._source.cumulative_bytes(pos.ledger_id, pos.entry_id)

    def range_bytes(self, r: LedgerRange) -> int:
        """Frame bytes of ``r``; also for a ledger that is not closed (a daemon's ASSIGNED
        segment in the open ledger), read from its offsets alone."""
        if r.ledger_id in self._base:
            return self(Position(r.ledger_id, r.last + 1)) - self(Position(r.ledger_id, r.first))
        self.lookups += 2
        return (self._source.cumulative_bytes(r.ledger_id, r.last + 1)
                - self._source.cumulative_bytes(r.ledger_id, r.first))


def closed_ledgers(info: pb.ManagedLedgerInfo) -> list[pb.ManagedLedgerInfo.LedgerInfo]:
    """The ledgers whose ``LedgerInfo`` is closed (``entries`` set); only the last may be open."""
    return [li for li in info.ledgerInfo if li.HasField("entries")]


def make_plan(info: pb.ManagedLedgerInfo, topic: TopicName, sizes: HistorySizes,
              target: int) -> Plan:
    """Blocking (the size look-ups read files): run it in a worker thread."""
    segs = catalog.segments(info)
    skipped = sum(1 for s in segs if s.complete)
    # ASSIGNED records of an earlier run: their attempts failed (or were killed)
    work = [Work(s.uid, s.ranges, sum(sizes.range_bytes(r) for r in s.ranges), True,
                 Tracked(stored(s.complete)))
            for s in segs if s.kind is SegmentKind.STREAMING and not s.complete]
    for w in work:
        w.state.to(SegmentState.FAILED)
    start = catalog.next_position(info)
    closed = closed_ledgers(info)
    splits: list[Split] = split_history(
        [LedgerExtent(li.ledgerId, li.entries) for li in closed], start, target, sizes)
    work += [Work(uuid.uuid4(), s.ranges, s.nbytes, False) for s in splits]
    return Plan(topic, work, skipped, start, sizes.lookups)
