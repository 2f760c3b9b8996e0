"""The segment state machine, as data (one table, tested alone).

::

    (new) ──assign──▶ ASSIGNED ──commit──▶ OFFLOADED ──delete──▶ DELETED
                         │  ▲                                      ▲
                       fail │ retry                                │
                         ▼  │                                      │
                        FAILED ────────────── abandon ─────────────┘ (objects removed)

ASSIGNED and OFFLOADED are persisted (``OffloadSegment.complete`` false/true). FAILED is the
live daemon's view of an ASSIGNED segment whose attempt failed and waits for its retry; a failed
segment is redone, over the same positions, before any newer segment is created. Self
transitions are allowed so idempotent retries (a commit replayed after a lost reply) are legal.
"""

from __future__ import annotations

import enum


class SegmentState(enum.Enum):
    ASSIGNED = "assigned"
    OFFLOADED = "offloaded"
    FAILED = "failed"
    DELETED = "deleted"


_TRANSITIONS: dict[SegmentState, frozenset[SegmentState]] = {
    SegmentState.ASSIGNED: frozenset({SegmentState.ASSIGNED, SegmentState.OFFLOADED,
                                      SegmentState.FAILED}),
    SegmentState.FAILED: frozenset({SegmentState.FAILED, SegmentState.ASSIGNED,
                                    SegmentState.DELETED}),
    SegmentState.OFFLOADED: frozenset({SegmentState.OFFLOADED, SegmentState.DELETED}),
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
