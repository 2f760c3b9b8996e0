"""One object being written by the filesystem store (:class:`FilesystemUpload`).

Parts are written with ``os.pwritev`` at their offset straight from the caller's buffers (never
joined) into ``.uploads/<random>``, so parts may arrive concurrently and in any order.
``complete()`` checks the parts tile ``[0, size)``, fsyncs the temp file, moves the metadata
sidecar into place, then ``os.replace``s the temp file to ``<key>`` and fsyncs the directory: a
reader sees the whole object or none of it.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from typing import Protocol, TypeVar

from offloadd.blobstore.base import Buffers, MultipartUpload, ObjectInfo
from offloadd.blobstore.filesystem.tree import Tree, as_bytes_views, pwritev_all
from offloadd.blobstore.parts import check_part, check_parts
from offloadd.errors import Conflict, Fatal
from offloadd.model.ids import random_hex

T = TypeVar("T")


class UploadOwner(Protocol):
    """What an upload needs of the store that opened it (:class:`.store.FilesystemBlobStore`):
    its tree, its set of unfinished uploads, and its deadline-bound worker calls."""

    tree: Tree
    uploads: set[FilesystemUpload]
    create_only: bool  # complete() refuses an existing key (the store as a second fence)

    async def call(self, op: str, what: str, fn: Callable[..., T], *args: object,
                   nbytes: int = 0, count: bool = True) -> T: ...


class FilesystemUpload(MultipartUpload):
    """One object being written into ``.uploads/<random>``; ``key`` is its final name."""

    def __init__(self, store: UploadOwner, key: str, metadata: dict[str, str]) -> None:
        self.key = key
        self.temp_path = store.tree.uploads / random_hex()
        self._store = store
        self._metadata = metadata
        self._parts: dict[int, tuple[int, int]] = {}
        self._fd = -1
        self._in_flight = 0
        self._state = "open"
        # Threads using self._fd right now. A thread that outlives its deadline still holds the
        # descriptor: closing it under the thread would let the number be reused by another
        # open() and the late write land in the wrong file. So the last user closes it.
        self._fd_lock = threading.Lock()
        self._fd_users = 0
        self._discard = False  # aborted while a thread held the fd: the last user cleans up
        self.counted = True  # False: the store's put() counts this upload as one PutObject

    def open_sync(self) -> None:
        self.temp_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.temp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with self._fd_lock:
            if self._discard:  # aborted before the open finished (a late thread)
                os.close(fd)
                self.temp_path.unlink(missing_ok=True)
                return
            self._fd = fd

    def _use_fd(self) -> int:
        with self._fd_lock:
            if self._fd < 0 or self._discard:
                raise Fatal(f"upload of {self.key} is no longer open")
            self._fd_users += 1
            return self._fd

    def _release_fd(self) -> None:
        with self._fd_lock:
            self._fd_users -= 1
            if self._fd_users == 0 and self._discard:
                self._close_and_remove_locked()

    def _close_and_remove_locked(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self.temp_path.unlink(missing_ok=True)

    def _write_sync(self, views: list[memoryview], offset: int) -> None:
        fd = self._use_fd()
        try:
            pwritev_all(fd, views, offset)
        finally:
            self._release_fd()

    async def put_part(self, part_number: int, offset: int, data: Buffers, *,
                       crc32c: int | None = None) -> None:
        # crc32c is not checked: it would be a second pass over every byte, and each block's
        # own CRC32C is checked on every read
        self._check_open()
        check_part(f"upload of {self.key}", part_number, offset)
        views = as_bytes_views(data)
        nbytes = sum(v.nbytes for v in views)
        self._in_flight += 1
        try:
            await self._store.call("put_part", f"writing part {part_number} of {self.key}",
                                   self._write_sync, views, offset, nbytes=nbytes,
                                   count=self.counted)
        finally:
            self._in_flight -= 1
        self._parts[part_number] = (offset, nbytes)

    async def complete(self) -> ObjectInfo:
        self._check_open()
        if self._in_flight:
            raise Fatal(f"upload of {self.key}: complete() while {self._in_flight} parts are "
                        "still being written; await every put_part first")
        size = check_parts(f"upload of {self.key}", self._parts)
        self._state = "completing"
        try:
            info = await self._store.call("complete", f"completing upload of {self.key} "
                                          f"under {self._store.tree.root}", self._complete_sync,
                                          size, nbytes=size, count=self.counted)
        except BaseException:
            self._state = "failed"  # abort() still cleans up
            raise
        self._state = "completed"
        self._store.uploads.discard(self)
        return info

    async def put_whole(self, data: Buffers) -> ObjectInfo:
        """Open, write ``data`` as the only part and complete, in one worker-thread call (the
        store's ``put``); :meth:`abort` afterwards cleans up as after the steps one by one."""
        self._check_open()
        views = as_bytes_views(data)
        size = sum(v.nbytes for v in views)
        self._state = "completing"
        try:
            info = await self._store.call("put", f"writing {self.key} under "
                                          f"{self._store.tree.root}", self._put_whole_sync,
                                          views, size, nbytes=size, count=self.counted)
        except BaseException:
            self._state = "failed"  # abort() still cleans up
            raise
        self._parts[1] = (0, size)
        self._state = "completed"
        self._store.uploads.discard(self)
        return info

    def _put_whole_sync(self, views: list[memoryview], size: int) -> ObjectInfo:
        self.open_sync()
        self._write_sync(views, 0)
        return self._complete_sync(size)

    def _complete_sync(self, size: int) -> ObjectInfo:
        fd = self._use_fd()
        try:
            # A re-sent part may have been shorter than the first attempt: cut any tail.
            os.ftruncate(fd, size)
            os.fsync(fd)
            # On disk now, and read rarely: drop its pages from the page cache, or growing the
            # cache makes every written byte cost a second kernel copy's worth of system time
            # and evicts what the brokers and the source read (docs/benchmarks.md, sidecar path)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            self._release_fd()
        with self._fd_lock:
            if self._discard:
                raise Fatal(f"upload of {self.key} was aborted while completing")
            os.close(self._fd)
            self._fd = -1
        target = self._store.tree.data_path(self.key)
        meta = self._store.tree.meta_path(self.key)
        meta_temp = self.temp_path.with_suffix(".meta")
        with open(meta_temp, "wb") as f:
            f.write(json.dumps({"metadata": self._metadata}, sort_keys=True).encode())
            f.flush()
            os.fsync(f.fileno())
        create_only = self._store.create_only
        try:
            meta.parent.mkdir(parents=True, exist_ok=True)
            if create_only:
                # link(2) never replaces an existing name: the sidecar is claimed first, so an
                # existing object's metadata is never touched
                try:
                    os.link(meta_temp, meta)
                except FileExistsError:
                    raise self._taken() from None
            else:
                os.replace(meta_temp, meta)
        finally:
            meta_temp.unlink(missing_ok=True)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError) as e:
            raise Fatal(f"object {self.key}: a parent directory is an existing object under "
                        f"{self._store.tree.root}; a key cannot be both an object and a prefix "
                        "directory in a filesystem store") from e
        if create_only:
            try:
                os.link(self.temp_path, target)
            except FileExistsError:
                meta.unlink(missing_ok=True)  # ours, linked just now: the data was there
                raise self._taken() from None
            self.temp_path.unlink(missing_ok=True)
        else:
            os.replace(self.temp_path, target)
        # Make the rename itself durable before reporting the object as written (a directory
        # fsync started after the rename; shared with the objects published beside it).
        self._store.tree.dir_syncs.sync(target.parent)
        st = target.stat()
        return ObjectInfo(self.key, st.st_size, dict(self._metadata), st.st_mtime)

    def _taken(self) -> Conflict:
        return Conflict(f"object {self.key} already exists under {self._store.tree.root}: "
                        "refused to overwrite it (create-only writes: the store's second fence)")

    async def abort(self) -> None:
        if self._state not in ("open", "failed"):
            return
        self._state = "aborted"
        self._store.uploads.discard(self)
        await self._store.call("abort", f"aborting upload of {self.key}", self._abort_sync,
                               count=self.counted)

    def _abort_sync(self) -> None:
        with self._fd_lock:
            self._discard = True
            if self._fd_users == 0:
                self._close_and_remove_locked()

    def _check_open(self) -> None:
        if self._state != "open":
            raise Fatal(f"upload of {self.key} is already {self._state}")
