"""How far the tier trails a topic: from the last *committed* position to the source's LAC.

Lag is what is confirmed in the topic but not yet committed to the tier, in entries, payload
bytes and seconds (the age of the oldest such entry)::

      committed ─┐          ┌─ first uncommitted entry (its age is lag_seconds)
                 ▼          ▼
    ledger 7: ... 7:41 7:42 | 7:43 ... 7:99 (closed)      lag_entries = 57 + 12
    ledger 9:               | 9:0 ... 9:11 (open, LAC 11) lag_bytes   = their payload bytes

It is measured from the commit, never from the offloader's read position (entries read into an
open segment are not in the tier yet), and by a loop of its own (:class:`LagMonitor`, driven by
the daemon every ``[daemon] lag_interval_s``), so it keeps growing while uploads fail or the
store hangs, and a fully offloaded topic reads 0 / 0 / 0 however long it stays idle (no phantom
lag from a stale gauge: the three cases Kafka's ``RemoteCopyLag*`` metrics got wrong).

Seconds. No source here records when each entry was written, so the age of the oldest
uncommitted entry is bounded from what is known, and always from the safe side (never younger
than it is): it was written after its ledger was created (``LedgerDesc.ctime_ms``) and after the
last moment the monitor saw the LAC still short of it (:class:`LacHistory`). While the monitor
has been watching since before the entry was written, the figure is exact to within one
sampling interval; for entries older than the monitor (a restart, ``offloadd status`` without a
daemon) it is the age of their ledger, an upper bound.

Bytes. Exact where the source can say how many bytes precede an entry (the embedded store's
offset index: the source's :class:`~offloadd.ledger.base.FrameOffsets`); otherwise the
committed ledger's share is prorated by entry count and ``bytes_exact`` says so.

:func:`measure` is pure; :class:`LagMonitor` does the I/O (the source's ledger list, the byte
offset of the committed entry) and keeps one :class:`LacHistory` per topic.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from offloadd.errors import NotFound, OffloaddError
from offloadd.ledger.base import FrameOffsets
from offloadd.model import FRAME_OVERHEAD, LedgerDesc, Position, TopicName

__all__ = ["LacHistory", "Lag", "LagMonitor", "first_uncommitted", "measure", "tail_of"]

log = logging.getLogger(__name__)

STILL_MARGIN_MS = 1000  # LagMonitor.still: how stale a "no change" may be
MAX_SAMPLES = 2048  # per topic; beyond this the history is thinned (bounds stay safe)


@dataclass(frozen=True, slots=True)
class Lag:
    entries: int
    bytes: int
    seconds: float
    oldest: Position | None = None  # the first uncommitted entry, None when there is none
    bytes_exact: bool = True
    # wall time (ms) ``seconds`` was measured at: while nothing is committed and the source
    # records no change, the same entry is the oldest and only ``seconds`` moves, with the
    # clock; readers age it (:meth:`aged`) instead of the lag loop measuring every quiet topic
    # again (10,000 topics with open segments, every interval)
    measured_ms: int = field(default=0, compare=False)

    def aged(self, now_ms: int) -> Lag:
        """This lag as of ``now_ms``, nothing having changed since it was measured."""
        if not self.entries or not self.measured_ms or now_ms <= self.measured_ms:
            return self
        return replace(self, seconds=self.seconds + (now_ms - self.measured_ms) / 1000.0,
                       measured_ms=now_ms)

    def as_dict(self) -> dict[str, object]:
        return {"entries": self.entries, "bytes": self.bytes, "seconds": round(self.seconds, 3),
                "oldest": str(self.oldest) if self.oldest is not None else None,
                "bytes_exact": self.bytes_exact}


ZERO = Lag(0, 0, 0.0)


def tail_of(ledgers: Sequence[LedgerDesc]) -> Position | None:
    """The last readable position of the topic (its LAC), None while it holds no entry."""
    for d in reversed(ledgers):
        if d.last_entry_id >= 0:
            return Position(d.ledger_id, d.last_entry_id)
    return None


def first_uncommitted(ledgers: Sequence[LedgerDesc], committed: Position | None
                      ) -> tuple[Position, LedgerDesc] | None:
    """The first readable entry after ``committed`` and its ledger, if there is one."""
    for d in ledgers:
        if committed is not None and d.ledger_id < committed.ledger_id:
            continue
        first = committed.entry_id + 1 if committed is not None and \
            d.ledger_id == committed.ledger_id else 0
        if first <= d.last_entry_id:
            return Position(d.ledger_id, first), d
    return None


def measure(ledgers: Sequence[LedgerDesc], committed: Position | None, now_ms: int, *,
            committed_bytes: int | None = None, written_after_ms: int | None = None,
            seen_by_ms: int | None = None) -> Lag:
    """Lag of a topic whose ledgers (log order, as the source sees them now) are ``ledgers``
    and whose last committed position is ``committed`` (None: nothing committed yet).

    ``committed_bytes``: payload bytes of the committed ledger's entries up to and including
    ``committed`` (None: prorate). ``written_after_ms``: a time the first uncommitted entry was
    known not to exist yet (from :class:`LacHistory`). ``seen_by_ms``: a time it was known to
    exist, used only when nothing else bounds its age (a ledger without a creation time).
    """
    found = first_uncommitted(ledgers, committed)
    if found is None:
        return ZERO
    oldest, oldest_ledger = found
    entries = 0
    nbytes = 0
    exact = True
    for d in ledgers:
        if committed is not None and d.ledger_id < committed.ledger_id:
            continue
        if committed is not None and d.ledger_id == committed.ledger_id:
            n = max(d.last_entry_id - committed.entry_id, 0)
            if n:
                if committed_bytes is not None:
                    nbytes += max(d.size - committed_bytes, 0)
                else:  # prorated: entries after the commit, at the ledger's mean entry size
                    nbytes += d.size * n // max(d.entries, 1)
                    exact = False
        else:
            n = d.entries
            nbytes += d.size
        entries += n
    floor = oldest_ledger.ctime_ms if oldest_ledger.ctime_ms > 0 else None
    if written_after_ms is not None:
        floor = written_after_ms if floor is None else max(floor, written_after_ms)
    if floor is None:
        floor = seen_by_ms if seen_by_ms is not None else now_ms
    return Lag(entries, nbytes, max(0.0, (now_ms - floor) / 1000.0), oldest, exact, now_ms)


@dataclass
class LacHistory:
    """When the monitor saw which tail: ``(first_ms, last_ms, tail)`` per distinct tail, in time
    order (tails only grow). ``written_after(p)``: the last time the tail was short of ``p``
    (``p`` was written later); ``seen_by(p)``: the first time it had reached ``p``."""

    samples: list[tuple[int, int, Position | None]] = field(default_factory=list)

    def observe(self, now_ms: int, tail: Position | None) -> None:
        if self.samples and self.samples[-1][2] == tail:
            first, _, _ = self.samples[-1]
            self.samples[-1] = (first, now_ms, tail)
            return
        self.samples.append((now_ms, now_ms, tail))
        if len(self.samples) > MAX_SAMPLES:
            # thin the middle: a bound taken from a coarser history is still a bound
            keep = self.samples[:1] + self.samples[1:-1:2] + self.samples[-1:]
            self.samples = keep

    def written_after(self, p: Position) -> int | None:
        best = None
        for _, last, tail in self.samples:
            if tail is None or tail < p:
                best = last
            else:
                break
        return best

    def seen_by(self, p: Position) -> int | None:
        for first, _, tail in self.samples:
            if tail is not None and tail >= p:
                return first
        return None

    def forget_before(self, p: Position) -> None:
        """Drop what no longer bounds anything: samples older than the last one short of
        ``p`` (the first uncommitted entry only moves forward)."""
        idx = None
        for i, (_, _, tail) in enumerate(self.samples):
            if tail is None or tail < p:
                idx = i
            else:
                break
        if idx:
            del self.samples[:idx]


async def committed_payload_bytes(offsets: FrameOffsets | None, committed: Position
                                  ) -> int | None:
    """Payload bytes of ``committed``'s ledger up to and including it, when the source can
    tell (``offsets``: the embedded store's offset index); None otherwise."""
    if offsets is None:
        return None
    n = committed.entry_id + 1
    try:
        frames = await asyncio.to_thread(offsets.cumulative_bytes, committed.ledger_id, n)
    except (OffloaddError, OSError):
        return None
    return frames - FRAME_OVERHEAD * n


class LagMonitor:
    """Measures topics' lag on demand and remembers what each topic's LAC was when.

    ``sample(topic, ledgers, committed)`` is called by the daemon's lag loop every interval for
    every topic it runs, with the source's ledger list as of now.
    """

    def __init__(self, offsets: FrameOffsets | None, *,
                 wall_ms: Callable[[], int] = lambda: int(time.time() * 1000)) -> None:
        self._offsets = offsets
        self._wall_ms = wall_ms
        self._history: dict[TopicName, LacHistory] = {}
        self._bytes_cache: dict[TopicName, tuple[Position, int | None]] = {}

    def forget(self, topic: TopicName) -> None:
        self._history.pop(topic, None)
        self._bytes_cache.pop(topic, None)

    def still(self, topic: TopicName, margin_ms: int = STILL_MARGIN_MS,
              until_ms: int | None = None) -> None:
        """The topic's tail is known unchanged (its source recorded no change), without
        reading the source: it was still the last one seen ``margin_ms`` before ``until_ms``
        (default: now; a margin for a change the source's watcher has not read yet), so
        bounds stay on the safe side."""
        hist = self._history.get(topic)
        if hist is None or not hist.samples:
            return
        first, last, tail = hist.samples[-1]
        at = (self._wall_ms() if until_ms is None else until_ms) - margin_ms
        hist.samples[-1] = (first, max(last, at), tail)

    async def sample(self, topic: TopicName, ledgers: Sequence[LedgerDesc],
                     committed: Position | None) -> Lag:
        now = self._wall_ms()
        hist = self._history.setdefault(topic, LacHistory())
        hist.observe(now, tail_of(ledgers))
        cbytes: int | None = None
        if committed is not None:
            cached = self._bytes_cache.get(topic)
            if cached is not None and cached[0] == committed:
                cbytes = cached[1]
            else:
                try:
                    cbytes = await committed_payload_bytes(self._offsets, committed)
                except NotFound:
                    cbytes = None
                self._bytes_cache[topic] = (committed, cbytes)
        found = first_uncommitted(ledgers, committed)
        after = seen = None
        if found is not None:
            hist.forget_before(found[0])
            after, seen = hist.written_after(found[0]), hist.seen_by(found[0])
        return measure(ledgers, committed, now, committed_bytes=cbytes,
                       written_after_ms=after, seen_by_ms=seen)
