"""The embedded store's own records in the metadata store: open ledgers and the id counter.

A ledger is open while its ``LedgerInfo`` has no ``entries`` (only a topic's last one can be).
Ledger ids come from the counter node ``/offloadd/ledger-id`` (the next unreserved id, ASCII
decimal), reserved in ranges by compare-and-set (:class:`LedgerIds`): ids are unique across
topics and processes and never reused, even after a crash.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_right

from offloadd.errors import Fatal, FormatError
from offloadd.metadata import cas, managed_ledger
from offloadd.metadata.base import MetadataStore, Versioned
from offloadd.model.keys import LEDGER_ID_COUNTER

_ID_ATTEMPTS = 100


def is_open(li: managed_ledger.LedgerInfo) -> bool:
    return not li.HasField("entries")


class LedgerIds:
    """Ledger ids for one writer process: ranges of ``id_range`` ids reserved from the global
    counter, handed out in order."""

    def __init__(self, store: MetadataStore, id_range: int) -> None:
        self._store = store
        self._range = id_range
        self._ids = range(0)
        self._lock = asyncio.Lock()

    async def allocate(self, after: int) -> int:
        """A never-used ledger id above ``after``."""
        async with self._lock:
            if not self._ids or self._ids[-1] <= after:
                # A range reserved before another process used higher ids for this topic.
                self._ids = await self._reserve()
            self._ids = self._ids[bisect_right(self._ids, after):]
            if not self._ids:
                raise Fatal(f"{LEDGER_ID_COUNTER} is behind ledger {after}: the ledger-id "
                            "counter was reset while ledgers still exist")
            ledger_id, self._ids = self._ids[0], self._ids[1:]
            return ledger_id

    async def _reserve(self) -> range:
        """Move the global counter forward by ``id_range`` (CAS) and own the ids it passed."""
        start = 0

        def advance(node: Versioned | None) -> bytes:
            nonlocal start
            start = 0 if node is None else _counter(node.data)
            return str(start + self._range).encode()

        await cas.update(self._store, LEDGER_ID_COUNTER, advance, create=True,
                         attempts=_ID_ATTEMPTS)
        return range(start, start + self._range)


def _counter(data: bytes) -> int:
    try:
        return int(data.decode("ascii"))
    except ValueError as exc:
        raise FormatError(LEDGER_ID_COUNTER, 0,
                          f"ledger id counter {data!r} is not a number") from exc
