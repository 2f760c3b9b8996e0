"""The embedded store's own records in the metadata store: open ledgers and the id counter.

A ledger is open while its ``LedgerInfo`` has no ``entries`` (only a topic's last one can be).
Ledger ids come from the counter node ``/offloadd/ledger-id`` (the next unreserved id, ASCII
decimal), reserved in ranges by compare-and-set (:class:`LedgerIds`): ids are unique across
topics and processes and never reused, even after a crash.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_right

from offloadd.errors import Conflict, Fatal, FormatError, NotFound
from offloadd.metadata import managed_ledger
from offloadd.metadata.base import MetadataStore
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
        for _ in range(_ID_ATTEMPTS):
            try:
                node = await self._store.get(LEDGER_ID_COUNTER)
            except NotFound:
                try:
                    await self._store.create(LEDGER_ID_COUNTER, str(self._range).encode())
                    return range(self._range)
                except Conflict:
                    continue
            try:
                start = int(node.data.decode("ascii"))
            except ValueError as exc:
                raise FormatError(LEDGER_ID_COUNTER, 0,
                                  f"ledger id counter {node.data!r} is not a number") from exc
            try:
                await self._store.set(LEDGER_ID_COUNTER, str(start + self._range).encode(),
                                      node.version)
                return range(start, start + self._range)
            except Conflict:
                continue
        raise Conflict(f"{LEDGER_ID_COUNTER}: gave up after {_ID_ATTEMPTS} lost races")
