"""In-memory :class:`~offloadd.ledger.base.LedgerSource` for unit tests.

Tests drive it directly: :meth:`MemoryLedgerSource.append` (opens a ledger when the topic has
none open), :meth:`~MemoryLedgerSource.open_ledger`, :meth:`~MemoryLedgerSource.close_ledger`.
Framing is done entry by entry with ``struct``: the plainest correct code, so it doubles as the
reference the embedded store is checked against. Ledger ids are global and increasing.
Use from one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import crc32c

from offloadd.errors import Conflict, NotFound
from offloadd.ledger.base import LedgerDeleter, LedgerSource, ReadArray
from offloadd.model import FRAME as _HEADER
from offloadd.model import FRAME_OVERHEAD, EntryRun, LedgerDesc, LedgerState, Position, TopicName


@dataclass
class _Ledger:
    ledger_id: int
    ctime_ms: int
    payloads: list[bytes] = field(default_factory=list)
    closed: bool = False

    def desc(self) -> LedgerDesc:
        return LedgerDesc(self.ledger_id, LedgerState.CLOSED if self.closed else LedgerState.OPEN,
                          len(self.payloads) - 1, sum(map(len, self.payloads)), self.ctime_ms)


class MemoryLedgerSource(LedgerSource, LedgerDeleter):
    def __init__(self, *, clock: Callable[[], float] = time.time, first_ledger_id: int = 0) -> None:
        self._clock = clock
        self._topics: dict[TopicName, list[_Ledger]] = {}
        self._ids = itertools.count(first_ledger_id)
        self._changed: dict[TopicName, asyncio.Event] = {}

    # -- driving it -------------------------------------------------------------------------

    def open_ledger(self, topic: TopicName) -> int:
        """Start a new ledger (the topic's last one must be closed); returns its id."""
        ledgers = self._topics.setdefault(topic, [])
        if ledgers and not ledgers[-1].closed:
            raise Conflict(f"{topic}: ledger {ledgers[-1].ledger_id} is still open")
        ledger = _Ledger(next(self._ids), int(self._clock() * 1000))
        ledgers.append(ledger)
        self._wake(topic)
        return ledger.ledger_id

    def close_ledger(self, topic: TopicName) -> None:
        """Close the topic's open ledger, if any."""
        ledgers = self._topics.get(topic)
        if ledgers and not ledgers[-1].closed:
            ledgers[-1].closed = True
            self._wake(topic)

    def append(self, topic: TopicName, payloads: Sequence[bytes]) -> Position:
        """Append to the open ledger (opening one if needed); returns the last position."""
        ledgers = self._topics.get(topic)
        if not ledgers or ledgers[-1].closed:
            self.open_ledger(topic)
        ledger = self._topics[topic][-1]
        ledger.payloads.extend(bytes(p) for p in payloads)
        self._wake(topic)
        return Position(ledger.ledger_id, len(ledger.payloads) - 1)

    async def delete_ledger(self, topic: TopicName, ledger_id: int) -> None:
        ledgers = self._ledgers(topic)
        ledger = self._find(topic, ledger_id)
        if not ledger.closed:
            raise Conflict(f"{topic}: ledger {ledger_id} is open; only closed ledgers can be "
                           "deleted")
        ledgers.remove(ledger)
        self._wake(topic)

    # -- the protocol -----------------------------------------------------------------------

    async def list_topics(self) -> list[TopicName]:
        return sorted(self._topics)

    async def ledgers(self, topic: TopicName) -> list[LedgerDesc]:
        return [ledger.desc() for ledger in self._ledgers(topic)]

    async def read(self, topic: TopicName, ledger_id: int, first_entry_id: int,
                   last_entry_id: int, max_bytes: int | None = None, *,
                   into: ReadArray | None = None) -> EntryRun:
        if not 0 <= first_entry_id <= last_entry_id:
            raise ValueError(f"bad entry range {first_entry_id}..{last_entry_id}")
        ledger = self._find(topic, ledger_id)
        if last_entry_id >= len(ledger.payloads):
            raise NotFound(f"{topic}: entries {first_entry_id}..{last_entry_id} of ledger "
                           f"{ledger_id} are not all readable (it has {len(ledger.payloads)} "
                           "readable entries)")
        out = bytearray()
        offsets = [0]
        crcs: list[int] = []
        for entry_id in range(first_entry_id, last_entry_id + 1):
            payload = ledger.payloads[entry_id]
            if (max_bytes is not None and entry_id > first_entry_id
                    and len(out) + FRAME_OVERHEAD + len(payload) > max_bytes):
                break
            out += _HEADER.pack(len(payload), entry_id) + payload
            offsets.append(len(out))
            crcs.append(crc32c.crc32c(payload))
        return EntryRun(ledger_id, first_entry_id, memoryview(bytes(out)), offsets, crcs)

    async def wait_for_entries(
        self, topic: TopicName, ledger_id: int, last_known_entry_id: int,
        timeout: float,
    ) -> None:
        if self._moved(topic, ledger_id, last_known_entry_id):
            return
        # Any change of the topic (an entry, a close, a new ledger) ends the wait.
        event = self._changed.setdefault(topic, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)

    async def close(self) -> None:
        pass

    # -- plumbing ---------------------------------------------------------------------------

    def _ledgers(self, topic: TopicName) -> list[_Ledger]:
        try:
            return self._topics[topic]
        except KeyError:
            raise NotFound(f"topic {topic} does not exist") from None

    def _find(self, topic: TopicName, ledger_id: int) -> _Ledger:
        for ledger in self._ledgers(topic):
            if ledger.ledger_id == ledger_id:
                return ledger
        raise NotFound(f"{topic}: ledger {ledger_id} does not exist")

    def _moved(self, topic: TopicName, ledger_id: int, last_known: int) -> bool:
        """A newer ledger than ``ledger_id``, or entries past ``last_known`` in it."""
        for ledger in self._ledgers(topic):
            if ledger.ledger_id > ledger_id:
                return True
            if ledger.ledger_id == ledger_id and len(ledger.payloads) - 1 > last_known:
                return True
        return False

    def _wake(self, topic: TopicName) -> None:
        event = self._changed.pop(topic, None)
        if event is not None:
            event.set()
