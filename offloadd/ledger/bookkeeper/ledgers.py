"""One BookKeeper ledger as the source knows it: metadata, what is readable, what is confirmed.

A closed ledger is readable up to its metadata's ``lastEntryId`` with ``length`` payload bytes.
An open one (``OPEN`` or ``IN_RECOVERY``) is readable up to the last-add-confirmed the source has
learnt (``lac``: from the bookies' last entries, every entry header and ``maxLAC`` read, long
polls), and only once that entry's cumulative length is known (``known``), so that the size the
source advertises is exact.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable

from offloadd.errors import NotFound
from offloadd.ledger.bookkeeper.codec import Digest, digest_for
from offloadd.ledger.bookkeeper.layout import LedgerMetadata, decode_ledger_metadata, ledger_path
from offloadd.ledger.bookkeeper.stream import ReadStream
from offloadd.metadata.base import Versioned
from offloadd.metadata.zookeeper import Watch

__all__ = ["STAMPS", "KnownLedger"]

# Every change a topic's ledgers can show is stamped from one counter (:meth:`KnownLedger.wake`,
# :meth:`~offloadd.ledger.bookkeeper.topics.WatchedTopic.wake`): the newest stamp of a topic
# and its ledgers is the source's change generation for the topic (``generation``).
STAMPS = itertools.count(1)


class KnownLedger:
    """Shared by every topic that lists the ledger. ``read_node`` reads a node of Pulsar's
    ZooKeeper; ``on_closed`` hears of every metadata read that shows the ledger closed."""

    def __init__(self, meta: LedgerMetadata, version: int, *, password: bytes, root: str,
                 read_node: Callable[[str], Awaitable[Versioned]],
                 on_closed: Callable[[LedgerMetadata], None]) -> None:
        self.ledger_id = meta.ledger_id
        self.meta = meta
        self.version = version
        self.path = ledger_path(meta.ledger_id, root)
        self._read_node = read_node
        self._on_closed = on_closed
        self.digest: Digest = digest_for(meta.digest_type, meta.password
                                         if meta.password is not None else password)
        self.lac = meta.last_entry_id if meta.closed else -1
        # the highest entry ≤ lac whose cumulative length is known: what ledgers() advertises
        self.known: tuple[int, int] = (meta.last_entry_id, meta.length) if meta.closed \
            else (-1, 0)
        self.lac_learnt = meta.closed
        self.deleted = False
        if meta.closed:
            on_closed(meta)
        self.watch: Watch | None = None
        self.changed = asyncio.Event()
        self.stamp = next(STAMPS)
        self.stream: ReadStream | None = None
        self.probe_lock = asyncio.Lock()
        self.lac_task: asyncio.Future[None] | None = None

    @property
    def readable_last(self) -> int:
        return self.known[0]

    def learn(self, lac: int) -> None:
        if lac > self.lac and not self.meta.closed:
            self.lac = lac
            self.wake()

    def note(self, entry_id: int, lac: int, length: int) -> None:
        """An entry read: its header teaches a LAC and, if confirmed, the size up to it."""
        if self.meta.closed:
            return
        if lac > self.lac:
            self.lac = lac
        if self.known[0] < entry_id <= self.lac:
            self.known = (entry_id, length)
            self.wake()

    def update(self, meta: LedgerMetadata, version: int) -> bool:
        """New metadata from ZooKeeper; True if the ensembles changed."""
        ensembles_changed = meta.segments != self.meta.segments
        self.meta = meta
        self.version = version
        if meta.closed:
            self.lac = meta.last_entry_id
            self.known = (meta.last_entry_id, meta.length)
            self.lac_learnt = True
            self._on_closed(meta)
        self.wake()
        return ensembles_changed

    async def refresh(self) -> bool:
        """Re-read the metadata (an entry was on no bookie: maybe an ensemble change)."""
        try:
            node = await self._read_node(self.path)
        except NotFound:
            self.deleted = True
            self.wake()
            return False
        meta = decode_ledger_metadata(node.data, self.ledger_id, self.path)
        return self.update(meta, node.version)

    def wake(self) -> None:
        self.stamp = next(STAMPS)
        event, self.changed = self.changed, asyncio.Event()
        event.set()

    def close(self, *, streams: bool = False) -> None:
        """Stop watching. Reads in flight finish on their own unless ``streams`` (shutdown):
        a ledger dropped from Pulsar's list may still be being read by the offloader."""
        if self.watch is not None:
            self.watch.cancel()
            self.watch = None
        if streams and self.stream is not None:
            self.stream.reset(0)
            self.stream = None
        if self.lac_task is not None:
            self.lac_task.cancel()
        self.deleted = True
        self.wake()
