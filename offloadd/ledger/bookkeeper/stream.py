"""Pipelined, read-ahead reads of one ledger for one consumer reading forward, and the framing of
what it hands out into an :class:`~offloadd.model.EntryRun`.

Up to ``window`` entries are in flight in chunks of about ``_CHUNK_BYTES`` (one
:meth:`~.client.BookieClient.read_entries` each); after a read returns the stream keeps up to
``readahead`` bytes of the following readable entries coming, so the offloader's next read finds
them ready. Nothing here looks at an entry on its own but the framing's copy: cutting a read at
``max_bytes`` is a bisection over running sums taken with ``map``/``accumulate``.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_right
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, chain
from operator import add
from typing import Protocol

from offloadd.errors import Retriable
from offloadd.ledger.base import ReadArray
from offloadd.ledger.bookkeeper.client import BookieClient, Entries, LedgerContext
from offloadd.model import FRAME as _HEADER
from offloadd.model import FRAME_OVERHEAD, EntryRun

__all__ = ["ReadStream", "StreamedLedger", "frame_run"]

_CHUNK_BYTES = 256 * 1024  # one chunk of reads aims at this many payload bytes
_DEFAULT_ENTRY_BYTES = 1024


class StreamedLedger(LedgerContext, Protocol):
    """What the stream needs of the source's ledger state."""

    known: tuple[int, int]  # (last readable entry, ledger length up to it)
    lac: int

    @property
    def readable_last(self) -> int: ...

    def learn(self, lac: int) -> None: ...

    def note(self, entry_id: int, lac: int, length: int) -> None: ...


@dataclass
class _Chunk:
    first: int
    last: int
    task: asyncio.Task[Entries]
    taken: int = 0  # entries already handed out


class ReadStream:
    """Reads of one ledger, in order, with ``window`` entries in flight at most."""

    def __init__(self, client: BookieClient, ledger: StreamedLedger, window: int,
                 readahead: int) -> None:
        self._client = client
        self._ledger = ledger
        self._window = window
        self._readahead = readahead
        self.next = 0  # the next entry to hand out
        self._issued = 0  # the next entry to ask for
        self._chunks: deque[_Chunk] = deque()

    def _arrived(self, task: asyncio.Task[Entries]) -> None:
        """A chunk came in: what its headers say about the tail is news even before anyone
        takes it (this is how a reader following an open ledger learns its LAC and sizes)."""
        if task.cancelled() or task.exception() is not None:
            return  # whoever takes the chunk sees the error; nobody else needs it
        got = task.result()
        self._ledger.learn(got.lac)
        self._ledger.note(*got.tail)

    def _limit(self) -> int:
        """The last entry that may be read: confirmed, though maybe not yet advertised."""
        return max(self._ledger.readable_last, self._ledger.lac)

    def reset(self, first: int) -> None:
        for c in self._chunks:
            c.task.cancel()
        self._chunks.clear()
        self.next = self._issued = first

    def _avg(self) -> int:
        last, size = self._ledger.known
        if last >= 0 and size > 0:
            return max(size // (last + 1), 1)
        return _DEFAULT_ENTRY_BYTES

    def _issue(self, limit: int, budget: int) -> None:
        """Ask for entries up to ``limit`` while fewer than ``window`` are in flight and the
        unconsumed ones are estimated below ``budget`` bytes."""
        avg = self._avg()
        pending = sum(c.last - c.first + 1 - c.taken for c in self._chunks)
        while self._issued <= limit and pending < self._window and pending * avg < budget:
            n = min(max(_CHUNK_BYTES // avg, 1), self._window - pending,
                    limit - self._issued + 1)
            first = self._issued
            task = asyncio.ensure_future(
                self._client.read_entries(self._ledger, first, first + n - 1))
            task.add_done_callback(self._arrived)
            self._chunks.append(_Chunk(first, first + n - 1, task))
            self._issued += n
            pending += n

    async def take(self, first: int, last: int, max_bytes: int | None) -> list[memoryview]:
        """The payloads of entries ``first ..`` up to ``last``, stopping (never before the
        first) once their frames would pass ``max_bytes``."""
        if first != self.next or (self._chunks and self._chunks[0].first
                                  + self._chunks[0].taken != first):
            self.reset(first)
        limit = max(self._limit(), last)
        cap = (1 << 62) if max_bytes is None else max_bytes
        out: list[memoryview] = []
        got = 0
        try:
            while self.next <= last:
                self._issue(limit, max(cap - got, 1) + self._readahead)
                chunk = self._chunks[0]
                try:
                    entries = await chunk.task
                except asyncio.CancelledError:
                    task = asyncio.current_task()
                    if chunk.task.cancelled() and task is not None and not task.cancelling():
                        raise Retriable(f"ledger {self._ledger.ledger_id}: read of entries "
                                        f"{chunk.first}..{chunk.last} was abandoned") from None
                    raise
                stop = min(chunk.last, last) - chunk.first + 1
                avail = entries.payloads[chunk.taken:stop]
                # frame sizes, summed: the first k entries fit while ends[k - 1] <= room
                ends = list(accumulate(map(add, map(len, avail),
                                           [FRAME_OVERHEAD] * len(avail))))
                k = bisect_right(ends, cap - got)
                if k == 0 and not out:
                    k = 1  # a read returns at least one entry, whatever its size
                out.extend(avail[:k])
                got += ends[k - 1] if k else 0
                chunk.taken += k
                self.next += k
                if chunk.first + chunk.taken > chunk.last:
                    self._chunks.popleft()
                if k < len(avail):
                    break  # full
        except BaseException:
            self.reset(first)  # the caller asks again from ``first``
            raise
        self._issue(self._limit(), self._readahead)
        return out


def frame_run(ledger_id: int, first: int, payloads: Sequence[memoryview],
              into: ReadArray | None = None) -> EntryRun:
    """Frame entries as blocks do. Into ``into`` when it is large enough (a recycled buffer:
    no fresh pages to fault in), else with one ``bytes.join``."""
    sizes = list(map(len, payloads))
    offsets = list(accumulate(map(add, sizes, [FRAME_OVERHEAD] * len(sizes)), initial=0))
    total = offsets[-1]
    if into is not None and len(into) >= total:
        view = memoryview(into)
        pack = _HEADER.pack_into
        entry_id = first
        for pos, size, payload in zip(offsets, sizes, payloads, strict=False):  # n+1 offsets
            pack(into, pos, size, entry_id)
            view[pos + FRAME_OVERHEAD:pos + FRAME_OVERHEAD + size] = payload
            entry_id += 1
        return EntryRun(ledger_id, first, view[:total], offsets)
    heads = map(_HEADER.pack, sizes, range(first, first + len(payloads)))
    data = b"".join(chain.from_iterable(zip(heads, payloads, strict=True)))
    return EntryRun(ledger_id, first, memoryview(data), offsets)
