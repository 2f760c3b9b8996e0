"""The segment state machine, as data: one table, tested alone, and the only way states change.

::

    NEW ──assign──▶ ASSIGNED ──commit──▶ OFFLOADED ──gc deletes its objects──▶ DELETED
     │                │  ▲                                                      ▲
     │              fail │ redo (same positions, fresh uuid)                    │
     │                ▼  │                                                      │
     └────fail─────▶ FAILED ───── recovery drops it (its ledgers are gone) ─────┘

    (a merge)  OFFLOADED ──replaced by a merged segment──▶ MERGED ──gc, after the lag──▶ DELETED
               the merged one: NEW ──▶ ASSIGNED ──▶ OFFLOADED, both in the merge's one swap

NEW: an attempt whose range is not recorded yet (a streaming segment being filled). ASSIGNED and
OFFLOADED are what the catalog stores: a segment's ``OffloadSegment`` records with
``complete = false`` are ASSIGNED, with ``complete = true`` OFFLOADED (:func:`stored`), and only
the commit stage's edits write that flag, each after its transition here. FAILED is the live
daemon's view of an attempt that failed and waits for its retry (nothing stores it: an ASSIGNED
record of a dead process is a failed attempt too); a recorded one is redone over the same
positions before any newer segment is created. DELETED is reached when gc has deleted every
object of a segment (``retention/gc.py``), or recovery drops an ASSIGNED segment whose ledgers
retention deleted first; it is terminal, and its records go with it.

MERGED (``offloadd compact``, :mod:`offloadd.offload.merge`): adjacent small OFFLOADED segments
leave the catalog in the one compare-and-set that records the segment merged from them. That
one's objects are complete before it is recorded, so it passes ASSIGNED and reaches OFFLOADED in
that same write (it is never stored ASSIGNED). A MERGED segment is no longer referenced; its
pending-deletion record keeps its objects for readers that still hold the old catalog until the
deletion lag has passed, and gc then deletes them (DELETED).

Self transitions are allowed, so idempotent retries (a commit replayed after a lost reply) are
legal. :func:`transition` raises :class:`IllegalTransition` on anything else.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["IllegalTransition", "SegmentState", "Tracked", "is_valid", "stored", "transition"]


class SegmentState(enum.Enum):
    NEW = "new"
    ASSIGNED = "assigned"
    OFFLOADED = "offloaded"
    FAILED = "failed"
    DELETED = "deleted"
    MERGED = "merged"


_TRANSITIONS: dict[SegmentState, frozenset[SegmentState]] = {
    SegmentState.NEW: frozenset({SegmentState.NEW, SegmentState.ASSIGNED, SegmentState.FAILED}),
    SegmentState.ASSIGNED: frozenset({SegmentState.ASSIGNED, SegmentState.OFFLOADED,
                                      SegmentState.FAILED}),
    SegmentState.FAILED: frozenset({SegmentState.FAILED, SegmentState.ASSIGNED,
                                    SegmentState.DELETED}),
    SegmentState.OFFLOADED: frozenset({SegmentState.OFFLOADED, SegmentState.DELETED,
                                       SegmentState.MERGED}),
    SegmentState.MERGED: frozenset({SegmentState.MERGED, SegmentState.DELETED}),
    SegmentState.DELETED: frozenset({SegmentState.DELETED}),
}


class IllegalTransition(Exception):
    pass


def is_valid(src: SegmentState, dst: SegmentState) -> bool:
    return dst in _TRANSITIONS[src]


def transition(src: SegmentState, dst: SegmentState) -> SegmentState:
    if not is_valid(src, dst):
        raise IllegalTransition(f"segment cannot go from {src.value} to {dst.value}")
    return dst


def stored(complete: bool) -> SegmentState:
    """The state a catalog record stores: its ``complete`` flag says ASSIGNED or OFFLOADED."""
    return SegmentState.OFFLOADED if complete else SegmentState.ASSIGNED


@dataclass
class Tracked:
    """One segment's state as a process follows it; it moves only through :func:`transition`."""

    state: SegmentState = SegmentState.NEW

    def to(self, dst: SegmentState) -> SegmentState:
        self.state = transition(self.state, dst)
        return self.state
