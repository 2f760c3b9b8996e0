"""Offload thresholds: how much of a topic's newest data stays only in the source (pure).

Pulsar's ``managedLedgerOffloadThresholdInBytes`` and ``...ThresholdInSeconds`` (broker, namespace
or topic policy) keep recent data in BookKeeper and offload only what is older or lies further
back. Here they limit how far the streaming offloader may read:

- **bytes**: an entry may be offloaded once at least ``bytes`` of payload follow it in the topic
  (the newest ``bytes`` stay only in the source);
- **seconds**: an entry may be offloaded once it is at least ``seconds`` old;
- both set: either suffices (as in Pulsar); neither (negative, the default): no holding back.

Unlike Pulsar, where both at -1 means "never offload automatically", offloadd always offloads:
without thresholds it streams everything as soon as the roller closes a segment.

How old an entry is and how many bytes follow it are known from **marks**: the topic's tail
(its last readable entry), the payload bytes up to it, and the wall time when it was so. A
closed ledger followed by another gives an exact mark (all its entries were readable when the
next one was created); the offloader adds a mark each time it looks at the topic (at most one a
second). An entry between two marks is judged by the later one, so entries are never offloaded
early, only up to one mark's spacing late. After a restart the open ledger's entries count
from the first look (they wait at most one more threshold).

:class:`TailLog` keeps the marks; :meth:`TailLog.clip` gives the ledger list as the offloader
should see it: cut at the last entry it may offload now.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace

from offloadd.model import LedgerDesc, LedgerState, Position

__all__ = ["Mark", "TailLog", "Thresholds", "eligible_end", "ledger_marks"]

MARK_SPACING_MS = 1000  # an observed mark is kept at most once a second


@dataclass(frozen=True)
class Thresholds:
    bytes: int | None = None
    seconds: float | None = None

    @classmethod
    def from_config(cls, nbytes: int, seconds: float) -> Thresholds:
        """Pulsar's convention: negative means unset."""
        return cls(nbytes if nbytes >= 0 else None, seconds if seconds >= 0 else None)

    @property
    def active(self) -> bool:
        return bool(self.bytes) or bool(self.seconds)


@dataclass(frozen=True, slots=True)
class Mark:
    """The tail was ``position``, with ``cum_bytes`` of payload up to and including it, at
    ``wall_ms``."""

    position: Position
    cum_bytes: int
    wall_ms: int


def tail_mark(ledgers: Sequence[LedgerDesc], now_ms: int) -> Mark | None:
    """The topic's tail as of now, or None while it holds no entry."""
    cum = 0
    tail: Position | None = None
    for d in ledgers:
        cum += d.size
        if d.last_entry_id >= 0:
            tail = Position(d.ledger_id, d.last_entry_id)
    return Mark(tail, cum, now_ms) if tail is not None else None


def ledger_marks(ledgers: Sequence[LedgerDesc]) -> list[Mark]:
    """Exact marks from ledger boundaries: a closed ledger's last entry was readable when the
    ledger after it was created."""
    out: list[Mark] = []
    cum = 0
    for d, nxt in itertools.pairwise(ledgers):
        cum += d.size
        if d.state is LedgerState.CLOSED and d.last_entry_id >= 0:
            out.append(Mark(Position(d.ledger_id, d.last_entry_id), cum, nxt.ctime_ms))
    return out


def eligible_end(thresholds: Thresholds, marks: Sequence[Mark], tail: Mark | None,
                 now_ms: int) -> Position | None:
    """The last position that may be offloaded at ``now_ms``; None when nothing may.

    ``marks`` in log order (positions and times rising); ``tail`` is the topic's tail now.
    """
    if tail is None:
        return None
    if not thresholds.active:
        return tail.position
    best: Position | None = None
    for m in marks:
        if m.position > tail.position:
            break
        ok = thresholds.bytes is not None and tail.cum_bytes - m.cum_bytes >= thresholds.bytes
        ok = ok or (thresholds.seconds is not None
                    and now_ms - m.wall_ms >= thresholds.seconds * 1000)
        if ok and (best is None or m.position > best):
            best = m.position
    if thresholds.bytes == 0 or thresholds.seconds == 0:
        best = tail.position  # a zero threshold holds nothing back
    return best


def clip(ledgers: Sequence[LedgerDesc], end: Position | None,
         cum_at_end: int | None) -> list[LedgerDesc]:
    """``ledgers`` as if the topic ended at ``end``: later ledgers dropped, ``end``'s ledger
    shown open (more of it may become eligible) and sized up to ``end`` (``cum_at_end`` =
    payload bytes up to and including ``end``)."""
    if end is None:
        return [replace(d, state=LedgerState.OPEN, last_entry_id=-1, size=0)
                for d in ledgers[:1]]
    out: list[LedgerDesc] = []
    cum = 0
    for d in ledgers:
        if d.ledger_id < end.ledger_id:
            out.append(d)
            cum += d.size
        elif d.ledger_id == end.ledger_id:
            if d.last_entry_id <= end.entry_id:
                out.append(d)
            else:
                size = (cum_at_end - cum) if cum_at_end is not None else d.size
                out.append(replace(d, state=LedgerState.OPEN, last_entry_id=end.entry_id,
                                   size=max(size, 0)))
            break
    return out


class TailLog:
    """Marks observed on one topic, thinned to one a second and dropped once behind the
    offloader's position. Holds no clock: the caller passes wall time in."""

    # one per topic: 10,000 of them (issue 22), no instance dict
    __slots__ = ("_marks",)

    def __init__(self) -> None:
        self._marks: list[Mark] = []

    def __len__(self) -> int:
        return len(self._marks)

    def clip(self, thresholds: Thresholds, ledgers: Sequence[LedgerDesc], now_ms: int,
             done: Position | None = None) -> list[LedgerDesc]:
        """Record the tail now; return ``ledgers`` cut at what may be offloaded now.
        ``done``: the offloader's position (marks before it are forgotten)."""
        if not thresholds.active:
            self._marks.clear()
            return list(ledgers)
        tail = tail_mark(ledgers, now_ms)
        if tail is not None:
            last = self._marks[-1] if self._marks else None
            if last is None or (tail.position > last.position
                                and now_ms - last.wall_ms >= MARK_SPACING_MS):
                self._marks.append(tail)
        if done is not None:
            keep = bisect.bisect_left([m.position for m in self._marks], done)
            del self._marks[:max(keep - 1, 0)]
        marks = list(heapq.merge(ledger_marks(ledgers), self._marks,
                                 key=lambda m: (m.position, m.wall_ms)))
        end = eligible_end(thresholds, marks, tail, now_ms)
        if end is not None and tail is not None and end == tail.position:
            return list(ledgers)
        cum = next((m.cum_bytes for m in marks if m.position == end), None)
        return clip(ledgers, end, cum)
