"""The ledger-source protocol: what the offload pipeline tails.

A source exposes managed ledgers (topics), each a list of ledgers in log order, and hands out
runs of consecutive entries *already framed the way blocks frame them*::

    [int32 length][int64 entryId][length bytes]   (big-endian)

so that a block's payload is one contiguous slice of a run and the pipeline never touches entries
one by one. ``EntryRun.offsets`` holds the start of every frame plus the end of the last one
(n + 1 values), so cut points are found by bisection.

An open ledger is readable only up to its last-add-confirmed entry (``LedgerDesc.last_entry_id``);
a source never hands out bytes past it, and never a torn entry.

Implementations: ``local/`` (the embedded managed-ledger store), ``bookkeeper/`` (a Pulsar
cluster), ``memory.py`` (unit tests).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from offloadd.model import LedgerDesc, TopicName

FRAME_OVERHEAD = 12  # int32 length + int64 entry id


@dataclass(frozen=True)
class EntryRun:
    """Entries ``first_entry_id .. first_entry_id + count - 1`` of one ledger, framed.

    ``data`` may be a view into a larger buffer: treat it as read-only and slice, never copy.
    ``offsets[i]`` is where entry ``first_entry_id + i``'s frame starts in ``data``;
    ``offsets[count] == len(data)``. ``crcs`` (CRC32C of each payload) when the source keeps them.
    """

    ledger_id: int
    first_entry_id: int
    data: memoryview
    offsets: Sequence[int]
    crcs: Sequence[int] | None = None

    @property
    def count(self) -> int:
        return len(self.offsets) - 1

    @property
    def last_entry_id(self) -> int:
        return self.first_entry_id + self.count - 1

    @property
    def payload_bytes(self) -> int:
        """Sum of entry payload sizes (frames minus their 12-byte headers)."""
        return len(self.data) - FRAME_OVERHEAD * self.count


@runtime_checkable
class LedgerSource(Protocol):
    async def list_topics(self) -> list[TopicName]: ...

    async def ledgers(self, topic: TopicName) -> list[LedgerDesc]:
        """The topic's ledgers in log order, as of now; ``NotFound`` for an unknown topic."""
        ...

    async def read(self, topic: TopicName, ledger_id: int, first_entry_id: int,
                   last_entry_id: int, max_bytes: int | None = None, *,
                   into: bytearray | None = None) -> EntryRun:
        """Entries ``first..last`` (inclusive), all readable; stops early (never before the
        first entry) once ``max_bytes`` of frames are gathered. ``NotFound`` if the ledger is
        gone; ``FormatError`` if stored bytes fail their checksum.

        ``into``: a buffer the caller recycles; a source may read the frames into it (then
        ``run.data`` is a view of it, valid until the caller reuses it) or ignore it."""
        ...

    async def wait_for_entries(self, topic: TopicName, ledger_id: int, last_known_entry_id: int,
                               timeout: float) -> None:
        """Return once the topic may have moved past ``ledger_id:last_known_entry_id`` (a new
        entry, a closed ledger or a new ledger), or after ``timeout`` seconds."""
        ...

    async def close(self) -> None: ...
