"""The embedded managed-ledger store: a writer and a :class:`LedgerSource` over plain files.

Layout under the data directory, five files per ledger (ids are global, so files are not
grouped by topic; the topic → ledgers mapping lives in the metadata store)::

    <ledgerId:020d>.log   frames, back to back, exactly as blocks frame them (big-endian):
                          [int32 payload length][int64 entryId][payload]
    <ledgerId:020d>.crc   uint32 little-endian CRC32C of each payload, one per entry
    <ledgerId:020d>.sum   uint32 little-endian CRC32C of each complete 64 KiB chunk of .log
                          (bytes k*65536 .. (k+1)*65536), one per chunk
    <ledgerId:020d>.osum  the same for each complete 1 KiB chunk (128 records) of .off
    <ledgerId:020d>.off   int64 little-endian offset in .log where each frame starts

The number of readable entries is the number of *complete* 8-byte records of ``.off`` whose frames
end within ``.log``. A batch is written ``.log`` first, then ``.crc``, ``.sum`` and ``.osum``,
then ``.off``, each with one positional write; so a reader in any process that trusts only whole
``.off`` records never sees a torn entry, and the checksums of everything it can see are already
there. A block payload is therefore one byte range of ``.log``: :meth:`LocalLedgerSource.read`
cuts it by bisecting ``.off`` and reads it with one ``pread``, with no Python work per entry.

Reads are checked against the checksums by default (``verify_crc``): bit rot in a ledger file
must fail the read, not be uploaded under a fresh, valid block checksum. Checking each entry's
CRC32C costs a few C calls per entry (~0.3 CPU-s/GiB at 1 KiB entries, more than the whole
offload path); the chunk records make it one CRC pass over the bytes just read, in the reading
thread: a run's frames are checked chunk by chunk against ``.sum`` and the offsets that cut them
against ``.osum`` (reading at most a chunk more at each end), and only where no chunk record
covers them — the tail of a ledger still being written, a ledger written before the records
existed — entry by entry (frame header and payload CRC32C). A chunk that does not match is then
checked entry by entry too, so the error names the entry.

Metadata (DESIGN §6): ``/managed-ledgers/<ml name>`` holds the topic's ``ManagedLedgerInfo``; the
writer appends ``LedgerInfo(ledgerId, timestamp=ctime ms)`` when it opens a ledger and sets
``entries``/``size`` (payload bytes) when it closes it, always by compare-and-set so the
offloader's concurrent ``offloadContext`` edits survive. A ledger is open while its ``LedgerInfo``
has no ``entries``; only the last one can be. Ledger ids come from the counter node
``/offloadd/ledger-id`` (the next unreserved id, ASCII decimal), reserved in ranges by CAS: ids are
unique across topics and processes and never reused, even after a crash, and every new ledger of a
topic gets an id above the topic's previous ledgers (ledgers are ordered by id).

One writer process per store: the commands that write (``standalone``, ``produce``) hold the
store's *writer lock* (:class:`StoreLock`), so a second one is refused instead of closing the
first one's open ledgers under it. A writer that finds a topic's last ledger still open (its
previous writer died) closes it at the last whole entry on disk, cutting torn bytes (and the
records of chunks they completed) off its files, before opening a new one.

Durability: writes reach the page cache, which survives a process crash; ``sync=True`` adds an
``fdatasync`` per batch for power loss.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import operator
import os
import struct
import sys
import time
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import accumulate, chain, repeat
from pathlib import Path
from typing import NoReturn

import crc32c

from offloadd.errors import (
    ConfigError,
    Conflict,
    Fatal,
    Fenced,
    FormatError,
    NotFound,
    OffloaddError,
    OversizeEntryError,
    Retriable,
)
from offloadd.metadata import managed_ledger
from offloadd.metadata.base import MetadataStore
from offloadd.model import FRAME as _HEADER
from offloadd.model import FRAME_OVERHEAD, EntryRun, LedgerDesc, LedgerState, Position, TopicName
from offloadd.model.keys import LEDGER_ID_COUNTER, MANAGED_LEDGERS, managed_ledger_path

__all__ = [
    "DEFAULT_MAX_ENTRY_BYTES",
    "LedgerNotifier",
    "LocalLedgerSource",
    "LocalLedgerStore",
    "LocalLedgerWriter",
    "RolloverPolicy",
    "StoreLock",
    "frame_entries",
    "ledger_files",
]

log = logging.getLogger(__name__)

DEFAULT_MAX_ENTRY_BYTES = 5 * 1024 * 1024  # Pulsar's default maxMessageSize
DEFAULT_POLL_INTERVAL = 0.02

_LITTLE = sys.byteorder == "little"
_OFF = struct.Struct("<q")
_LEN = struct.Struct(">i")
_OFF_SIZE = _OFF.size
_CRC_SIZE = 4
CHUNK = 64 * 1024  # .log bytes per .sum record
OFF_CHUNK = 1024  # .off bytes (128 offsets) per .osum record
_ID_ATTEMPTS = 100


# -- files and framing: pure or blocking helpers, run in worker threads --------------------------


@dataclass(frozen=True)
class LedgerFiles:
    log: Path
    crc: Path
    off: Path
    sum: Path
    osum: Path

    def all(self) -> tuple[Path, Path, Path, Path, Path]:
        return self.log, self.crc, self.off, self.sum, self.osum


def ledger_files(path: Path, ledger_id: int) -> LedgerFiles:
    stem = f"{ledger_id:020d}"
    return LedgerFiles(path / f"{stem}.log", path / f"{stem}.crc", path / f"{stem}.off",
                       path / f"{stem}.sum", path / f"{stem}.osum")


def frame_entries(payloads: Sequence[bytes], first_entry_id: int,
                  start: int) -> tuple[bytes, bytes, bytes, int]:
    """Frame a batch for a ledger whose ``.log`` currently ends at ``start``.

    Returns the ``.log``, ``.crc`` and ``.off`` bytes to append and the new end of ``.log``.
    Every per-entry step runs in C (``map``/``zip``/``accumulate``): Python code never loops
    over the entries.
    """
    sizes = list(map(len, payloads))
    heads = map(_HEADER.pack, sizes, range(first_entry_id, first_entry_id + len(payloads)))
    frames = b"".join(chain.from_iterable(zip(heads, payloads, strict=True)))
    starts = array("q", accumulate(map(operator.add, sizes, repeat(FRAME_OVERHEAD)),
                                   initial=start))
    end = starts.pop()
    crcs = array("I", map(crc32c.crc32c, payloads))
    if not _LITTLE:
        starts.byteswap()
        crcs.byteswap()
    return frames, crcs.tobytes(), starts.tobytes(), end


def chunk_sums(data: bytes | memoryview, start: int, partial: int,
               chunk: int = CHUNK) -> tuple[bytes, int]:
    """Chunk-checksum records (``.sum`` for ``.log``, ``.osum`` for ``.off``) for ``data``
    appended to a file that ends at ``start``.

    ``partial`` is the CRC32C of the file's last, incomplete chunk (0 when ``start`` is on a
    chunk boundary). Returns the records of the chunks ``data`` completes (the first is chunk
    ``start // chunk``) and the CRC32C of the chunk it leaves incomplete.
    """
    view = memoryview(data)
    out = array("I")
    i = min(chunk - start % chunk, len(view))
    partial = crc32c.crc32c(view[:i], partial)
    if (start + i) % chunk == 0 and i:
        out.append(partial)
        partial = 0
    whole = (len(view) - i) // chunk
    out.extend(map(crc32c.crc32c, _slices(view, range(i, i + whole * chunk, chunk), chunk)))
    i += whole * chunk
    partial = crc32c.crc32c(view[i:], partial)
    if not _LITTLE:
        out.byteswap()
    return out.tobytes(), partial


def _slices(view: memoryview, starts: Sequence[int], length: int) -> Iterator[memoryview]:
    """``view[s:s + length]`` for each start, made in C (``map``), not in a Python loop."""
    return map(view.__getitem__, map(slice, starts, map(operator.add, starts, repeat(length))))


def _rebased(raw: bytes, base: int) -> array[int]:
    """Little-endian int64 records minus ``base``, without a Python loop.

    Every record is ≥ ``base``, so subtracting ``base`` from each 8-byte lane of one big integer
    never borrows across lanes: one big-int subtraction rebases them all.
    """
    n = len(raw) // _OFF_SIZE
    delta = int.from_bytes(raw, "little") - int.from_bytes(_OFF.pack(base) * n, "little")
    out = array("q")
    out.frombytes(delta.to_bytes(len(raw), "little"))
    if not _LITTLE:
        out.byteswap()
    return out


def _uint32s(raw: bytes) -> array[int]:
    out = array("I")
    out.frombytes(raw)
    if not _LITTLE:
        out.byteswap()
    return out


def _os_error(exc: OSError, what: str) -> OffloaddError:
    if isinstance(exc, FileNotFoundError):
        return NotFound(f"{what}: {exc}")
    if isinstance(exc, PermissionError) or exc.errno in (errno.EROFS, errno.EISDIR):
        return Fatal(f"{what}: {exc}")
    return Retriable(f"{what}: {exc}")


def _pread(fd: int, n: int, offset: int, name: Path) -> bytes:
    data = os.pread(fd, n, offset)
    if len(data) != n:
        raise FormatError(str(name), offset, f"wanted {n} bytes, file ends after {len(data)}")
    return data


def _pread_into(fd: int, buf: bytearray, n: int, offset: int, name: Path) -> memoryview:
    """Read ``n`` bytes into the front of ``buf`` (reused by the caller: no fresh pages to fault
    in, no allocation); returns a view of them."""
    view = memoryview(buf)[:n]
    got = 0
    while got < n:
        k = os.preadv(fd, [view[got:]], offset + got)
        if k == 0:
            raise FormatError(str(name), offset, f"wanted {n} bytes, file ends after {got}")
        got += k
    return view


def _pwrite(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


@contextlib.contextmanager
def _opened(path: Path) -> Iterator[int]:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


class _Records:
    """``.off`` as a sequence read on demand, so ``bisect`` can search the file itself."""

    def __init__(self, fd: int, count: int) -> None:
        self._fd = fd
        self._count = count

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, i: int) -> int:
        value: int = _OFF.unpack(os.pread(self._fd, _OFF_SIZE, i * _OFF_SIZE))[0]
        return value


def _frame_end(log_fd: int, start: int, log_size: int) -> int | None:
    """End of the frame at ``start``, or None when its header or bytes are not all in .log."""
    if start + FRAME_OVERHEAD > log_size:
        return None
    length: int = _LEN.unpack(os.pread(log_fd, 4, start))[0]
    end = start + FRAME_OVERHEAD + length
    return end if length >= 0 and end <= log_size else None


def _scan(off_fd: int, log_fd: int) -> tuple[int, int]:
    """(readable entries, end of the last readable frame): whole ``.off`` records whose frames
    end within ``.log``. Only a crashed writer leaves frames that do not fit."""
    count = os.fstat(off_fd).st_size // _OFF_SIZE
    log_size = os.fstat(log_fd).st_size  # after .off: .log only grows ahead of .off
    if count == 0:
        return 0, 0
    records = _Records(off_fd, count)
    end = _frame_end(log_fd, records[count - 1], log_size)
    if end is not None:
        return count, end
    # The last entry is torn: entry k fits iff entry k+1 starts within .log.
    fit = bisect_right(records, log_size, 1, count) - 1
    return fit, records[fit]


def _scan_files(files: LedgerFiles) -> tuple[int, int]:
    try:
        with _opened(files.off) as off_fd, _opened(files.log) as log_fd:
            return _scan(off_fd, log_fd)
    except FileNotFoundError:
        return 0, 0


def _truncate_torn(files: LedgerFiles) -> tuple[int, int]:
    """Cut a crashed writer's partial batch; returns (entries, payload bytes) that remain.

    Reverse of the write order, so no reader ever sees a record without its frame.
    """
    count, end = _scan_files(files)
    for path, size in ((files.off, count * _OFF_SIZE),
                       (files.osum, count * _OFF_SIZE // OFF_CHUNK * _CRC_SIZE),
                       (files.sum, end // CHUNK * _CRC_SIZE), (files.crc, count * _CRC_SIZE),
                       (files.log, end)):
        with contextlib.suppress(FileNotFoundError):
            if path.stat().st_size > size:
                os.truncate(path, size)
    return count, end - FRAME_OVERHEAD * count


# -- who may use the store: the writer and offloader locks ----------------------------------------


class StoreLock:
    """An ``flock`` on a lock file inside the store's directory, held until :meth:`release` (or
    the process ends: the kernel drops it with the last descriptor, so a crash never leaves the
    store locked).

    Two locks, because two different things must not happen twice:

    ``writer.lock``
        taken exclusively by every process that appends (``standalone``, ``produce``). A second
        writer would find the first one's open ledgers "left open by a dead writer" and close
        them while the first keeps writing: acknowledged entries land past the recorded end of
        a closed ledger and are never offloaded.
    ``offloader.lock``
        taken exclusively by ``standalone`` (it offloads every topic without the ownership
        layer) and *shared* by ``offloadd run`` (daemons that share a store divide its topics
        through ownership records in the metadata store, so several may run).

    So ``run`` beside a ``produce`` on the same store — the documented sidecar-like set-up —
    works, and so do several ``run`` daemons; a second ``standalone``, a ``produce`` beside a
    ``standalone``, or a ``run`` beside a ``standalone`` is refused with the holder named.
    Read-only commands (``status``, ``verify``, ``read``) take no lock.
    """

    WRITER = "writer.lock"
    OFFLOADER = "offloader.lock"

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, store: str | Path, name: str, *, shared: bool = False,
                holder: str = "offloadd") -> StoreLock:
        """Take ``name`` (:attr:`WRITER` or :attr:`OFFLOADER`) in the store at ``store``, or
        raise :class:`~offloadd.errors.Fatal` naming who holds it. ``holder`` describes this
        process in the file for the next one to read (exclusive holders only)."""
        path = Path(store) / name
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise _os_error(exc, f"opening the store lock {path}") from exc
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            who = _lock_holder(fd)
            os.close(fd)
            kind = "writer" if name == cls.WRITER else "offloader"
            raise Fatal(
                f"the embedded store {path.parent} is in use: {who} holds its {kind} lock "
                f"({path}). Two processes {'writing' if kind == 'writer' else 'offloading'} "
                "one store lose acknowledged entries; stop the other one first, or give this "
                "one its own data directory ([source] path)") from None
        except OSError as exc:
            os.close(fd)
            raise _os_error(exc, f"locking {path}") from exc
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # a crashed exclusive holder's line is stale now
            if not shared:
                _pwrite(fd, f"{os.getpid()} {holder}\n".encode(), 0)
        return cls(path, fd)

    def release(self) -> None:
        """Let go (idempotent). The file stays: removing it would let two processes lock two
        different files of the same name."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)  # only ever by the holder, so no one's line is lost
            os.close(fd)

    def __enter__(self) -> StoreLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _lock_holder(fd: int) -> str:
    """Who holds a lock, as its exclusive holder wrote it; shared holders write nothing."""
    try:
        text = os.pread(fd, 256, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    pid, _, what = text.partition(" ")
    if pid.isdigit():
        return f"{what or 'offloadd'} (pid {pid})"
    return "another offloadd process (an `offloadd run` daemon, or one starting up)"


# -- the in-process notifier --------------------------------------------------------------------


class LedgerNotifier:
    """Heads of the topics a writer in this process owns, so readers can wait without polling.

    ``head`` is the last written position (entry -1 for a new, empty ledger). Used from one
    event loop only.
    """

    def __init__(self) -> None:
        self._heads: dict[TopicName, Position] = {}
        self._events: dict[TopicName, asyncio.Event] = {}

    def head(self, topic: TopicName) -> Position | None:
        return self._heads.get(topic)

    def publish(self, topic: TopicName, head: Position | None) -> None:
        """Record a new head (None: this process no longer writes the topic) and wake waiters."""
        if head is None:
            self._heads.pop(topic, None)
        else:
            self._heads[topic] = head
        event = self._events.pop(topic, None)
        if event is not None:
            event.set()

    async def wait_past(self, topic: TopicName, ledger_id: int, entry_id: int,
                        within: float) -> bool:
        """Wait until the head passes ``ledger_id:entry_id``; False when the topic is not
        written by this process (the caller must poll instead)."""
        if topic not in self._heads:
            return False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while True:
            head = self._heads.get(topic)
            # No head any more: the writer let go of the topic, so the caller must look again.
            if head is None or head.ledger_id != ledger_id or head.entry_id > entry_id:
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return True
            event = self._events.setdefault(topic, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), remaining)


