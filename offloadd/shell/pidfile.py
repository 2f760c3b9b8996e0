"""The daemon's pid file: locked with ``flock`` for as long as the process runs, and the check
that a pid file names a live offloadd before anyone signals it."""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
from pathlib import Path

from offloadd.errors import OffloaddError


class PidFile:
    """The daemon's pid file, locked with ``flock`` for as long as the process runs.

    The lock, not the number in the file, says whether a daemon is running: the kernel drops
    it when the process dies, however it dies, so a pid file left behind by a crash (whose pid
    may since name an unrelated process) is recognised as stale and never signalled.
    """

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, path: Path) -> PidFile:
        """Lock ``path`` and write our pid into it; ``OffloaddError`` if another live process
        holds it."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                other = _read_pid(path)
                raise OffloaddError(
                    f"another offloadd (pid {other if other is not None else '?'}) is running "
                    f"with pid file {path}; stop it first or give this one its own data"
                ) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd)

    def release(self) -> None:
        """Remove the file (while still holding the lock), then unlock; idempotent."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            with contextlib.suppress(FileNotFoundError):
                if _read_pid(self.path) == os.getpid():
                    self.path.unlink()
        finally:
            os.close(fd)


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _lock_holders(path: Path) -> set[int] | None:
    """Pids holding an ``flock`` on ``path``'s inode, from ``/proc/locks``; None where that
    cannot be read."""
    try:
        st = os.stat(path)
        text = Path("/proc/locks").read_text()
    except OSError:
        return None
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    holders = set()
    for line in text.splitlines():
        f = line.split()
        # "1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF" (blocked waiters carry a "->")
        if len(f) >= 6 and f[1] == "FLOCK" and "->" not in f and f[5] == want:
            with contextlib.suppress(ValueError):
                holders.add(int(f[4]))
    return holders


def _runs_offloadd(cmdline: bytes) -> bool:
    """``/proc/<pid>/cmdline`` is offloadd's: the ``offloadd`` script (run directly or by its
    interpreter) or ``python -m offloadd[.cli]``."""
    args = cmdline.rstrip(b"\0").split(b"\0")
    if any(os.path.basename(a) == b"offloadd" for a in args[:2]):
        return True
    return any(a == b"-m" and nxt.split(b".")[0] == b"offloadd"
               for a, nxt in itertools.pairwise(args[:4]))


def read_pid_file(path: Path) -> int:
    """The pid of the live offloadd that holds ``path``; ``OffloaddError`` (naming why) when
    there is none, so a caller never signals a process that merely reused a stale pid."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise OffloaddError(f"no daemon pid file at {path}: is offloadd running with this "
                            "config? (see [daemon] pid_file)") from None
    try:
        pid = _read_pid(path)
        if pid is None:
            raise OffloaddError(f"pid file {path} does not hold a process id")
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # held: a daemon is running
        else:
            raise OffloaddError(f"pid file {path} names process {pid}, which is not running "
                                "(stale pid file): no offloadd holds its lock")
    finally:
        os.close(fd)
    holders = _lock_holders(path)
    if holders is not None and pid not in holders:
        raise OffloaddError(f"pid file {path} names process {pid}, but the process holding "
                            f"its lock is {', '.join(map(str, sorted(holders))) or 'unknown'}; "
                            "not signalling")
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        raise OffloaddError(f"pid file {path} names process {pid}, which is not running "
                            "(stale pid file)") from None
    except OSError:
        return pid  # /proc hidden from us (hidepid): the lock check stands alone
    if not _runs_offloadd(cmdline):
        what = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()[:80]
        raise OffloaddError(f"pid file {path} names process {pid}, which is not offloadd "
                            f"({what!r}); not signalling")
    return pid
