"""The embedded store's :class:`~offloadd.ledger.base.LedgerSource` (:class:`LocalLedgerSource`)."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from array import array
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from offloadd.errors import ConfigError, Conflict, FormatError, NotFound, Retriable
from offloadd.ledger.base import (
    FRAME_OVERHEAD,
    EntryChecksums,
    EntryRun,
    FrameOffsets,
    LedgerDeleter,
    LedgerSource,
    LocalCopies,
    ReadArray,
    StoredEntries,
)
from offloadd.ledger.local.check import RunCheck, read_summed, whole_chunks
from offloadd.ledger.local.files import (
    LedgerFiles,
    Records,
    file_size,
    frame_end,
    ledger_file,
    ledger_files,
    opened,
    os_error,
    pread,
    remove_files,
    scan,
    scan_files,
)
from offloadd.ledger.local.meta import is_open
from offloadd.ledger.local.notifier import LedgerNotifier
from offloadd.ledger.local.records import CRC_SIZE, OFF, OFF_SIZE, rebased, uint32s
from offloadd.ledger.local.watch import DEFAULT_INTERVAL_S, ChangeWatcher
from offloadd.metadata import managed_ledger
from offloadd.metadata.base import MetadataStore
from offloadd.model import LedgerDesc, LedgerState, TopicName
from offloadd.model.keys import managed_ledger_path

log = logging.getLogger(__name__)

# How long a topic task waits for news before it looks anyway: the journal wakes it when its
# topic changes, so this is only a safety net (see OffloadEnv.idle_poll_s).
IDLE_LOOK_S = 3600.0
_Seen = tuple[int, int, bool]  # a ledger as last read: id, entries, open
TOPICS_REFRESH_S = 30.0  # list_topics: the longest a cached listing is reused


def _not_readable(topic: TopicName, ledger_id: int, first: int, last: int,
                  readable: int) -> NotFound:
    return NotFound(f"{topic}: entries {first}..{last} of ledger {ledger_id} are not all "
                    f"readable (it has {readable} readable entries; if the ledger is closed at "
                    "more, its files are truncated or their offset index is corrupt)")


class LocalLedgerSource(LedgerSource, LedgerDeleter, LocalCopies, EntryChecksums, StoredEntries,
                        FrameOffsets):
    """:class:`~offloadd.ledger.base.LedgerSource` over the files of the embedded store, with
    every optional capability a source may have but metrics of its own (see
    :mod:`offloadd.ledger.base`).

    Reads need no metadata: a ledger's files hold exactly its readable entries plus, while it is
    open, possibly a torn tail that is clamped away. ``verify_crc`` (the default) checks every
    byte read against the store's checksums — the ``.sum`` chunk CRCs, or each entry's frame
    header and CRC32C where no chunk record covers it — and raises :class:`FormatError` naming
    topic, ledger, entry and file instead of handing out a rotten entry. Runs alone (woken by
    the change journal of a writer in another process: :mod:`.watch`) or beside a
    :class:`LocalLedgerWriter` sharing a :class:`LedgerNotifier` (see
    :class:`LocalLedgerStore`).
    """

    def __init__(self, path: str | Path, metadata: MetadataStore, *, verify_crc: bool = True,
                 notifier: LedgerNotifier | None = None,
                 watch_interval: float = DEFAULT_INTERVAL_S) -> None:
        self.path = Path(path)
        self._metadata = metadata
        self._verify_crc = verify_crc
        self._notifier = notifier if notifier is not None else LedgerNotifier()
        self._watcher = ChangeWatcher(self.path, watch_interval)
        self.idle_poll_s = IDLE_LOOK_S
        self._names: dict[str, TopicName] = {}
        self._listed: tuple[tuple[int, int], tuple[TopicName, ...]] | None = None
        self._listed_at = 0.0
        # per topic, the ledgers as last read (id, entries, open) and the watcher's generation
        # of the topic before that read: a wait right after a read needs no second one
        self._seen: dict[TopicName, tuple[tuple[int, int], tuple[_Seen, ...]]] = {}

    async def list_topics(self) -> list[TopicName]:
        """Every managed ledger under ``/managed-ledgers/<tenant>/<ns>/persistent/<topic>``.

        While the journal is watched and records no new topic, the last listing is reused for
        up to ``TOPICS_REFRESH_S`` (the daemon asks every second; listing 10,000 topics costs
        tens of milliseconds), so a topic made other than by a writer (or deleted) shows within
        that time."""
        gen = self._watcher.topics_generation()
        now = time.monotonic()
        if gen is not None and self._listed is not None and self._listed[0] == gen \
                and now - self._listed_at < TOPICS_REFRESH_S:
            return list(self._listed[1])
        topics: list[TopicName] = []
        names: dict[str, TopicName] = {}
        for ml in await managed_ledger.list_names(self._metadata):
            name = self._names.get(ml)
            try:
                name = name or TopicName.from_managed_ledger(ml)
            except ConfigError:
                log.warning("ignoring managed ledger %s: not a topic name", ml)
                continue
            names[ml] = name
            topics.append(name)
        self._names = names  # parsing is most of a listing's cost: each name once
        self._listed = (gen, tuple(topics)) if gen is not None else None
        self._listed_at = now
        return topics

    async def ledgers(self, topic: TopicName) -> list[LedgerDesc]:
        gen = self._watcher.generation(topic)  # before the read: a change during it shows
        info = await self._info(topic)
        self._remember(topic, gen, info.ledgerInfo)
        scans = {li.ledgerId: await asyncio.to_thread(scan_files,
                                                      ledger_files(self.path, li.ledgerId))
                 for li in info.ledgerInfo if is_open(li)}
        return _described(info, scans)

    def ledgers_in(self, info: managed_ledger.ManagedLedgerInfo) -> list[LedgerDesc]:
        """:meth:`ledgers` from a managed-ledger record already read, an open ledger's files
        scanned in place (blocking). For a command with nothing else to do meanwhile:
        ``offloadd status`` reads 10,000 topics' records in batches, and two worker-thread
        hops a topic (the record again, the scan) were a third of its time."""
        return _described(info, {li.ledgerId: scan_files(ledger_files(self.path, li.ledgerId))
                                 for li in info.ledgerInfo if is_open(li)})

    async def read(self, topic: TopicName, ledger_id: int, first_entry_id: int,
                   last_entry_id: int, max_bytes: int | None = None, *,
                   into: ReadArray | None = None) -> EntryRun:
        if not 0 <= first_entry_id <= last_entry_id:
            raise ValueError(f"bad entry range {first_entry_id}..{last_entry_id}")
        files = ledger_files(self.path, ledger_id)
        try:
            return await asyncio.to_thread(self._read_sync, topic, files, ledger_id,
                                           first_entry_id, last_entry_id, max_bytes, into)
        except FileNotFoundError as exc:
            raise NotFound(f"{topic}: ledger {ledger_id} does not exist ({exc.filename})") from exc
        except OSError as exc:
            raise os_error(exc, f"{topic}: reading ledger {ledger_id}") from exc

    def cumulative_bytes(self, ledger_id: int, entry_id: int) -> int:
        """Frame bytes of entries ``0 .. entry_id - 1`` of the ledger: where entry
        ``entry_id``'s frame starts in ``.log`` (payload bytes are this minus 12 per entry).

        ``entry_id`` may equal the number of readable entries: the end of the last frame.
        Blocking (one or two ``pread`` s, no scan): the backfill splitter calls it from a worker
        thread, O(log n) times per segment boundary. ``NotFound`` for a missing ledger or an
        entry past the readable ones.
        """
        try:
            with opened(ledger_file(self.path, ledger_id, ".off")) as off_fd:
                count = os.fstat(off_fd).st_size // OFF_SIZE
                if 0 <= entry_id < count:
                    return Records(off_fd, count)[entry_id]
                with opened(ledger_file(self.path, ledger_id, ".log")) as log_fd:
                    readable, end = scan(off_fd, log_fd)
        except FileNotFoundError as exc:
            raise NotFound(f"ledger {ledger_id} does not exist ({exc.filename})") from exc
        except OSError as exc:
            raise os_error(exc, f"reading offsets of ledger {ledger_id}") from exc
        if entry_id != readable:
            raise NotFound(f"entry {ledger_id}:{entry_id} is past the ledger's {readable} "
                           "readable entries")
        return end

    async def stored_entries(self, ledger_id: int) -> int | None:
        """How many whole entries the ledger's files hold, whatever the metadata says; None
        when the files are gone (deleted or trimmed). ``verify`` compares it with the catalog:
        a closed ledger whose files hold more entries than its recorded end had a second
        writer, and those entries are never offloaded."""
        files = ledger_files(self.path, ledger_id)

        def count() -> int | None:
            if not files.off.exists() and not files.log.exists():
                return None
            return scan_files(files)[0]

        try:
            return await asyncio.to_thread(count)
        except OSError as exc:
            raise os_error(exc, f"scanning ledger {ledger_id}") from exc

    async def read_crcs(self, ledger_id: int, first_entry_id: int,
                        last_entry_id: int) -> Sequence[int]:
        """The stored CRC32C of each payload of entries ``first..last`` (all readable)."""
        if not 0 <= first_entry_id <= last_entry_id:
            raise ValueError(f"bad entry range {first_entry_id}..{last_entry_id}")
        files = ledger_files(self.path, ledger_id)

        def read() -> array[int]:
            with opened(files.off) as off_fd, opened(files.log) as log_fd, \
                    opened(files.crc) as crc_fd:
                count, _ = scan(off_fd, log_fd)
                if last_entry_id >= count:
                    raise NotFound(f"entries {first_entry_id}..{last_entry_id} of ledger "
                                   f"{ledger_id} are not all readable ({count} readable)")
                n = last_entry_id - first_entry_id + 1
                return uint32s(pread(crc_fd, CRC_SIZE * n, CRC_SIZE * first_entry_id,
                                       files.crc))

        try:
            return await asyncio.to_thread(read)
        except FileNotFoundError as exc:
            raise NotFound(f"ledger {ledger_id} does not exist ({exc.filename})") from exc
        except OSError as exc:
            raise os_error(exc, f"reading CRCs of ledger {ledger_id}") from exc

    async def wait_for_entries(
        self, topic: TopicName, ledger_id: int, last_known_entry_id: int,
        timeout: float,
    ) -> None:
        """Return when ``ledger_id`` has entries past ``last_known_entry_id``, a later ledger
        exists, or (another process writing) the writer recorded a change of the topic; at the
        latest after ``timeout``.

        At the end of a closed last ledger this waits for the next ledger instead of returning
        at once, so a tailer that has read everything does not spin.
        """
        if await self._notifier.wait_past(topic, ledger_id, last_known_entry_id, timeout):
            return
        # another process writes the topic: its writer's journal says when (watch.py), and
        # the watcher's tick ends the wait at its deadline (no timer per waiting topic)
        deadline = asyncio.get_running_loop().time() + timeout
        changed = self._watcher.register(topic, deadline)
        try:
            if await self._moved(topic, ledger_id, last_known_entry_id):
                return
            # awaited as it is (not through asyncio.wait: a waiter future, a set and a
            # callback per idle topic); cancelling this call cancels it, and it is dropped
            await changed
        finally:
            self._watcher.unregister(topic, changed, deadline)

    def generation(self, topic: TopicName) -> tuple[int, int] | None:
        """Changes the writer recorded for the topic so far, None when unknown: while it is
        unchanged (and the source is being watched) the topic's ledgers are as they were."""
        return self._watcher.generation(topic)

    def follow(self) -> Callable[[], set[TopicName] | None]:
        """The topics the writer recorded a change of since the last call (see
        :meth:`ChangeWatcher.follow`); None when that cannot be said."""
        return self._watcher.follow()

    async def delete_ledger(self, topic: TopicName, ledger_id: int) -> None:
        """Drop a closed ledger from the topic's metadata (CAS), then unlink its files.

        ``Conflict`` for an open ledger, ``NotFound`` if the topic does not list it (its files
        are then left alone: ids are global, so a wrong topic must not cost another's data).
        A crash between the two steps leaves orphan files, never a listed ledger without data.
        """

        def edit(info: managed_ledger.ManagedLedgerInfo) -> bool:
            for i, li in enumerate(info.ledgerInfo):
                if li.ledgerId == ledger_id:
                    if is_open(li):
                        raise Conflict(f"{topic}: ledger {ledger_id} is open; only closed "
                                       "ledgers can be deleted")
                    del info.ledgerInfo[i]
                    return True
            raise NotFound(f"{topic}: ledger {ledger_id} is not in the managed ledger")

        self._seen.pop(topic, None)  # an edit of ours, not journaled: read the node again
        try:
            await managed_ledger.update(self._metadata, topic.managed_ledger, edit)
        except NotFound as exc:
            raise NotFound(f"{topic}: cannot delete ledger {ledger_id}: {exc}") from exc

        try:
            await asyncio.to_thread(remove_files, ledger_files(self.path, ledger_id))
        except OSError as exc:
            raise os_error(exc, f"{topic}: deleting files of ledger {ledger_id}") from exc

    async def drop_local_copy(self, ledger_id: int) -> bool:
        """Remove the ledger's files, keeping its place in the managed ledger (``[retention]
        trim_source``, once the tier holds it); True if any file was there. Idempotent: it also
        finishes a removal a crash interrupted. ``Retriable`` on any I/O error."""
        try:
            return await asyncio.to_thread(remove_files, ledger_files(self.path, ledger_id))
        except OSError as exc:
            raise Retriable(f"dropping the local copy of ledger {ledger_id}: {exc}") from exc

    async def close(self) -> None:
        """Stop watching the journal (reads open and close their own files)."""
        await self._watcher.close()

    # -- plumbing ---------------------------------------------------------------------------

    async def _info(self, topic: TopicName) -> managed_ledger.ManagedLedgerInfo:
        try:
            info, _ = await managed_ledger.load(self._metadata, topic.managed_ledger)
        except NotFound as exc:
            raise NotFound(f"topic {topic} does not exist (no managed ledger at "
                           f"{managed_ledger_path(topic.managed_ledger)})") from exc
        return info

    def _remember(self, topic: TopicName, gen: tuple[int, int] | None,
                  infos: Sequence[managed_ledger.LedgerInfo]) -> tuple[_Seen, ...]:
        lis = tuple((li.ledgerId, li.entries, is_open(li)) for li in infos)
        if gen is not None:
            self._seen[topic] = (gen, lis)
        else:
            self._seen.pop(topic, None)
        return lis

    def _read_sync(self, topic: TopicName, files: LedgerFiles, ledger_id: int, first: int,
                   last: int, max_bytes: int | None, into: ReadArray | None = None) -> EntryRun:
        with opened(files.off) as off_fd, opened(files.log) as log_fd:
            records = Records(off_fd, os.fstat(off_fd).st_size // OFF_SIZE)
            if last >= len(records):
                raise _not_readable(topic, ledger_id, first, last, scan(off_fd, log_fd)[0])
            log_size = os.fstat(log_fd).st_size
            base = records[first]
            tail = last + 1 == len(records)  # the last frame's end is not in .off
            end = frame_end(log_fd, records[last], log_size) if tail else records[last + 1]
            if end is None or end > log_size:
                raise _not_readable(topic, ledger_id, first, last, scan(off_fd, log_fd)[0])
            if end <= base:  # only a rotten offset record says so
                raise FormatError(str(files.off), OFF_SIZE * first,
                                  f"topic {topic}, ledger {ledger_id}: the offset index is "
                                  f"corrupt: entries {first}..{last} would end at byte {end} "
                                  f"of the log, before they start ({base})")
            if max_bytes is not None and end - base > max_bytes and last > first:
                # records[first+1 .. last] are the ends of entries first .. last-1.
                fit = bisect_right(records, base + max_bytes, first + 1, last + 1) - 1 - first
                last = first + max(fit, 1) - 1
                tail = False
                end = records[last + 1]
            count = last - first + 1
            raw = pread(off_fd, OFF_SIZE * (count + (not tail)), OFF_SIZE * first, files.off)
            offsets = rebased(raw + OFF.pack(end) if tail else raw, base)
            log_crcs = None
            if into is not None and len(into) >= end - base:
                # checksummed as read, while cache-hot (check.py): the CRCs check the bytes
                # and make the block checksum, or only make it when nothing is checked
                data: bytes | memoryview
                data, log_crcs = read_summed(log_fd, into, end - base, base, files.log)
            else:
                data = pread(log_fd, end - base, base, files.log)
            with opened(files.crc) as crc_fd:
                crcs = uint32s(pread(crc_fd, CRC_SIZE * count, CRC_SIZE * first, files.crc))
            run = EntryRun(ledger_id, first, memoryview(data), offsets, crcs)
            if self._verify_crc:
                # in this thread, from the CRCs read_summed made as it read (or over the bytes
                # just read); the whole published range bounds which chunk records may be used
                # (past it a dead writer's torn bytes may be cut)
                sums = RunCheck(topic, files, base, run).run(log_fd, memoryview(raw),
                                                             scan(off_fd, log_fd), log_crcs)
                if sums is not None:
                    run = replace(run, sums=sums)
            elif log_crcs is not None:
                sums = whole_chunks(base, len(data), log_crcs)
                if sums is not None:
                    run = replace(run, sums=sums)
        return run

    async def _moved(self, topic: TopicName, ledger_id: int, last_known: int) -> bool:
        """Has the topic moved past ``ledger_id:last_known`` (a later ledger, the ledger
        closed past it, or its files hold more entries)? One metadata read, one ``stat``."""
        gen = self._watcher.generation(topic)
        seen = self._seen.get(topic)
        if gen is not None and seen is not None and seen[0] == gen:
            # No change of the topic journaled since its ledgers were last read (the topic
            # task reads them just before it waits): the node as read then is the node now, as
            # far as a wait can tell. A change journaled but not yet seen by the watcher
            # wakes the registered wait at the watcher's next tick. On ZooKeeper this is a
            # network read less per segment.
            lis = seen[1]
        else:
            path = managed_ledger_path(topic.managed_ledger)
            try:
                node = await self._metadata.get(path)
            except NotFound as exc:
                raise NotFound(f"topic {topic} does not exist (no managed ledger at "
                               f"{path})") from exc
            infos = managed_ledger.decode(node.data, path).ledgerInfo
            lis = self._remember(topic, gen, infos)
        if any(li[0] > ledger_id for li in lis):
            return True
        mine = next((li for li in lis if li[0] == ledger_id), None)
        if mine is None or not mine[2]:
            # a closed (or unknown) ledger never grows: only a metadata change can mean news
            return mine is not None and mine[1] - 1 > last_known
        off = ledger_files(self.path, ledger_id).off
        return await asyncio.to_thread(file_size, off) >= OFF_SIZE * (last_known + 2)


def _described(info: managed_ledger.ManagedLedgerInfo,
               scans: dict[int, tuple[int, int]]) -> list[LedgerDesc]:
    """The ledgers of ``info``; an open one's last entry and bytes from its file scan
    ((entries, end offset) in ``scans``), a closed one's from its record."""
    out: list[LedgerDesc] = []
    for li in info.ledgerInfo:
        scanned = scans.get(li.ledgerId)
        if scanned is not None:
            count, end = scanned
            out.append(LedgerDesc(li.ledgerId, LedgerState.OPEN, count - 1,
                                  end - FRAME_OVERHEAD * count, li.timestamp))
        else:
            out.append(LedgerDesc(li.ledgerId, LedgerState.CLOSED, li.entries - 1, li.size,
                                  li.timestamp))
    return out
