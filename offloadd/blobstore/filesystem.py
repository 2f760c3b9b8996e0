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

Deadlines and health. File I/O runs in this store's own worker threads (daemon threads: a call
stuck on a hung mount neither starves the event loop's default executor, which the ledger source
uses, nor holds up the process's exit). Every operation has one deadline, ``request_timeout_s``
plus its bytes at ``min_transfer_rate_bytes_per_s``; one that misses it fails as ``Retriable``
naming the operation and the key (the thread may still finish its call later; an upload's file
descriptor is closed only once no thread uses it). Outcomes feed a
:class:`~offloadd.blobstore.health.StoreHealth` as the S3 driver's do: errors the disk answered
(disk full, I/O error) and missed deadlines count as failures, ``Fatal`` answers (permissions, a
read-only mount) as refusals, and its watchdog probes the root (``stat``) when the disk stops
answering. The circuit reports (``/readyz``, metrics); it does not hold writes back.
"""

from __future__ import annotations

import asyncio
import builtins
import concurrent.futures
import contextlib
import errno
import json
import logging
import os
import queue
import stat
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from offloadd.blobstore.base import Buffers, ObjectInfo
from offloadd.blobstore.health import HealthPolicy, StoreHealth
from offloadd.blobstore.parts import check_part, check_parts, check_range
from offloadd.errors import ConfigError, Fatal, NotFound, OffloaddError, Retriable

log = logging.getLogger(__name__)

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


class _Workers(concurrent.futures.Executor):
    """Up to ``size`` daemon threads, started on demand. Not ThreadPoolExecutor: its threads
    are joined at interpreter exit, so one call stuck on a hung mount would hang the exit."""

    def __init__(self, size: int, name: str) -> None:
        self._size = size
        self._name = name
        self._queue: queue.SimpleQueue[tuple[concurrent.futures.Future[Any],
                                             Callable[[], Any]] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._unfinished = 0  # submitted, not yet done (queued or running)
        self._closed = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any
               ) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                raise Fatal("the filesystem store is closed")
            self._unfinished += 1
            if self._unfinished > self._threads and self._threads < self._size:
                self._threads += 1
                threading.Thread(target=self._work, name=f"{self._name}-{self._threads}",
                                 daemon=True).start()
            self._queue.put((future, lambda: fn(*args, **kwargs)))
        return future

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, call = item
            try:
                if future.set_running_or_notify_cancel():
                    try:
                        result = call()
                    except BaseException as exc:
                        future.set_exception(exc)
                    else:
                        future.set_result(result)
            finally:
                with self._lock:
                    self._unfinished -= 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closed = True
            for _ in range(self._threads):
                self._queue.put(None)


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

    def __init__(self, root: str | Path, *, request_timeout_s: float = 30.0,
                 min_transfer_rate_bytes_per_s: float = 1024 * 1024,
                 health: StoreHealth | None = None, workers: int = 16) -> None:
        if not (request_timeout_s > 0 and min_transfer_rate_bytes_per_s > 0 and workers >= 1):
            raise ConfigError("filesystem store: request_timeout_s and "
                              "min_transfer_rate_bytes_per_s must be > 0, workers >= 1")
        self.root = Path(root).absolute()
        self._uploads: set[FilesystemUpload] = set()
        self.request_timeout_s = request_timeout_s
        self.min_transfer_rate_bytes_per_s = min_transfer_rate_bytes_per_s
        self._health = health or StoreHealth(HealthPolicy(stall_after_s=request_timeout_s))
        if self._health.name is None:
            self._health.name = f"file://{self.root}"
        self._workers = _Workers(workers, "fs-blobstore")
        self._prober: asyncio.Task[None] | None = None

    @property
    def health(self) -> StoreHealth:
        return self._health

    async def _run(self, op: str, what: str, fn: Callable[..., T], *args: object,
                   nbytes: int = 0) -> T:
        """``fn(*args)`` in a worker thread within the operation's deadline; errors translated
        and recorded in the store's health (see the module docstring)."""
        loop = asyncio.get_running_loop()
        if self._prober is None:
            self._prober = loop.create_task(self._health.run_prober(self._probe),
                                            name=f"fs-prober-{self.root}")
        budget = self.request_timeout_s + nbytes / self.min_transfer_rate_bytes_per_s
        health = self._health
        ticket = health.request_started()
        try:
            future = loop.run_in_executor(self._workers, fn, *args)
            try:
                async with asyncio.timeout(budget):
                    result = await asyncio.shield(future)
            except TimeoutError:
                health.record_stall()
                said = (f"{what}: no answer from the filesystem within {budget:.1f}s (deadline: "
                        "[blobstore] request_timeout_s); the disk or mount may be hung")
                log.warning("%s", said)
                raise Retriable(said) from None
            except OSError as e:
                err = _translate(e, what)
                if isinstance(err, Fatal):
                    health.record_refused(op, str(err))
                elif isinstance(err, Retriable):
                    health.record_failure(answered=True)
                else:
                    health.record_success()
                raise err from e
            except NotFound:
                health.record_success()
                raise
            health.record_success(op)
            return result
        finally:
            health.request_finished(ticket)

    async def _probe(self) -> None:
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._workers, os.stat, self.root)
        try:
            async with asyncio.timeout(self.request_timeout_s):
                await asyncio.shield(future)
        except FileNotFoundError:
            return  # a root not made yet: the filesystem answered
        except (OSError, TimeoutError) as e:
            raise Retriable(f"filesystem store {self.root}: {e or 'no answer'}") from None

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
        await self._run("start_upload", f"starting upload of {key} under {self.root}",
                        upload.open_sync)
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
        return await self._run("get_range", f"reading {key} [{start}, {end}) under {self.root}",
                               self._read_sync, key, start, end, nbytes=end - start)

    async def head(self, key: str) -> ObjectInfo:
        return await self._run("head", f"head of {key} under {self.root}", self._head_sync, key)

    async def delete(self, key: str) -> None:
        await self._run("delete", f"deleting {key} under {self.root}", self._delete_sync, key)

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        infos = await self._run("list", f"listing {prefix!r} under {self.root}",
                                self._list_sync, prefix)
        for info in infos:
            yield info

    async def sweep_uploads(self, older_than_s: float) -> int:
        """Delete temp files untouched for ``older_than_s`` seconds (crash leftovers).

        Uploads of this instance are never swept; another process's live upload touches its
        file on every part, so a threshold well above the slowest part's time is safe.
        """
        return await self._run("sweep", f"sweeping {self.root / _UPLOADS}", self._sweep_sync,
                               older_than_s)

    async def close(self) -> None:
        try:
            for upload in list(self._uploads):
                with contextlib.suppress(Retriable):  # a hung disk: the sweep removes it later
                    await upload.abort()
        finally:
            if self._prober is not None:
                self._prober.cancel()
                await asyncio.gather(self._prober, return_exceptions=True)
                self._prober = None
            self._workers.shutdown(wait=False)

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
        # Threads using self._fd right now. A thread that outlives its deadline still holds the
        # descriptor: closing it under the thread would let the number be reused by another
        # open() and the late write land in the wrong file. So the last user closes it.
        self._fd_lock = threading.Lock()
        self._fd_users = 0
        self._discard = False  # aborted while a thread held the fd: the last user cleans up

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
            _pwritev_all(fd, views, offset)
        finally:
            self._release_fd()

    async def put_part(self, part_number: int, offset: int, data: Buffers) -> None:
        self._check_open()
        check_part(f"upload of {self.key}", part_number, offset)
        views = _as_bytes_views(data)
        nbytes = sum(v.nbytes for v in views)
        self._in_flight += 1
        try:
            await self._store._run("put_part", f"writing part {part_number} of {self.key}",
                                   self._write_sync, views, offset, nbytes=nbytes)
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
            info = await self._store._run("complete", f"completing upload of {self.key} "
                                          f"under {self._store.root}", self._complete_sync,
                                          size, nbytes=size)
        except BaseException:
            self._state = "failed"  # abort() still cleans up
            raise
        self._state = "completed"
        self._store._uploads.discard(self)
        return info

    def _complete_sync(self, size: int) -> ObjectInfo:
        fd = self._use_fd()
        try:
            # A re-sent part may have been shorter than the first attempt: cut any tail.
            os.ftruncate(fd, size)
            os.fsync(fd)
        finally:
            self._release_fd()
        with self._fd_lock:
            if self._discard:
                raise Fatal(f"upload of {self.key} was aborted while completing")
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
        await self._store._run("abort", f"aborting upload of {self.key}", self._abort_sync)

    def _abort_sync(self) -> None:
        with self._fd_lock:
            self._discard = True
            if self._fd_users == 0:
                self._close_and_remove_locked()

    def _check_open(self) -> None:
        if self._state != "open":
            raise Fatal(f"upload of {self.key} is already {self._state}")
