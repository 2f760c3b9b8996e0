"""Who may use the embedded store: its writer and offloader locks (:class:`StoreLock`)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from offloadd.errors import Fatal
from offloadd.ledger.local.files import os_error, pwrite


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
            raise os_error(exc, f"opening the store lock {path}") from exc
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
            raise os_error(exc, f"locking {path}") from exc
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # a crashed exclusive holder's line is stale now
            if not shared:
                pwrite(fd, f"{os.getpid()} {holder}\n".encode(), 0)
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
