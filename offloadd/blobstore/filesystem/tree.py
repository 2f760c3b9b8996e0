"""The filesystem store's directory tree and the blocking operations on it (:class:`Tree`).

Everything here blocks: the store runs it in its worker threads. ``OSError`` is translated by
:func:`translate`: ``NotFound`` (ENOENT), ``Retriable`` (disk full, I/O error, try again) or
``Fatal`` (permissions, read-only, anything else).
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import json
import os
import stat
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path

from offloadd.blobstore.base import Buffers, ObjectInfo
from offloadd.errors import Fatal, NotFound, OffloaddError, Retriable

UPLOADS = ".uploads"
META = ".meta"
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024

_RETRIABLE = {
    errno.ENOSPC: "disk full: free space on the volume (or raise its quota); retrying",
    errno.EDQUOT: "disk quota exceeded: raise the quota or free space; retrying",
    errno.EIO: "I/O error: check the disk and the kernel log; retrying",
    errno.EAGAIN: "resource temporarily unavailable; retrying",
    errno.EINTR: "interrupted; retrying",
    errno.EBUSY: "device or resource busy; retrying",
    errno.EMFILE: "too many open files: raise the file-descriptor limit; retrying",
    errno.ENFILE: "system file table full; retrying",
}
# a full volume or an exhausted quota: retried, and reported as a refusal (not ready)
FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
_FATAL = {
    errno.EACCES: "permission denied: give offloadd read/write access to the store's root",
    errno.EPERM: "operation not permitted: check ownership of the store's root",
    errno.EROFS: "read-only filesystem: remount it read-write or choose another root",
}


def translate(e: OSError, what: str) -> OffloaddError:
    if e.errno == errno.ENOENT:
        return NotFound(f"{what}: no such object ({e.strerror})")
    if e.errno in _RETRIABLE:
        return Retriable(f"{what}: {_RETRIABLE[e.errno]} ({e})")
    if e.errno in _FATAL:
        return Fatal(f"{what}: {_FATAL[e.errno]} ({e})")
    return Fatal(f"{what}: {e}")


def check_key(key: str) -> None:
    parts = key.split("/")
    if (not key or key.startswith("/") or "\0" in key
            or any(p in ("", ".", "..") for p in parts) or parts[0] in (UPLOADS, META)):
        raise Fatal(f"object key {key!r} is not allowed in a filesystem store: keys are "
                    f"relative, without empty, '.' or '..' components, not under "
                    f"{UPLOADS}/ or {META}/")


def as_bytes_views(data: Buffers) -> list[memoryview]:
    views = [memoryview(b) for b in data]
    return [v if v.format == "B" and v.ndim == 1 else v.cast("B") for v in views]


def pwritev_all(fd: int, views: list[memoryview], offset: int) -> None:
    """Write every view at ``offset`` onward, resuming after short writes, without copying."""
    views = [v for v in views if v.nbytes]
    while views:
        batch = views[:_IOV_MAX]
        written = os.pwritev(fd, batch, offset)
        offset += written
        # Drop the fully written views; slice the first partly written one.
        i = 0
        while i < len(batch) and written >= batch[i].nbytes:
            written -= batch[i].nbytes
            i += 1
        views = views[i:]
        if written:
            views[0] = views[0][written:]


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _DirState:
    __slots__ = ("done", "error", "ok", "running", "started", "waiters")

    def __init__(self) -> None:
        self.running = False
        self.started = 0  # directory fsyncs started so far (each a generation)
        self.done = 0  # the last generation finished, well or not
        self.ok = 0  # the last generation that succeeded
        self.error: OSError | None = None  # the last failure's
        self.waiters = 0


class DirSyncs:
    """Directory fsyncs shared by the objects published in one directory at about the same
    time (a burst of segment commits puts thousands of objects into the store's root).

    :meth:`sync` returns once a ``fsync`` of the directory that *started after the call* has
    succeeded: the caller's rename, done before the call, is then durable, exactly as with a
    ``fsync`` of its own. The first caller runs the fsync; callers arriving while one runs
    cannot count on it (it may have started before their rename) and wait for the next, which
    one of them runs for all of them. So a burst costs about two directory fsyncs per fsync's
    time instead of one per object, and a lone caller pays exactly one.
    """

    def __init__(self, fsync: Callable[[Path], None] = fsync_dir) -> None:
        self._fsync = fsync
        self._cond = threading.Condition()
        self._dirs: dict[Path, _DirState] = {}

    def sync(self, path: Path) -> None:
        with self._cond:
            state = self._dirs.get(path)
            if state is None:
                state = self._dirs[path] = _DirState()
            need = state.started + 1  # the first generation to start after now
            state.waiters += 1
            try:
                while state.done < need:
                    if not state.running:
                        self._run(path, state)
                    else:
                        self._cond.wait()
                if state.ok < need:
                    # every generation since the call failed: the rename may not be durable
                    assert state.error is not None
                    raise state.error
            finally:
                state.waiters -= 1
                if not state.waiters and not state.running:
                    del self._dirs[path]

    def _run(self, path: Path, state: _DirState) -> None:
        """One generation's fsync, the lock released while it runs (called holding it)."""
        state.running = True
        state.started += 1
        gen = state.started
        self._cond.release()
        error: OSError | None = None
        succeeded = False
        try:
            self._fsync(path)
            succeeded = True
        except OSError as e:
            error = e
        finally:
            self._cond.acquire()
            state.running = False
            state.done = gen
            if succeeded:
                state.ok = gen
            else:
                state.error = error or OSError(f"fsync of directory {path} did not finish")
            self._cond.notify_all()


class Tree:
    """Objects under ``root`` (see :mod:`offloadd.blobstore.filesystem` for the layout)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.uploads = root / UPLOADS
        self.dir_syncs = DirSyncs()

    def data_path(self, key: str) -> Path:
        check_key(key)
        return self.root / key

    def meta_path(self, key: str) -> Path:
        check_key(key)
        return self.root / META / f"{key}.json"

    def read(self, key: str, start: int, end: int) -> bytes:
        path = self.data_path(key)
        try:
            fd = os.open(path, os.O_RDONLY)
        except NotADirectoryError as e:
            raise NotFound(f"object {key} does not exist under {self.root}") from e
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # a directory of longer keys
                raise NotFound(f"object {key} does not exist under {self.root}")
            chunks: list[bytes] = []
            pos = start
            while pos < end:
                chunk = os.pread(fd, end - pos, pos)
                if not chunk:
                    break  # end of object: the range comes back short
                chunks.append(chunk)
                pos += len(chunk)
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        finally:
            os.close(fd)

    def head(self, key: str) -> ObjectInfo:
        path = self.data_path(key)
        try:
            st = path.stat()
        except NotADirectoryError as e:
            raise NotFound(f"object {key} does not exist under {self.root}") from e
        if not path.is_file():
            raise NotFound(f"object {key} does not exist under {self.root}")
        try:
            metadata = json.loads(self.meta_path(key).read_bytes())["metadata"]
        except FileNotFoundError:
            metadata = {}  # a file put there by hand, or deleted since the stat
        except (ValueError, KeyError, TypeError) as e:
            raise Fatal(f"metadata sidecar of {key} under {self.root} is corrupt: {e}") from e
        return ObjectInfo(key, st.st_size, metadata, st.st_mtime)

    def delete(self, key: str) -> None:
        for path in (self.data_path(key), self.meta_path(key)):
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                path.unlink()

    def list(self, prefix: str) -> builtins.list[ObjectInfo]:
        # Walk only the deepest directory that can hold matching keys.
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        if base.split("/")[0] in (UPLOADS, META):
            return []
        top = self.root / base if base else self.root
        infos: builtins.list[ObjectInfo] = []
        for dirpath, dirnames, filenames in os.walk(top):
            rel = os.path.relpath(dirpath, self.root)
            if rel == ".":
                dirnames[:] = [d for d in dirnames if d not in (UPLOADS, META)]
                rel = ""
            for name in filenames:
                key = f"{rel}/{name}" if rel else name
                if key.startswith(prefix):
                    try:
                        st = os.stat(os.path.join(dirpath, name))
                    except FileNotFoundError:
                        continue  # deleted during the walk
                    infos.append(ObjectInfo(key, st.st_size, {}, st.st_mtime))
        infos.sort(key=lambda i: i.key)
        return infos

    def sweep(self, older_than_s: float, keep: Collection[Path]) -> int:
        """Delete upload temp files untouched for ``older_than_s`` seconds, but ``keep``."""
        cutoff = time.time() - older_than_s
        removed = 0
        try:
            entries = builtins.list(os.scandir(self.uploads))
        except FileNotFoundError:
            return 0
        for entry in entries:
            path = Path(entry.path)
            try:
                if path not in keep and entry.stat().st_mtime < cutoff:
                    path.unlink()
                    removed += 1
            except FileNotFoundError:
                pass
        return removed