# -- the source ---------------------------------------------------------------------------------


def _not_readable(topic: TopicName, ledger_id: int, first: int, last: int,
                  readable: int) -> NotFound:
    return NotFound(f"{topic}: entries {first}..{last} of ledger {ledger_id} are not all "
                    f"readable (it has {readable} readable entries; if the ledger is closed at "
                    "more, its files are truncated or their offset index is corrupt)")


def _is_open(li: managed_ledger.LedgerInfo) -> bool:
    return not li.HasField("entries")


class LocalLedgerSource:
    """:class:`~offloadd.ledger.base.LedgerSource` over the files of the embedded store.

    Reads need no metadata: a ledger's files hold exactly its readable entries plus, while it is
    open, possibly a torn tail that is clamped away. ``verify_crc`` (the default) checks every
    byte read against the store's checksums — the ``.sum`` chunk CRCs, or each entry's frame
    header and CRC32C where no chunk record covers it — and raises :class:`FormatError` naming
    topic, ledger, entry and file instead of handing out a rotten entry. Runs alone
    (polling for other processes' writes) or beside a :class:`LocalLedgerWriter` sharing a
    :class:`LedgerNotifier` (see :class:`LocalLedgerStore`).
    """

    def __init__(self, path: str | Path, metadata: MetadataStore, *, verify_crc: bool = True,
                 notifier: LedgerNotifier | None = None,
                 poll_interval: float = DEFAULT_POLL_INTERVAL) -> None:
        self.path = Path(path)
        self._metadata = metadata
        self._verify_crc = verify_crc
        self._notifier = notifier if notifier is not None else LedgerNotifier()
        self._poll_interval = poll_interval

    async def list_topics(self) -> list[TopicName]:
        """Every managed ledger under ``/managed-ledgers/<tenant>/<ns>/persistent/<topic>``."""
        topics: list[TopicName] = []
        for tenant in await self._children(MANAGED_LEDGERS):
            for ns in await self._children(f"{MANAGED_LEDGERS}/{tenant}"):
                domain = f"{MANAGED_LEDGERS}/{tenant}/{ns}/persistent"
                for local in await self._children(domain):
                    try:
                        topics.append(TopicName.from_managed_ledger(
                            f"{tenant}/{ns}/persistent/{local}"))
                    except ConfigError:
                        log.warning("ignoring managed ledger %s/%s/persistent/%s: not a topic name",
                                    tenant, ns, local)
        return topics

    async def ledgers(self, topic: TopicName) -> list[LedgerDesc]:
        info = await self._info(topic)
        out: list[LedgerDesc] = []
        for li in info.ledgerInfo:
            if _is_open(li):
                count, end = await asyncio.to_thread(
                    _scan_files, ledger_files(self.path, li.ledgerId))
                out.append(LedgerDesc(li.ledgerId, LedgerState.OPEN, count - 1,
                                      end - FRAME_OVERHEAD * count, li.timestamp))
            else:
                out.append(LedgerDesc(li.ledgerId, LedgerState.CLOSED, li.entries - 1, li.size,
                                      li.timestamp))
        return out

    async def read(self, topic: TopicName, ledger_id: int, first_entry_id: int,
                   last_entry_id: int, max_bytes: int | None = None, *,
                   into: bytearray | None = None) -> EntryRun:
        if not 0 <= first_entry_id <= last_entry_id:
            raise ValueError(f"bad entry range {first_entry_id}..{last_entry_id}")
        files = ledger_files(self.path, ledger_id)
        try:
            return await asyncio.to_thread(self._read_sync, topic, files, ledger_id,
                                           first_entry_id, last_entry_id, max_bytes, into)
        except FileNotFoundError as exc:
            raise NotFound(f"{topic}: ledger {ledger_id} does not exist ({exc.filename})") from exc
        except OSError as exc:
            raise _os_error(exc, f"{topic}: reading ledger {ledger_id}") from exc

    def cumulative_bytes(self, ledger_id: int, entry_id: int) -> int:
        """Frame bytes of entries ``0 .. entry_id - 1`` of the ledger: where entry
        ``entry_id``'s frame starts in ``.log`` (payload bytes are this minus 12 per entry).

        ``entry_id`` may equal the number of readable entries: the end of the last frame.
        Blocking (one or two ``pread`` s, no scan): the backfill splitter calls it from a worker
        thread, O(log n) times per segment boundary. ``NotFound`` for a missing ledger or an
        entry past the readable ones.
        """
        files = ledger_files(self.path, ledger_id)
        try:
            with _opened(files.off) as off_fd:
                count = os.fstat(off_fd).st_size // _OFF_SIZE
                if 0 <= entry_id < count:
                    return _Records(off_fd, count)[entry_id]
                with _opened(files.log) as log_fd:
                    readable, end = _scan(off_fd, log_fd)
        except FileNotFoundError as exc:
            raise NotFound(f"ledger {ledger_id} does not exist ({exc.filename})") from exc
        except OSError as exc:
            raise _os_error(exc, f"reading offsets of ledger {ledger_id}") from exc
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
            return _scan_files(files)[0]

        try:
            return await asyncio.to_thread(count)
        except OSError as exc:
            raise _os_error(exc, f"scanning ledger {ledger_id}") from exc

    async def read_crcs(self, ledger_id: int, first_entry_id: int,
                        last_entry_id: int) -> Sequence[int]:
        """The stored CRC32C of each payload of entries ``first..last`` (all readable)."""
        if not 0 <= first_entry_id <= last_entry_id:
            raise ValueError(f"bad entry range {first_entry_id}..{last_entry_id}")
        files = ledger_files(self.path, ledger_id)

        def read() -> array[int]:
            with _opened(files.off) as off_fd, _opened(files.log) as log_fd, \
                    _opened(files.crc) as crc_fd:
                count, _ = _scan(off_fd, log_fd)
                if last_entry_id >= count:
                    raise NotFound(f"entries {first_entry_id}..{last_entry_id} of ledger "
                                   f"{ledger_id} are not all readable ({count} readable)")
                n = last_entry_id - first_entry_id + 1
                return _uint32s(_pread(crc_fd, _CRC_SIZE * n, _CRC_SIZE * first_entry_id,
                                       files.crc))

        try:
            return await asyncio.to_thread(read)
        except FileNotFoundError as exc:
            raise NotFound(f"ledger {ledger_id} does not exist ({exc.filename})") from exc
        except OSError as exc:
            raise _os_error(exc, f"reading CRCs of ledger {ledger_id}") from exc

    async def wait_for_entries(
        self, topic: TopicName, ledger_id: int, last_known_entry_id: int,
        timeout: float,
    ) -> None:
        """Return when ``ledger_id`` has entries past ``last_known_entry_id``, a later ledger
        exists, or (when polling) the managed ledger changed; at the latest after ``timeout``.

        At the end of a closed last ledger this waits for the next ledger instead of returning
        at once, so a tailer that has read everything does not spin.
        """
        if await self._notifier.wait_past(topic, ledger_id, last_known_entry_id, timeout):
            return
        await self._poll(topic, ledger_id, last_known_entry_id, timeout)

    async def delete_ledger(self, topic: TopicName, ledger_id: int) -> None:
        """Drop a closed ledger from the topic's metadata (CAS), then unlink its files.

        ``Conflict`` for an open ledger, ``NotFound`` if the topic does not list it (its files
        are then left alone: ids are global, so a wrong topic must not cost another's data).
        A crash between the two steps leaves orphan files, never a listed ledger without data.
        """

        def edit(info: managed_ledger.ManagedLedgerInfo) -> bool:
            for i, li in enumerate(info.ledgerInfo):
                if li.ledgerId == ledger_id:
                    if _is_open(li):
                        raise Conflict(f"{topic}: ledger {ledger_id} is open; only closed "
                                       "ledgers can be deleted")
                    del info.ledgerInfo[i]
                    return True
            raise NotFound(f"{topic}: ledger {ledger_id} is not in the managed ledger")

        try:
            await managed_ledger.update(self._metadata, topic.managed_ledger, edit)
        except NotFound as exc:
            raise NotFound(f"{topic}: cannot delete ledger {ledger_id}: {exc}") from exc

        def unlink() -> None:
            for path in ledger_files(self.path, ledger_id).all():
                path.unlink(missing_ok=True)

        try:
            await asyncio.to_thread(unlink)
        except OSError as exc:
            raise _os_error(exc, f"{topic}: deleting files of ledger {ledger_id}") from exc

    async def drop_local_copy(self, ledger_id: int) -> bool:
        """Remove a ledger's files, which the tier now holds (``[retention] trim_source``: the
        managed ledger keeps listing it with ``bookkeeperDeleted`` set); True if any existed.
        Idempotent. ``Retriable`` (or ``Fatal``) on I/O errors."""

        def unlink() -> bool:
            found = False
            for path in ledger_files(self.path, ledger_id).all():
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    found = True
            return found

        try:
            return await asyncio.to_thread(unlink)
        except OSError as exc:
            raise _os_error(exc, f"dropping the local copy of ledger {ledger_id}") from exc

    async def close(self) -> None:
        """Nothing to release: reads open and close their files."""

    # -- plumbing ---------------------------------------------------------------------------

    async def _children(self, path: str) -> list[str]:
        try:
            return await self._metadata.children(path)
        except NotFound:
            return []

    async def _info(self, topic: TopicName) -> managed_ledger.ManagedLedgerInfo:
        try:
            info, _ = await managed_ledger.load(self._metadata, topic.managed_ledger)
        except NotFound as exc:
            raise NotFound(f"topic {topic} does not exist (no managed ledger at "
                           f"{managed_ledger_path(topic.managed_ledger)})") from exc
        return info

    def _read_sync(self, topic: TopicName, files: LedgerFiles, ledger_id: int, first: int,
                   last: int, max_bytes: int | None, into: bytearray | None = None) -> EntryRun:
        with _opened(files.off) as off_fd, _opened(files.log) as log_fd:
            records = _Records(off_fd, os.fstat(off_fd).st_size // _OFF_SIZE)
            if last >= len(records):
                raise _not_readable(topic, ledger_id, first, last, _scan(off_fd, log_fd)[0])
            log_size = os.fstat(log_fd).st_size
            base = records[first]
            tail = last + 1 == len(records)  # the last frame's end is not in .off
            end = _frame_end(log_fd, records[last], log_size) if tail else records[last + 1]
            if end is None or end > log_size:
                raise _not_readable(topic, ledger_id, first, last, _scan(off_fd, log_fd)[0])
            if end <= base:  # only a rotten offset record says so
                raise FormatError(str(files.off), _OFF_SIZE * first,
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
            raw = _pread(off_fd, _OFF_SIZE * (count + (not tail)), _OFF_SIZE * first, files.off)
            offsets = _rebased(raw + _OFF.pack(end) if tail else raw, base)
            if into is not None and len(into) >= end - base:
                data: bytes | memoryview = _pread_into(log_fd, into, end - base, base, files.log)
            else:
                data = _pread(log_fd, end - base, base, files.log)
            with _opened(files.crc) as crc_fd:
                crcs = _uint32s(_pread(crc_fd, _CRC_SIZE * count, _CRC_SIZE * first, files.crc))
            if self._verify_crc:
                # here, while the bytes are cache-hot; the whole published range bounds which
                # chunk records may be used (past it a dead writer's torn bytes may be cut)
                _Check(topic, ledger_id, first, files, base, memoryview(data), offsets,
                       crcs).run(log_fd, memoryview(raw), _scan(off_fd, log_fd))
        return EntryRun(ledger_id, first, memoryview(data), offsets, crcs)

    async def _poll(self, topic: TopicName, ledger_id: int, last_known: int,
                    within: float) -> None:
        """Another process writes the topic: watch the ledger's ``.off`` size and the managed
        ledger's version (a close or a new ledger changes it)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        path = managed_ledger_path(topic.managed_ledger)
        try:
            node = await self._metadata.get(path)
        except NotFound as exc:
            raise NotFound(f"topic {topic} does not exist (no managed ledger at {path})") from exc
        lis = managed_ledger.decode(node.data, path).ledgerInfo
        if any(li.ledgerId > ledger_id for li in lis):
            return
        mine = next((li for li in lis if li.ledgerId == ledger_id), None)
        if mine is not None and not _is_open(mine) and mine.entries - 1 > last_known:
            return
        # A closed (or unknown) ledger never grows: only a metadata change can mean news.
        off = ledger_files(self.path, ledger_id).off if mine is not None and _is_open(mine) \
            else None
        wanted = _OFF_SIZE * (last_known + 2)
        while True:
            if off is not None and await asyncio.to_thread(_size, off) >= wanted:
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            await asyncio.sleep(min(self._poll_interval, remaining))
            try:
                if (await self._metadata.get(path)).version != node.version:
                    return
            except NotFound:
                return


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


class _Check:
    """Checks one run read from a ledger against the store's checksums (see the module
    docstring); raises :class:`FormatError` naming topic, ledger, entry and file.

    Two things are checked: the frames (``.log`` bytes, against ``.sum``) and the offsets that
    cut them (the run's ``.off`` records, against ``.osum``): a rotten offset would cut blocks
    mid-frame as surely as a rotten byte would corrupt an entry.
    """

    def __init__(self, topic: TopicName, ledger_id: int, first: int, files: LedgerFiles,
                 base: int, view: memoryview, offsets: Sequence[int],
                 crcs: Sequence[int]) -> None:
        self.topic = topic
        self.ledger_id = ledger_id
        self.first = first
        self.files = files
        self.base = base
        self.view = view
        self.offsets = offsets
        self.crcs = crcs
        self.end = base + len(view)

    def run(self, log_fd: int, raw: memoryview, published: tuple[int, int]) -> None:
        """``raw``: the ``.off`` records the run's offsets were made of; ``published``:
        (entries, end of their frames) — records past it may be cut."""
        count = len(self.offsets) - 1
        # the frames
        bad, covered = _compare_chunks(log_fd, self.files.log, self.files.sum, CHUNK,
                                       self.base, self.view, published[1])
        for k in bad:
            lo = max(k * CHUNK, self.base) - self.base
            hi = min((k + 1) * CHUNK, self.end) - self.base
            self.entries(bisect_right(self.offsets, lo) - 1, bisect_left(self.offsets, hi))
            self.suspect(self.files.log, self.files.sum, k, CHUNK)
        # the run's .off records: where its frames start, and the next one's start (the
        # ledger's last entry's end comes from its frame header, checked with the frames)
        with _opened(self.files.off) as off_fd:
            off_bad, off_covered = _compare_chunks(off_fd, self.files.off, self.files.osum,
                                                   OFF_CHUNK, _OFF_SIZE * self.first, raw,
                                                   _OFF_SIZE * published[0])
        for k in off_bad:
            lo = k * OFF_CHUNK // _OFF_SIZE - self.first
            self.entries(max(lo - 1, 0), min(lo + OFF_CHUNK // _OFF_SIZE, count))
            self.suspect(self.files.off, self.files.osum, k, OFF_CHUNK)
        # what no record covers yet (a ledger being written, or written before the records
        # existed), entry by entry: from the first entry whose frame or offset is uncovered
        uncovered = min(bisect_right(self.offsets, covered - self.base) - 1,
                        max(off_covered // _OFF_SIZE - self.first - 1, 0))
        self.entries(max(uncovered, 0), count)

    def suspect(self, data: Path, sums: Path, k: int, chunk: int) -> None:
        log.warning("topic %s: ledger %d: bytes %d..%d of %s do not match their chunk "
                    "checksum in %s, yet every entry read from them checks out; the damage is "
                    "elsewhere in the chunk or in its record", self.topic, self.ledger_id,
                    k * chunk, (k + 1) * chunk, data, sums)

    def entries(self, i: int, j: int) -> None:
        """Check entries ``i .. j-1`` of the run one by one: frame header and payload CRC32C.
        The comparisons run in C (``map``); only a failure loops in Python, to name it."""
        if i >= j:
            return
        view, offsets = self.view, self.offsets
        starts, ends = offsets[i:j], offsets[i + 1:j + 1]
        lengths = list(map(operator.sub, map(operator.sub, ends, starts),
                           repeat(FRAME_OVERHEAD)))
        if min(lengths) < 0 or max(ends) > len(view):  # rotten offsets: nothing to slice
            n = next(n for n, length in enumerate(lengths)
                     if length < 0 or ends[n] > len(view))
            self.fail(starts[n], self.first + i + n, f"its offset index record says it spans "
                      f"bytes {self.base + starts[n]}..{self.base + ends[n]} of the log, which "
                      "cannot be (the offset index is corrupt)")
        headers = list(map(_HEADER.unpack_from, repeat(view), starts))
        payloads = map(view.__getitem__, map(slice, map(operator.add, starts,
                                                         repeat(FRAME_OVERHEAD)), ends))
        got = array("I", map(crc32c.crc32c, payloads))
        ids = range(self.first + i, self.first + j)
        if headers == list(zip(lengths, ids, strict=True)) and got == self.crcs[i:j]:
            return
        for n in range(j - i):
            entry = self.first + i + n
            if headers[n] != (lengths[n], entry):
                self.fail(starts[n], entry, f"its frame header says entry {headers[n][1]} of "
                          f"{headers[n][0]} bytes, the offset index entry {entry} of "
                          f"{lengths[n]}")
            if got[n] != self.crcs[i + n]:
                self.fail(starts[n], entry, f"payload CRC32C {got[n]:#010x} differs from the "
                          f"stored {self.crcs[i + n]:#010x}")

    def fail(self, start: int, entry: int, problem: str) -> NoReturn:
        raise FormatError(f"{self.files.log} (topic {self.topic}, ledger {self.ledger_id})",
                          self.base + start,
                          f"entry {entry}: {problem}: the ledger file is corrupt, so the entry "
                          "is not offloaded (the segment fails and is retried until the file is "
                          "repaired; it is never skipped)")


def _compare_chunks(fd: int, path: Path, sums: Path, chunk: int, base: int, view: memoryview,
                    published: int) -> tuple[list[int], int]:
    """Compare bytes ``base .. base+len(view)`` of the file at ``fd`` (``view`` holds them)
    with the chunk CRC32Cs in ``sums``, reading at most a chunk more at each end.

    Returns the chunks that do not match and where the covered bytes end: chunks with a record
    and wholly within ``published`` are compared; from the returned offset on nothing is.
    """
    end = base + len(view)
    k0 = base // chunk
    try:
        with _opened(sums) as sum_fd:
            k1 = min(os.fstat(sum_fd).st_size // _CRC_SIZE, published // chunk, -(-end // chunk))
            if k1 <= k0:
                return [], base
            want = _uint32s(_pread(sum_fd, _CRC_SIZE * (k1 - k0), _CRC_SIZE * k0, sums))
    except FileNotFoundError:  # a ledger written before the records existed
        return [], base
    head = _pread(fd, base - k0 * chunk, k0 * chunk, path)
    stop = min(end, k1 * chunk)
    tail = _pread(fd, k1 * chunk - end, end, path) if k1 * chunk > end else b""
    got = _chunk_crcs(head, view[:stop - base], tail, chunk)
    bad = [k0 + i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w]
    return bad, stop


def _chunk_crcs(head: bytes, body: memoryview, tail: bytes, chunk: int) -> array[int]:
    """CRC32C of each chunk of ``head + body + tail`` (which starts on a chunk boundary and is
    a whole number of chunks long) without joining the three."""
    out = array("I")
    i = min(chunk - len(head), len(body))
    crc = crc32c.crc32c(body[:i], crc32c.crc32c(head))
    if len(head) + i == chunk:
        out.append(crc)
        crc, filled = 0, 0
    else:
        filled = len(head) + i
    whole = (len(body) - i) // chunk
    out.extend(map(crc32c.crc32c, _slices(body, range(i, i + whole * chunk, chunk), chunk)))
    i += whole * chunk
    if i < len(body):
        crc = crc32c.crc32c(body[i:], crc)
        filled += len(body) - i
    if tail:
        crc = crc32c.crc32c(tail, crc)
        filled += len(tail)
    if filled:
        out.append(crc)
    return out


# -- the writer ---------------------------------------------------------------------------------


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
        self._id_range = id_range
        self._sync = sync
        self._open: dict[TopicName, _OpenLedger] = {}
        self._locks: dict[TopicName, asyncio.Lock] = {}
        self._fenced: set[TopicName] = set()
        self._ids = range(0)
        self._id_lock = asyncio.Lock()
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
                                                partial(_close_in, led=led))
                except Fenced as exc:
                    log.warning("%s: not closing ledger %d: %s", topic, led.ledger_id, exc)
                except OffloaddError as exc:  # left open: the next writer recovers it
                    first_error = first_error or exc
                finally:
                    await asyncio.to_thread(_close_fds, led.fds)
                    self._notifier.publish(topic, None)
        if first_error is not None:
            raise first_error

    # -- plumbing ---------------------------------------------------------------------------

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
            await asyncio.to_thread(_close_fds, led.fds)
            raise _os_error(exc, f"{topic}: writing ledger {led.ledger_id}") from exc
        led.entries += len(payloads)
        led.payload_bytes = led.log_end - FRAME_OVERHEAD * led.entries
        self._notifier.publish(topic, led.head)

    def _write_sync(self, led: _OpenLedger,
                    payloads: list[bytes]) -> tuple[int, tuple[int, int]]:
        frames, crcs, offs, end = frame_entries(payloads, led.entries, led.log_end)
        off_start = _OFF_SIZE * led.entries
        sums, log_partial = chunk_sums(frames, led.log_end, led.partial[0])
        osums, off_partial = chunk_sums(offs, off_start, led.partial[1], OFF_CHUNK)
        log_fd, crc_fd, off_fd, sum_fd, osum_fd = led.fds
        # Order is the contract with readers: frames, then checksums, then the offsets that
        # publish.
        _pwrite(log_fd, frames, led.log_end)
        _pwrite(crc_fd, crcs, _CRC_SIZE * led.entries)
        if sums:
            _pwrite(sum_fd, sums, _CRC_SIZE * (led.log_end // CHUNK))
        if osums:
            _pwrite(osum_fd, osums, _CRC_SIZE * (off_start // OFF_CHUNK))
        if self._sync:
            for fd in (log_fd, crc_fd, sum_fd, osum_fd):
                os.fdatasync(fd)
        _pwrite(off_fd, offs, off_start)
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
        if lis and _is_open(lis[-1]):
            files = ledger_files(self.path, lis[-1].ledgerId)
            try:
                entries, size = await asyncio.to_thread(_truncate_torn, files)
            except OSError as exc:
                raise _os_error(exc, f"{topic}: recovering ledger {lis[-1].ledgerId}") from exc
            stale = (lis[-1].ledgerId, entries, size)
            log.info("%s: closing ledger %d left open by a previous writer at %d entries",
                     topic, stale[0], entries)
        after = max((li.ledgerId for li in lis), default=-1)

        def edit(info: managed_ledger.ManagedLedgerInfo, new: managed_ledger.LedgerInfo) -> None:
            for li in info.ledgerInfo:
                if not _is_open(li):
                    continue
                if stale is None or li.ledgerId != stale[0]:
                    raise Fenced(f"{topic}: ledger {li.ledgerId} was opened by another writer "
                                 "meanwhile; one writer per topic")
                li.entries, li.size = stale[1], stale[2]
            info.ledgerInfo.append(new)

        return await self._open_next(topic, after, edit)

    async def _rollover(self, topic: TopicName, led: _OpenLedger) -> _OpenLedger:
        """Close ``led`` and open the next ledger in one metadata update."""

        def edit(info: managed_ledger.ManagedLedgerInfo, new: managed_ledger.LedgerInfo) -> None:
            _close_in(info, led)
            info.ledgerInfo.append(new)

        try:
            new = await self._open_next(topic, led.ledger_id, edit)
        except Fenced:
            self._open.pop(topic, None)
            self._fenced.add(topic)
            self._notifier.publish(topic, None)
            await asyncio.to_thread(_close_fds, led.fds)
            raise
        await asyncio.to_thread(_close_fds, led.fds)
        return new

    async def _open_next(
        self, topic: TopicName, after: int,
        edit: Callable[[managed_ledger.ManagedLedgerInfo, managed_ledger.LedgerInfo], None],
    ) -> _OpenLedger:
        ledger_id = await self._allocate_id(after)
        now = self._clock()
        ctime_ms = int(now * 1000)
        files = ledger_files(self.path, ledger_id)
        try:
            fds = await asyncio.to_thread(_create_files, files)
        except OSError as exc:
            raise _os_error(exc, f"{topic}: creating ledger {ledger_id}") from exc
        new = managed_ledger.LedgerInfo(ledgerId=ledger_id, timestamp=ctime_ms)

        def apply(info: managed_ledger.ManagedLedgerInfo) -> bool:
            edit(info, new)
            return True

        try:
            await managed_ledger.update(self._metadata, topic.managed_ledger, apply, create=True)
        except BaseException:
            await asyncio.to_thread(_discard_files, files, fds)
            raise
        led = _OpenLedger(ledger_id, ctime_ms, now, fds)
        self._open[topic] = led
        self._notifier.publish(topic, led.head)
        return led

    async def _allocate_id(self, after: int) -> int:
        """A never-used ledger id above ``after``."""
        async with self._id_lock:
            if not self._ids or self._ids[-1] <= after:
                # A range reserved before another process used higher ids for this topic.
                self._ids = await self._reserve_ids()
            self._ids = self._ids[bisect_right(self._ids, after):]
            if not self._ids:
                raise Fatal(f"{LEDGER_ID_COUNTER} is behind ledger {after}: the ledger-id "
                            "counter was reset while ledgers still exist")
            ledger_id, self._ids = self._ids[0], self._ids[1:]
            return ledger_id

    async def _reserve_ids(self) -> range:
        """Move the global counter forward by ``id_range`` (CAS) and own the ids it passed."""
        for _ in range(_ID_ATTEMPTS):
            try:
                node = await self._metadata.get(LEDGER_ID_COUNTER)
            except NotFound:
                try:
                    await self._metadata.create(LEDGER_ID_COUNTER, str(self._id_range).encode())
                    return range(self._id_range)
                except Conflict:
                    continue
            try:
                start = int(node.data.decode("ascii"))
            except ValueError as exc:
                raise FormatError(LEDGER_ID_COUNTER, 0,
                                  f"ledger id counter {node.data!r} is not a number") from exc
            try:
                await self._metadata.set(LEDGER_ID_COUNTER,
                                         str(start + self._id_range).encode(), node.version)
                return range(start, start + self._id_range)
            except Conflict:
                continue
        raise Conflict(f"{LEDGER_ID_COUNTER}: gave up after {_ID_ATTEMPTS} lost races")


def _close_in(info: managed_ledger.ManagedLedgerInfo, led: _OpenLedger) -> bool:
    lis = info.ledgerInfo
    if not lis or lis[-1].ledgerId != led.ledger_id or not _is_open(lis[-1]):
        raise Fenced(f"ledger {led.ledger_id} is no longer the open ledger of its topic: "
                     "another writer took the topic over")
    lis[-1].entries, lis[-1].size = led.entries, led.payload_bytes
    return True


def _create_files(files: LedgerFiles) -> tuple[int, int, int, int, int]:
    files.log.parent.mkdir(parents=True, exist_ok=True)
    fds: list[int] = []
    try:
        for path in files.all():
            # O_EXCL: ids are never reused, so an existing file means a bug, not a restart.
            fds.append(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
    except BaseException:
        _close_fds(fds)
        raise
    return fds[0], fds[1], fds[2], fds[3], fds[4]


def _discard_files(files: LedgerFiles, fds: Sequence[int]) -> None:
    _close_fds(fds)
    for path in files.all():
        path.unlink(missing_ok=True)


def _close_fds(fds: Sequence[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


# -- both in one process ------------------------------------------------------------------------


class LocalLedgerStore:
    """A writer and a source over the same directory, sharing a notifier so that
    :meth:`LocalLedgerSource.wait_for_entries` wakes on the writer's appends without polling."""

    def __init__(self, path: str | Path, metadata: MetadataStore,
                 policy: RolloverPolicy | None = None, *,
                 clock: Callable[[], float] = time.time,
                 max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES, verify_crc: bool = True,
                 sync: bool = False) -> None:
        notifier = LedgerNotifier()
        self.writer = LocalLedgerWriter(path, metadata, policy, clock=clock,
                                        max_entry_bytes=max_entry_bytes, notifier=notifier,
                                        sync=sync)
        self.source = LocalLedgerSource(path, metadata, verify_crc=verify_crc, notifier=notifier)

    async def close(self) -> None:
        try:
            await self.writer.close()
        finally:
            await self.source.close()
