"""The embedded store's writer (:class:`LocalLedgerWriter`) and its rollover policy.

A batch is written ``.log`` first, then ``.crc``, ``.sum`` and ``.osum``, then ``.off``, each with
one positional write: a reader that trusts only whole ``.off`` records never sees a torn entry,
and the checksums of everything it can see are already there. Every metadata change (open,
close, roll) is a compare-and-set on the topic's ``ManagedLedgerInfo``, so the offloader's
concurrent ``offloadContext`` edits survive.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import accumulate
from pathlib import Path

from offloadd.errors import ConfigError, Fenced, NotFound, OffloaddError, OversizeEntryError
from offloadd.ledger.local.files import (
    close_fds,
    create_files,
    discard_files,
    ledger_files,
    os_error,
    pwrite,
    truncate_torn,
)
from offloadd.ledger.local.journal import JournalWriter
from offloadd.ledger.local.meta import LedgerIds, is_open
from offloadd.ledger.local.notifier import LedgerNotifier
from offloadd.ledger.local.records import (
    CHUNK,
    CRC_SIZE,
    OFF_CHUNK,
    OFF_SIZE,
    chunk_sums,
    frame_entries,
)
from offloadd.metadata import managed_ledger
from offloadd.metadata.base import MetadataStore
from offloadd.model import FRAME_OVERHEAD, Position, TopicName

log = logging.getLogger(__name__)

DEFAULT_MAX_ENTRY_BYTES = 5 * 1024 * 1024  # Pulsar's default maxMessageSize


@dataclass(frozen=True)
class RolloverPolicy:
    """When the writer closes a ledger and opens the next (independent of offload segments).

    A ledger is full once it holds ``max_entries`` entries or ``max_bytes`` payload bytes (the
    entry that crosses ``max_bytes`` stays in it, as in Pulsar); a non-empty ledger older than
    ``max_age_s`` rolls on the next append or :meth:`LocalLedgerWriter.roll_expired`. Defaults
    are Pulsar's (50000 entries, 2 GiB, 240 minutes).
    """

    max_entries: int = 50_000
    max_bytes: int = 2 << 30
    max_age_s: float = 240 * 60.0

    def __post_init__(self) -> None:
        if self.max_entries < 1 or self.max_bytes < 1 or not self.max_age_s > 0:
            raise ConfigError(f"rollover policy {self}: every limit must be positive")


@dataclass
class _OpenLedger:
    ledger_id: int
    ctime_ms: int
    opened_at: float  # clock seconds
    fds: tuple[int, int, int, int, int]  # log, crc, off, sum, osum
    entries: int = 0
    payload_bytes: int = 0
    log_end: int = 0
    partial: tuple[int, int] = (0, 0)  # CRC32C of the last, incomplete chunk of .log, .off

    @property
    def head(self) -> Position:
        return Position(self.ledger_id, self.entries - 1)


class LocalLedgerWriter:
    """Appends entries to topics of the embedded store; one writer process per topic.

    A topic's ledger is opened on its first :meth:`append` (or :meth:`open_topic`), after
    closing a ledger a dead writer left open. :meth:`append` is atomic within one ledger; when a
    batch is split by a rollover and a later part fails, the earlier part stays written.
    A failed write abandons the ledger: the next append closes it at what reached the disk.
    """

    def __init__(self, path: str | Path, metadata: MetadataStore,
                 policy: RolloverPolicy | None = None, *,
                 clock: Callable[[], float] = time.time,
                 max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES,
                 notifier: LedgerNotifier | None = None, id_range: int = 16,
                 sync: bool = False) -> None:
        if not 0 <= max_entry_bytes <= 0x7FFF_FFFF:
            raise ConfigError(f"max_entry_bytes={max_entry_bytes}: must fit an int32 length")
        if id_range < 1:
            raise ConfigError(f"id_range={id_range}: must be at least 1")
        self.path = Path(path)
        self._metadata = metadata
        self._policy = policy if policy is not None else RolloverPolicy()
        self._clock = clock
        self._max_entry_bytes = max_entry_bytes
        self._notifier = notifier if notifier is not None else LedgerNotifier()
        self._journal = JournalWriter(self.path)
        self._sync = sync
        self._open: dict[TopicName, _OpenLedger] = {}
        self._locks: dict[TopicName, asyncio.Lock] = {}
        self._fenced: set[TopicName] = set()
        self._ids = LedgerIds(metadata, id_range)
        self._closed = False

    async def append(self, topic: TopicName, payloads: Sequence[bytes]) -> Position:
        """Append a batch; returns the position of its last entry.

        ``OversizeEntryError`` (nothing written) if any payload exceeds ``max_entry_bytes``.
        """
        payloads = list(payloads)
        if not payloads:
            raise ValueError(f"{topic}: append needs at least one payload")
        sizes = list(map(len, payloads))
        biggest = max(sizes)
        if biggest > self._max_entry_bytes:
            raise OversizeEntryError(
                f"{topic}: entry {sizes.index(biggest)} of the batch has {biggest} bytes, more "
                f"than max_entry_bytes={self._max_entry_bytes}; nothing of this batch was written")
        cum = list(accumulate(sizes))
        async with self._lock(topic):
            led = await self._current(topic)
            done = 0
            while done < len(payloads):
                if self._must_roll(led):
                    led = await self._rollover(topic, led)
                take = self._room(led, cum, done)
                await self._write(topic, led, payloads[done:done + take])
                done += take
            if self._must_roll(led, age=False):
                try:
                    await self._rollover(topic, led)
                except OffloaddError as exc:  # the batch is written; the next append retries
                    log.warning("%s: rolling full ledger %d failed: %s", topic, led.ledger_id, exc)
            return led.head

    async def open_topic(self, topic: TopicName) -> int:
        """Make sure the topic has an open ledger (recovering a dead writer's); returns its id."""
        async with self._lock(topic):
            return (await self._current(topic)).ledger_id

    async def roll(self, topic: TopicName) -> None:
        """Close the topic's ledger and open the next now; no-op while the ledger is empty."""
        async with self._lock(topic):
            led = await self._current(topic)
            if led.entries:
                await self._rollover(topic, led)

    async def roll_expired(self) -> list[TopicName]:
        """Roll every non-empty ledger older than ``max_age_s``; for a periodic timer."""
        rolled: list[TopicName] = []
        for topic in list(self._open):
            async with self._lock(topic):
                led = self._open.get(topic)
                if led is not None and self._must_roll(led):
                    await self._rollover(topic, led)
                    rolled.append(topic)
        return rolled

    async def close(self) -> None:
        """Close every open ledger (metadata first, then the files). Idempotent."""
        if self._closed:
            return
        self._closed = True
        first_error: OffloaddError | None = None
        for topic in list(self._open):
            async with self._locks.setdefault(topic, asyncio.Lock()):
                led = self._open.pop(topic, None)
                if led is None:
                    continue
                try:
                    await managed_ledger.update(self._metadata, topic.managed_ledger,
                                                partial(close_in, led=led))
                except Fenced as exc:
                    log.warning("%s: not closing ledger %d: %s", topic, led.ledger_id, exc)
                except OffloaddError as exc:  # left open: the next writer recovers it
                    first_error = first_error or exc
                finally:
                    await asyncio.to_thread(close_fds, led.fds)
                    self._publish(topic, None)
        self._journal.close()
        if first_error is not None:
            raise first_error

    # -- plumbing ---------------------------------------------------------------------------

    def _publish(self, topic: TopicName, head: Position | None) -> None:
        """Tell readers: this process's (the notifier) and other processes' (the journal)."""
        self._notifier.publish(topic, head)
        self._record(topic)

    def _record(self, topic: TopicName | None) -> None:
        try:
            self._journal.record(topic)
        except OSError as exc:  # readers elsewhere then see it at their next safety look
            log.warning("%s: could not record the change in %s: %s", topic or "new topic",
                        self._journal.path, exc)

    def _lock(self, topic: TopicName) -> asyncio.Lock:
        if self._closed:
            raise RuntimeError(f"{topic}: the ledger writer is closed")
        return self._locks.setdefault(topic, asyncio.Lock())

    def _must_roll(self, led: _OpenLedger, *, age: bool = True) -> bool:
        p = self._policy
        if led.entries == 0:
            return False
        return (led.entries >= p.max_entries or led.payload_bytes >= p.max_bytes
                or (age and self._clock() - led.opened_at >= p.max_age_s))

    def _room(self, led: _OpenLedger, cum: list[int], start: int) -> int:
        """How many payloads from ``start`` go into ``led`` before it is full."""
        p = self._policy
        before = cum[start - 1] if start else 0
        # The first payload that brings the ledger to max_bytes is the last one it takes.
        filler = bisect_left(cum, before + p.max_bytes - led.payload_bytes, start)
        return min(p.max_entries - led.entries, filler + 1 - start, len(cum) - start)

    async def _write(self, topic: TopicName, led: _OpenLedger, payloads: list[bytes]) -> None:
        try:
            led.log_end, led.partial = await asyncio.to_thread(self._write_sync, led, payloads)
        except OSError as exc:
            # Readers may already see part of the batch: never rewrite those bytes. Forget the
            # ledger so the next append closes it at what is on disk.
            self._open.pop(topic, None)
            await asyncio.to_thread(close_fds, led.fds)
            raise os_error(exc, f"{topic}: writing ledger {led.ledger_id}") from exc
        led.entries += len(payloads)
        led.payload_bytes = led.log_end - FRAME_OVERHEAD * led.entries
        self._publish(topic, led.head)

    def _write_sync(self, led: _OpenLedger,
                    payloads: list[bytes]) -> tuple[int, tuple[int, int]]:
        frames, crcs, offs, end = frame_entries(payloads, led.entries, led.log_end)
        off_start = OFF_SIZE * led.entries
        sums, log_partial = chunk_sums(frames, led.log_end, led.partial[0])
        osums, off_partial = chunk_sums(offs, off_start, led.partial[1], OFF_CHUNK)
        log_fd, crc_fd, off_fd, sum_fd, osum_fd = led.fds
        # Order is the contract with readers: frames, then checksums, then the offsets that
        # publish.
        pwrite(log_fd, frames, led.log_end)
        pwrite(crc_fd, crcs, CRC_SIZE * led.entries)
        if sums:
            pwrite(sum_fd, sums, CRC_SIZE * (led.log_end // CHUNK))
        if osums:
            pwrite(osum_fd, osums, CRC_SIZE * (off_start // OFF_CHUNK))
        if self._sync:
            for fd in (log_fd, crc_fd, sum_fd, osum_fd):
                os.fdatasync(fd)
        pwrite(off_fd, offs, off_start)
        if self._sync:
            os.fdatasync(off_fd)
        return end, (log_partial, off_partial)

    async def _current(self, topic: TopicName) -> _OpenLedger:
        led = self._open.get(topic)
        if led is None:
            if topic in self._fenced:
                raise Fenced(f"{topic}: another writer took the topic over from this one")
            led = await self._start(topic)
        return led

    async def _start(self, topic: TopicName) -> _OpenLedger:
        """First touch of a topic: close a dead writer's ledger, then open a new one."""
        try:
            info, _ = await managed_ledger.load(self._metadata, topic.managed_ledger)
            lis = list(info.ledgerInfo)
        except NotFound:
            lis = []
        stale: tuple[int, int, int] | None = None
        if lis and is_open(lis[-1]):
            files = ledger_files(self.path, lis[-1].ledgerId)
            try:
                entries, size = await asyncio.to_thread(truncate_torn, files)
            except OSError as exc:
                raise os_error(exc, f"{topic}: recovering ledger {lis[-1].ledgerId}") from exc
            stale = (lis[-1].ledgerId, entries, size)
            log.info("%s: closing ledger %d left open by a previous writer at %d entries",
                     topic, stale[0], entries)
        after = max((li.ledgerId for li in lis), default=-1)

        def edit(info: managed_ledger.ManagedLedgerInfo, new: managed_ledger.LedgerInfo) -> None:
            for li in info.ledgerInfo:
                if not is_open(li):
                    continue
                if stale is None or li.ledgerId != stale[0]:
                    raise Fenced(f"{topic}: ledger {li.ledgerId} was opened by another writer "
                                 "meanwhile; one writer per topic")
                li.entries, li.size = stale[1], stale[2]
            info.ledgerInfo.append(new)

        led = await self._open_next(topic, after, edit)
        if not lis:  # a new topic: readers elsewhere list the topics again
            self._record(None)
        return led

    async def _rollover(self, topic: TopicName, led: _OpenLedger) -> _OpenLedger:
        """Close ``led`` and open the next ledger in one metadata update."""

        def edit(info: managed_ledger.ManagedLedgerInfo, new: managed_ledger.LedgerInfo) -> None:
            close_in(info, led)
            info.ledgerInfo.append(new)

        try:
            new = await self._open_next(topic, led.ledger_id, edit)
        except Fenced:
            self._open.pop(topic, None)
            self._fenced.add(topic)
            self._publish(topic, None)
            await asyncio.to_thread(close_fds, led.fds)
            raise
        await asyncio.to_thread(close_fds, led.fds)
        return new

    async def _open_next(
        self, topic: TopicName, after: int,
        edit: Callable[[managed_ledger.ManagedLedgerInfo, managed_ledger.LedgerInfo], None],
    ) -> _OpenLedger:
        ledger_id = await self._ids.allocate(after)
        now = self._clock()
        ctime_ms = int(now * 1000)
        files = ledger_files(self.path, ledger_id)
        try:
            fds = await asyncio.to_thread(create_files, files)
        except OSError as exc:
            raise os_error(exc, f"{topic}: creating ledger {ledger_id}") from exc
        new = managed_ledger.LedgerInfo(ledgerId=ledger_id, timestamp=ctime_ms)

        def apply(info: managed_ledger.ManagedLedgerInfo) -> bool:
            edit(info, new)
            return True

        try:
            await managed_ledger.update(self._metadata, topic.managed_ledger, apply, create=True)
        except BaseException:
            await asyncio.to_thread(discard_files, files, fds)
            raise
        led = _OpenLedger(ledger_id, ctime_ms, now, fds)
        self._open[topic] = led
        self._publish(topic, led.head)
        return led


def close_in(info: managed_ledger.ManagedLedgerInfo, led: _OpenLedger) -> bool:
    lis = info.ledgerInfo
    if not lis or lis[-1].ledgerId != led.ledger_id or not is_open(lis[-1]):
        raise Fenced(f"ledger {led.ledger_id} is no longer the open ledger of its topic: "
                     "another writer took the topic over")
    lis[-1].entries, lis[-1].size = led.entries, led.payload_bytes
    return True
