"""Reading the source into the offload buffer, one block's worth at a time.

:class:`RunReader` is the only code that touches the buffer's accounting (``reserve``,
``lease``, ``release``, ``grow``, ``give_back``): the streaming mode, the ledger-based mode and
the backfill task all read through it. Each read::

    reserve(budget) ─▶ lease an array ─▶ source.read(..., max_bytes=budget, into=array)
        ─▶ release what the run did not use (or grow: one oversize entry) ─▶ Run

and the returned :class:`Run` holds its bytes until its ``release()`` runs — once the parts
built from it have landed (or failed). The reservation comes *before* the read: when the buffer
is full nothing is read, and the entries stay in the source (PIP-76's fallback).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace

from offloadd.ledger.base import LedgerSource, ReadArray
from offloadd.model import EntryRun, TopicName
from offloadd.model.catalog import LedgerRange
from offloadd.offload.buffer import OffloadBuffer

__all__ = ["Run", "RunReader"]


SMALL_RUN = 4  # a run under a quarter of its array is copied out of it (RunReader.read)


def _nothing() -> None:
    pass


@dataclass(frozen=True, slots=True)
class Run:
    """A run of entries in buffer memory, and what frees that memory (call ``release`` exactly
    once). ``park``/``unpark`` (before ``release``) mark the run as backing blocks that wait
    for a multipart part to fill, and as on its way out again (:meth:`OffloadBuffer.park`)."""

    entries: EntryRun
    release: Callable[[], None]
    park: Callable[[], None] = _nothing
    unpark: Callable[[], None] = _nothing


class RunReader:
    """One topic's reads into a shared :class:`OffloadBuffer`."""

    # one per topic: 10,000 of them (issue 22), no instance dict
    __slots__ = ("_buffer", "_source", "_topic")

    def __init__(self, source: LedgerSource, buffer: OffloadBuffer, topic: TopicName) -> None:
        self._source = source
        self._buffer = buffer
        self._topic = topic

    async def read(self, ledger_id: int, first: int, last: int, budget: int) -> Run:
        """Entries ``first..`` (at most ``last``) of the ledger, at most ``budget`` frame bytes
        (at least one entry, however big)."""
        buf = self._buffer
        await buf.reserve(budget)
        lease: ReadArray | None = buf.lease(budget)
        assert lease is not None
        try:
            run = await self._source.read(self._topic, ledger_id, first, last, max_bytes=budget,
                                          into=lease)
        except BaseException:
            buf.release(budget)
            buf.give_back(lease)
            raise
        size = len(run.data)
        if size < budget:
            buf.release(budget - size)
        elif size > budget:  # an oversize entry: account for what we actually hold
            buf.grow(size - budget)
        if size * SMALL_RUN < len(lease) and run.data.obj is lease:
            # a short read (a quiet topic's tail) must not pin a block-sized array for as long
            # as its part waits to fill: keep a copy of just its bytes, recycle the array now
            run = replace(run, data=memoryview(bytes(run.data)))
            buf.give_back(lease)
            lease = None

        parked = [False]

        def park() -> None:
            if not parked[0]:
                parked[0] = True
                buf.park(size)

        def unpark() -> None:
            if parked[0]:
                parked[0] = False
                buf.unpark(size)

        def release() -> None:
            unpark()
            buf.release(size)
            if lease is not None:
                buf.give_back(lease)

        return Run(run, release, park, unpark)

    async def runs(self, r: LedgerRange, budget: int,
                   before: Callable[[], Awaitable[None]] | None = None) -> AsyncIterator[Run]:
        """``r`` as consecutive runs; ``before`` is awaited ahead of each read (wait for room
        in the upload, so reading never runs further ahead than uploading)."""
        nxt = r.first
        while nxt <= r.last:
            if before is not None:
                await before()
            run = await self.read(r.ledger_id, nxt, r.last, budget)
            yield run
            nxt = run.entries.last_entry_id + 1
