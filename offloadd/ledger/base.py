"""The ledger-source protocol: what the offload pipeline tails.

A source exposes managed ledgers (topics), each a list of ledgers in log order, and hands out
runs of consecutive entries *already framed the way blocks frame them*
(:class:`~offloadd.model.EntryRun`, see :mod:`offloadd.model.frames`), so that a block's payload
is one contiguous slice of a run and the pipeline never touches entries one by one.
``EntryRun.offsets`` holds the start of every frame plus the end of the last one (n + 1 values),
so cut points are found by bisection.

An open ledger is readable only up to its last-add-confirmed entry (``LedgerDesc.last_entry_id``);
a source never hands out bytes past it, and never a torn entry.

Implementations: ``local/`` (the embedded managed-ledger store), ``bookkeeper/`` (a Pulsar
cluster), ``memory.py`` (unit tests).

Optional capabilities, each a protocol of its own below, declared by the implementations that
have them. :class:`SourceView` carries a source with its capabilities, each typed as its
protocol; :mod:`offloadd.wiring` builds it (it built the source and so knows its type: nobody
probes an object for a method):

=====================  ==========================================  ===========================
capability             used by                                     implemented by
=====================  ==========================================  ===========================
``LedgerDeleter``      retention (``retention/gc.py``)             local, memory
``LocalCopies``        ``[retention] trim_source``                 local
``EntryChecksums``     ``offloadd verify``                         local, bookkeeper
``StoredEntries``      ``offloadd verify``                         local
``FrameOffsets``       lag bytes, the backfill splitter            local
``SourceMetrics``      the daemon's ``/metrics``                   bookkeeper
``ChangeFeed``         idle topics: long waits, lag loop skips     local, bookkeeper
=====================  ==========================================  ===========================
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from mmap import mmap
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from offloadd.model import FRAME_OVERHEAD, EntryRun, LedgerDesc, TopicName

__all__ = [
    "FRAME_OVERHEAD",
    "ChangeFeed",
    "EntryChecksums",
    "EntryRun",
    "FrameOffsets",
    "LedgerDeleter",
    "LedgerSource",
    "LocalCopies",
    "ReadArray",
    "SourceMetrics",
    "SourceView",
    "StoredEntries",
]

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

# An array a read may land in (``into``): a ``bytearray``, or an anonymous ``mmap`` — what the
# offload buffer makes, since its pages are zero until written without a pass of our own
# (``offload/buffer.py``).
ReadArray = bytearray | mmap


@runtime_checkable
class LedgerSource(Protocol):
    async def list_topics(self) -> list[TopicName]: ...

    async def ledgers(self, topic: TopicName) -> list[LedgerDesc]:
        """The topic's ledgers in log order, as of now; ``NotFound`` for an unknown topic."""
        ...

    async def read(self, topic: TopicName, ledger_id: int, first_entry_id: int,
                   last_entry_id: int, max_bytes: int | None = None, *,
                   into: ReadArray | None = None) -> EntryRun:
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


# ---- optional capabilities (see the module docstring) -------------------------------------------

class LedgerDeleter(Protocol):
    """A source that applies retention itself (the embedded store). A Pulsar broker deletes its
    own ledgers: the BookKeeper source has no such capability."""

    async def delete_ledger(self, topic: TopicName, ledger_id: int) -> None:
        """Drop the closed ledger from the topic's managed ledger (compare-and-set), then its
        data. ``NotFound`` if the topic does not list it, ``Conflict`` if it is open."""
        ...


class LocalCopies(Protocol):
    """A source that keeps its own copy of each ledger's data (the embedded store's files) and
    can drop it once the tier holds the ledger (``[retention] trim_source``; the managed ledger
    keeps listing the ledger with ``offloadContext.bookkeeperDeleted`` set)."""

    async def drop_local_copy(self, ledger_id: int) -> bool:
        """Remove the ledger's data; True if any was there. Idempotent (a crash between the
        flag and the removal is finished by the next call). ``Retriable`` on I/O errors."""
        ...


class EntryChecksums(Protocol):
    """A source that keeps a CRC32C of every payload."""

    async def read_crcs(self, ledger_id: int, first_entry_id: int,
                        last_entry_id: int) -> Sequence[int]:
        """The stored CRC32C of each payload of entries ``first..last`` (all readable)."""
        ...


class StoredEntries(Protocol):
    """A source that can count what its own storage holds, whatever the metadata says."""

    async def stored_entries(self, ledger_id: int) -> int | None:
        """How many whole entries the ledger's data holds; None when its data is gone."""
        ...


class FrameOffsets(Protocol):
    """A source that knows where every entry's frame starts without reading the entries."""

    def cumulative_bytes(self, ledger_id: int, entry_id: int) -> int:
        """Frame bytes of entries ``0 .. entry_id - 1`` (``entry_id`` may be the count of
        readable entries). Blocking: call it from a worker thread. ``NotFound`` for a missing
        ledger or an entry past the readable ones."""
        ...


class ChangeFeed(Protocol):
    """A source that wakes :meth:`LedgerSource.wait_for_entries` when a topic changes, so its
    waiters need no frequent look (the embedded store's change journal)."""

    idle_poll_s: float  # how long a waiter may sleep before it looks anyway (a safety net)

    def generation(self, topic: TopicName) -> tuple[int, int] | None:
        """Changes recorded for the topic so far; None when unknown. While it is unchanged the
        topic's ledgers are as they were."""
        ...

    def follow(self) -> Callable[[], set[TopicName] | None]:
        """A drain for one consumer: each call returns the topics (among those asked about by
        :meth:`generation`) that changed since its previous call, None when it cannot say."""
        ...


class SourceMetrics(Protocol):
    """A source with Prometheus series of its own (the BookKeeper client's)."""

    def register(self, registry: CollectorRegistry) -> None: ...


@dataclass(frozen=True)
class SourceView:
    """A source and what it can do beyond :class:`LedgerSource`, each capability None when it
    cannot (built by :mod:`offloadd.wiring`, which knows the implementation)."""

    source: LedgerSource
    deleter: LedgerDeleter | None = None
    copies: LocalCopies | None = None
    checksums: EntryChecksums | None = None
    stored: StoredEntries | None = None
    offsets: FrameOffsets | None = None
    metrics: SourceMetrics | None = None
    changes: ChangeFeed | None = None
