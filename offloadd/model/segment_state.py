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
legal. :func:`advance` raises :class:`~offloadd.errors.IllegalTransition` on anything else. The
catalog's edits (:mod:`offloadd.model.catalog`) call it with the state their records store, inside
the compare-and-set that writes the change: the stored state is the one checked, not a caller's
copy of it, and an illegal change is never written. It fails the attempt like any other error of
the commit (the topic is then failing and retries), never the process.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from offloadd.errors import IllegalTransition

__all__ = ["IllegalTransition", "SegmentState", "Tracked", "advance", "is_valid", "move_all",
           "stored"]

T = TypeVar("T")


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


def is_valid(src: SegmentState, dst: SegmentState) -> bool:
    return dst in _TRANSITIONS[src]


def advance(src: SegmentState, dst: SegmentState) -> SegmentState:
    """``dst``, if the table allows the move from ``src``; :class:`IllegalTransition` if not."""
    if not is_valid(src, dst):
        raise IllegalTransition(f"segment cannot go from {src.value} to {dst.value}")
    return dst


def stored(complete: bool) -> SegmentState:
    """The state a catalog record stores: its ``complete`` flag says ASSIGNED or OFFLOADED."""
    return SegmentState.OFFLOADED if complete else SegmentState.ASSIGNED


@dataclass(slots=True)
class Tracked:
    """One segment's state as a process follows it; it moves only through :func:`advance`."""

    state: SegmentState = SegmentState.NEW

    def to(self, dst: SegmentState) -> SegmentState:
        self.state = advance(self.state, dst)
        return self.state

    async def move(self, dst: SegmentState, write: Callable[[], Awaitable[T]]) -> T:
        """``write`` the change to ``dst`` and follow it: see :func:`move_all`."""
        return await move_all((self,), dst, write)


async def move_all(segments: Sequence[Tracked], dst: SegmentState,
                   write: Callable[[], Awaitable[T]]) -> T:
    """Move every one of ``segments`` to ``dst`` through ``write`` (the commit that records
    it): refused (:class:`IllegalTransition`) before anything is written if the table does not
    allow it for one of them; followed only once the write succeeded, so a failed write leaves
    each where it was (a retry starts from the state that is true)."""
    for seg in segments:
        advance(seg.state, dst)
    out = await write()
    for seg in segments:
        seg.state = dst
    return out
