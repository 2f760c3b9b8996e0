"""Filesystem blob store: every object is a plain file holding exactly the object's bytes.

Layout under ``root``::

    <key>                  the object's bytes (keys may contain "/": subdirectories)
    .meta/<key>.json       {"metadata": {...}}: the user metadata, written before the data file
    .uploads/<random>      multipart uploads in progress (and sidecar temp files)

An object is visible iff its data file exists. ``complete()`` checks the parts tile
``[0, size)``, fsyncs the temp file, moves the sidecar into place, then ``os.replace``s the temp
file to ``<key>`` and fsyncs the directory: a reader sees the whole object or none of it.
Overwriting a key is not atomic across data and sidecar (objects are written once here).

Parts are written with ``os.pwritev`` at their offset straight from the caller's buffers (never
joined), each in a worker thread, so parts may arrive concurrently and in any order. Temp files
left by a crash are removed by :meth:`FilesystemBlobStore.sweep_uploads`. ``list()`` reports size
and mtime but not metadata (as S3's listing); ``head()`` reads the sidecar.

Keys must be relative, without empty, ``.`` or ``..`` components, and may not start with
``.uploads`` or ``.meta``. ``OSError`` maps to ``NotFound`` (ENOENT), ``Retriable`` (disk full,
I/O error, try again) or ``Fatal`` (permissions, read-only, anything else).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import errno
import json
import os
import stat
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import TypeVar

from offloadd.blobstore.base import Buffers, ObjectInfo
from offloadd.blobstore.memory import check_parts, check_range
from offloadd.errors import Fatal, NotFound, OffloaddError, Retriable

T = TypeVar("T")

_UPLOADS = ".uploads"
_META = ".meta"
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
_FATAL = {
    errno.EACCES: "permission denied: give offloadd read/write access to the store's root",
    errno.EPERM: "operation not permitted: check ownership of the store's root",
    errno.EROFS: "read-only filesystem: remount it read-write or choose another root",
}


def _translate(e: OSError, what: str) -> OffloaddError:
    if e.errno == errno.ENOENT:
        return NotFound(f"{what}: no such object ({e.strerror})")
    if e.errno in _RETRIABLE:
        return Retriable(f"{what}: {_RETRIABLE[e.errno]} ({e})")
    if e.errno in _FATAL:
        return Fatal(f"{what}: {_FATAL[e.errno]} ({e})")
    return Fatal(f"{what}: {e}")


async def _in_thread(what: str, fn: Callable[..., T], *args: object) -> T:
    try:
        return await asyncio.to_thread(fn, *args)
    except OSError as e:
        raise _translate(e, what) from e


def _check_key(key: str) -> None:
    parts = key.split("/")
    if (not key or key.startswith("/") or "\0" in key
            or any(p in ("", ".", "..") for p in parts) or parts[0] in (_UPLOADS, _META)):
        raise Fatal(f"object key {key!r} is not allowed in a filesystem store: keys are "
                    f"relative, without empty, '.' or '..' components, not under "
                    f"{_UPLOADS}/ or {_META}/")


def _as_bytes_views(data: Buffers) -> list[memoryview]:
    views = [memoryview(b) for b in data]
    return [v if v.format == "B" and v.ndim == 1 else v.cast("B") for v in views]


def _pwritev_all(fd: int, views: list[memoryview], offset: int) -> None:
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


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FilesystemBlobStore:
    name = "filesystem"

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).absolute()
        self._uploads: set[FilesystemUpload] = set()

    def driver_properties(self) -> Mapping[str, str]:
        return {"managedLedgerOffloadDriver": self.name, "fileSystemURI": self.root.as_uri()}

    def data_path(self, key: str) -> Path:
        _check_key(key)
        return self.root / key

    def meta_path(self, key: str) -> Path:
        _check_key(key)
        return self.root / _META / f"{key}.json"

    async def start_upload(self, key: str, metadata: Mapping[str, str]) -> FilesystemUpload:
        _check_key(key)
        upload = FilesystemUpload(self, key, dict(metadata))
        await _in_thread(f"starting upload of {key} under {self.root}", upload.open_sync)
        self._uploads.add(upload)
        return upload

    async def put(self, key: str, data: Buffers, metadata: Mapping[str, str]) -> ObjectInfo:
        upload = await self.start_upload(key, metadata)
        try:
            await upload.put_part(1, 0, data)
            return await upload.complete()
        finally:
            await upload.abort()

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        check_range(key, start, end)
        return await _in_thread(f"reading {key} [{start}, {end}) under {self.root}",
                                self._read_sync, key, start, end)

    async def head(self, key: str) -> ObjectInfo:
        return await _in_thread(f"head of {key} under {self.root}", self._head_sync, key)

    async def delete(self, key: str) -> None:
        await _in_thread(f"deleting {key} under {self.root}", self._delete_sync, key)

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        infos = await _in_thread(f"listing {prefix!r} under {self.root}",
                                 self._list_sync, prefix)
        for info in infos:
            yield info

    async def sweep_uploads(self, older_than_s: float) -> int:
        """Delete temp files untouched for ``older_than_s`` seconds (crash leftovers).

        Uploads of this instance are never swept; another process's live upload touches its
        file on every part, so a threshold well above the slowest part's time is safe.
        """
        return await _in_thread(f"sweeping {self.root / _UPLOADS}", self._sweep_sync,
                                older_than_s)

    async def close(self) -> None:
        for upload in list(self._uploads):
            await upload.abort()

    # -- blocking halves, run in worker threads ------------------------------------------

    def _read_sync(self, key: str, start: int, end: int) -> bytes:
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

    def _head_sync(self, key: str) -> ObjectInfo:
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

    def _delete_sync(self, key: str) -> None:
        for path in (self.data_path(key), self.meta_path(key)):
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                path.unlink()

    def _list_sync(self, prefix: str) -> builtins.list[ObjectInfo]:
        # Walk only the deepest directory that can hold matching keys.
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        if base.split("/")[0] in (_UPLOADS, _META):
            return []
        top = self.root / base if base else self.root
        infos: builtins.list[ObjectInfo] = []
        for dirpath, dirnames, filenames in os.walk(top):
            rel = os.path.relpath(dirpath, self.root)
            if rel == ".":
                dirnames[:] = [d for d in dirnames if d not in (_UPLOADS, _META)]
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

    def _sweep_sync(self, older_than_s: float) -> int:
        mine = {u.temp_path for u in self._uploads}
        cutoff = time.time() - older_than_s
        removed = 0
        try:
            entries = list(os.scandir(self.root / _UPLOADS))
        except FileNotFoundError:
            return 0
        for entry in entries:
            path = Path(entry.path)
            try:
                if path not in mine and entry.stat().st_mtime < cutoff:
                    path.unlink()
                    removed += 1
            except FileNotFoundError:
                pass
        return removed


class FilesystemUpload:
    """One object being written into ``.uploads/<random>``; ``key`` is its final name."""

    def __init__(self, store: FilesystemBlobStore, key: str, metadata: dict[str, str]) -> None:
        self.key = key
        self.temp_path = store.root / _UPLOADS / uuid.uuid4().hex
        self._store = store
        self._metadata = metadata
        self._parts: dict[int, tuple[int, int]] = {}
        self._fd = -1
        self._in_flight = 0
        self._state = "open"

    def open_sync(self) -> None:
        self.temp_path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.temp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)

    async def put_part(self, part_number: int, offset: int, data: Buffers) -> None:
        self._check_open()
        if part_number < 1 or offset < 0:
            raise Fatal(f"upload of {self.key}: bad part {part_number} at offset {offset}")
        views = _as_bytes_views(data)
        self._in_flight += 1
        try:
            await _in_thread(f"writing part {part_number} of {self.key}",
                             _pwritev_all, self._fd, views, offset)
        finally:
            self._in_flight -= 1
        self._parts[part_number] = (offset, sum(v.nbytes for v in views))

    async def complete(self) -> ObjectInfo:
        self._check_open()
        if self._in_flight:
            raise Fatal(f"upload of {self.key}: complete() while {self._in_flight} parts are "
                        "still being written; await every put_part first")
        size = check_parts(self.key, self._parts)
        self._state = "completing"
        try:
            info = await _in_thread(f"completing upload of {self.key} under "
                                    f"{self._store.root}", self._complete_sync, size)
        except BaseException:
            self._state = "failed"  # abort() still cleans up
            raise
        self._state = "completed"
        self._store._uploads.discard(self)
        return info

    def _complete_sync(self, size: int) -> ObjectInfo:
        # A re-sent part may have been shorter than the first attempt: cut any tail.
        os.ftruncate(self._fd, size)
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = -1
        target = self._store.data_path(self.key)
        meta = self._store.meta_path(self.key)
        meta_temp = self.temp_path.with_suffix(".meta")
        with open(meta_temp, "wb") as f:
            f.write(json.dumps({"metadata": self._metadata}, sort_keys=True).encode())
            f.flush()
            os.fsync(f.fileno())
        try:
            meta.parent.mkdir(parents=True, exist_ok=True)
            os.replace(meta_temp, meta)
        finally:
            meta_temp.unlink(missing_ok=True)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError) as e:
            raise Fatal(f"object {self.key}: a parent directory is an existing object under "
                        f"{self._store.root}; a key cannot be both an object and a prefix "
                        "directory in a filesystem store") from e
        os.replace(self.temp_path, target)
        # Make the rename itself durable before reporting the object as written.
        _fsync_dir(target.parent)
        st = target.stat()
        return ObjectInfo(self.key, st.st_size, dict(self._metadata), st.st_mtime)

    async def abort(self) -> None:
        if self._state not in ("open", "failed"):
            return
        self._state = "aborted"
        self._store._uploads.discard(self)
        await _in_thread(f"aborting upload of {self.key}", self._abort_sync)

    def _abort_sync(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self.temp_path.unlink(missing_ok=True)

    def _check_open(self) -> None:
        if self._state != "open":
            raise Fatal(f"upload of {self.key} is already {self._state}")
