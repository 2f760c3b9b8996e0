"""The files of one ledger of the embedded store, and the blocking I/O on them.

Everything here blocks: callers run it in a worker thread. Reads trust only whole ``.off``
records whose frames end within ``.log`` (:func:`scan`); a crashed writer's torn tail is cut
in the reverse of the write order (:func:`truncate_torn`), so no reader ever sees a record
without its frame. ``OSError`` becomes the error tree through :func:`os_error`.
"""

from __future__ import annotations

import contextlib
import errno
import os
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from mmap import mmap
from pathlib import Path

from offloadd.errors import Fatal, FormatError, NotFound, OffloaddError, Retriable
from offloadd.ledger.local.records import CHUNK, CRC_SIZE, LEN, OFF, OFF_CHUNK, OFF_SIZE
from offloadd.model import FRAME_OVERHEAD


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


def ledger_file(path: Path, ledger_id: int, suffix: str) -> str:
    """One of the ledger's files as a plain string: ``offloadd status`` reads one ``.off``
    record for each of 10,000 topics, and five ``Path`` objects a call were a fifth of that."""
    return f"{path}/{ledger_id:020d}{suffix}"


def os_error(exc: OSError, what: str) -> OffloaddError:
    if isinstance(exc, FileNotFoundError):
        return NotFound(f"{what}: {exc}")
    if isinstance(exc, PermissionError) or exc.errno in (errno.EROFS, errno.EISDIR):
        return Fatal(f"{what}: {exc}")
    return Retriable(f"{what}: {exc}")


def pread(fd: int, n: int, offset: int, name: Path) -> bytes:
    data = os.pread(fd, n, offset)
    if len(data) != n:
        raise FormatError(str(name), offset, f"wanted {n} bytes, file ends after {len(data)}")
    return data


def pread_into(fd: int, buf: bytearray | mmap, n: int, offset: int, name: Path) -> memoryview:
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


def pwrite(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


@contextlib.contextmanager
def opened(path: Path | str) -> Iterator[int]:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


class Records:
    """``.off`` as a sequence read on demand, so ``bisect`` can search the file itself."""

    def __init__(self, fd: int, count: int) -> None:
        self._fd = fd
        self._count = count

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, i: int) -> int:
        value: int = OFF.unpack(os.pread(self._fd, OFF_SIZE, i * OFF_SIZE))[0]
        return value


def frame_end(log_fd: int, start: int, log_size: int) -> int | None:
    """End of the frame at ``start``, or None when its header or bytes are not all in .log."""
    if start + FRAME_OVERHEAD > log_size:
        return None
    length: int = LEN.unpack(os.pread(log_fd, 4, start))[0]
    end = start + FRAME_OVERHEAD + length
    return end if length >= 0 and end <= log_size else None


def scan(off_fd: int, log_fd: int) -> tuple[int, int]:
    """(readable entries, end of the last readable frame): whole ``.off`` records whose frames
    end within ``.log``. Only a crashed writer leaves frames that do not fit."""
    count = os.fstat(off_fd).st_size // OFF_SIZE
    log_size = os.fstat(log_fd).st_size  # after .off: .log only grows ahead of .off
    if count == 0:
        return 0, 0
    records = Records(off_fd, count)
    end = frame_end(log_fd, records[count - 1], log_size)
    if end is not None:
        return count, end
    # The last entry is torn: entry k fits iff entry k+1 starts within .log.
    fit = bisect_right(records, log_size, 1, count) - 1
    return fit, records[fit]


def scan_files(files: LedgerFiles) -> tuple[int, int]:
    try:
        with opened(files.off) as off_fd, opened(files.log) as log_fd:
            return scan(off_fd, log_fd)
    except FileNotFoundError:
        return 0, 0


def truncate_torn(files: LedgerFiles) -> tuple[int, int]:
    """Cut a crashed writer's partial batch; returns (entries, payload bytes) that remain.

    Reverse of the write order, so no reader ever sees a record without its frame.
    """
    count, end = scan_files(files)
    for path, size in ((files.off, count * OFF_SIZE),
                       (files.osum, count * OFF_SIZE // OFF_CHUNK * CRC_SIZE),
                       (files.sum, end // CHUNK * CRC_SIZE), (files.crc, count * CRC_SIZE),
                       (files.log, end)):
        with contextlib.suppress(FileNotFoundError):
            if path.stat().st_size > size:
                os.truncate(path, size)
    return count, end - FRAME_OVERHEAD * count


def create_files(files: LedgerFiles) -> tuple[int, int, int, int, int]:
    files.log.parent.mkdir(parents=True, exist_ok=True)
    fds: list[int] = []
    try:
        for path in files.all():
            # O_EXCL: ids are never reused, so an existing file means a bug, not a restart.
            fds.append(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
    except BaseException:
        close_fds(fds)
        raise
    return fds[0], fds[1], fds[2], fds[3], fds[4]


def discard_files(files: LedgerFiles, fds: Sequence[int]) -> None:
    close_fds(fds)
    for path in files.all():
        path.unlink(missing_ok=True)


def remove_files(files: LedgerFiles) -> bool:
    """Unlink every file of the ledger; True if any was there."""
    found = False
    for path in files.all():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            found = True
    return found


def close_fds(fds: Sequence[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
