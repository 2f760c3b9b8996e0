"""Cut a topic's closed history into offload segments by binary search (pure, no I/O).

History is a list of ledgers in log order with their entry counts, and a starting position
(normally :func:`offloadd.model.catalog.next_position`: right after the last recorded segment).
Number its entries ``0 .. n-1`` across ledgers (the *global index*; free to compute from the
counts). The caller supplies one look-up::

    size_at(Position(ledger, e)) -> frame bytes of history before entry ``e`` of ``ledger``

monotone non-decreasing in log order, with ``e`` in ``0 .. entries`` (``entries`` is the end of the
ledger, the same bytes as entry 0 of the next one). Frame bytes are what streaming segments are
measured in: payload plus the 12-byte ``[int32 length][int64 entryId]`` frame of each entry. Only
differences are used, so any constant base is fine.

Boundaries follow the streaming roller (:mod:`offloadd.offload.roller`): a segment takes entries
until its frame bytes reach ``target``; the entry that crosses the target stays in it (so an entry
larger than the target makes a segment on its own). The last segment takes what is left and may
be smaller. Segments may span ledgers and ledgers may span segments.

Cost: each boundary is the smallest global index ``k`` with ``size_at(k) - size_at(begin) >=
target``, found by bisection over ``(begin, n]``: ``ceil(log2(n))`` look-ups per boundary plus two
for the ends, never a scan over entries.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise

from offloadd.model import Position
from offloadd.model.catalog import LedgerRange, Span

SizeAt = Callable[[Position], int]

__all__ = ["LedgerExtent", "SizeAt", "Split", "split_history"]


@dataclass(frozen=True)
class LedgerExtent:
    """A closed ledger of the history: entries ``0 .. entries - 1``."""

    ledger_id: int
    entries: int


@dataclass(frozen=True)
class Split(Span):
    """One planned segment: its ranges in log order and its frame bytes."""

    ranges: tuple[LedgerRange, ...]
    nbytes: int


class _Space:
    """Global index ↔ position over the non-empty ledgers (no look-ups)."""

    def __init__(self, ledgers: Sequence[LedgerExtent]) -> None:
        self.ledgers = [lx for lx in ledgers if lx.entries > 0]
        self.starts: list[int] = []
        n = 0
        for lx in self.ledgers:
            self.starts.append(n)
            n += lx.entries
        self.n = n

    def position(self, g: int) -> Position:
        if g >= self.n:
            last = self.ledgers[-1]
            return Position(last.ledger_id, last.entries)
        i = bisect_right(self.starts, g) - 1
        return Position(self.ledgers[i].ledger_id, g - self.starts[i])

    def index_of(self, start: Position) -> int:
        """The global index of ``start``, or of the first entry after it that exists."""
        for i, lx in enumerate(self.ledgers):
            if lx.ledger_id == start.ledger_id and start.entry_id < lx.entries:
                return self.starts[i] + max(start.entry_id, 0)
            if lx.ledger_id > start.ledger_id:
                return self.starts[i]
        return self.n

    def ranges(self, begin: int, end: int) -> tuple[LedgerRange, ...]:
        """Entries ``[begin, end)`` as per-ledger ranges."""
        out: list[LedgerRange] = []
        i = bisect_right(self.starts, begin) - 1
        g = begin
        while g < end:
            lx, base = self.ledgers[i], self.starts[i]
            stop = min(end, base + lx.entries)
            out.append(LedgerRange(lx.ledger_id, g - base, stop - 1 - base))
            g = stop
            i += 1
        return tuple(out)


def split_history(ledgers: Sequence[LedgerExtent], start: Position | None, target: int,
                  size_at: SizeAt) -> list[Split]:
    """Segments covering ``start`` .. the end of ``ledgers``, contiguous, in log order.

    ``start`` ``None`` means the first entry of the first ledger; a ``start`` past the end of its
    ledger, or in a ledger not listed, moves to the next ledger that has entries.
    """
    if target < 1:
        raise ValueError(f"target segment size {target} must be at least one byte")
    ids = [lx.ledger_id for lx in ledgers]
    if any(b <= a for a, b in pairwise(ids)):
        raise ValueError(f"ledgers must be in log order (increasing ids), got {ids}")
    space = _Space(ledgers)
    begin = 0 if start is None else space.index_of(start)
    if begin >= space.n:
        return []

    def at(g: int) -> int:
        return size_at(space.position(g))

    out: list[Split] = []
    base = at(begin)
    total = at(space.n)
    while begin < space.n:
        want = base + target
        if total < want:
            end, end_bytes = space.n, total
        else:
            # Invariant: at(hi) >= want (hi_bytes holds it); every index below lo falls short.
            lo, hi, hi_bytes = begin + 1, space.n, total
            while lo < hi:
                mid = (lo + hi) // 2
                b = at(mid)
                if b >= want:
                    hi, hi_bytes = mid, b
                else:
                    lo = mid + 1
            end, end_bytes = hi, hi_bytes
        out.append(Split(space.ranges(begin, end), end_bytes - base))
        begin, base = end, end_bytes
    return out
