"""The filesystem driver: :class:`FilesystemBlobStore`, its deadlines and its health.

File I/O runs in this store's own worker threads (:class:`~.workers.Workers`), each operation
within one deadline (:meth:`FilesystemBlobStore.call`), its outcome fed to the store's
:class:`~offloadd.blobstore.health.StoreHealth`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import TypeVar

from offloadd import aio
from offloadd.blobstore.base import (
    PROBE_KEY_PREFIX,
    BlobStore,
    Buffers,
    ConditionalWrites,
    ObjectInfo,
    UploadSweeper,
    WriteFence,
)
from offloadd.blobstore.filesystem.tree import FULL, Tree, check_key, translate
from offloadd.blobstore.filesystem.upload import FilesystemUpload
from offloadd.blobstore.filesystem.workers import Workers
from offloadd.blobstore.health import HealthPolicy, StoreHealth
from offloadd.blobstore.parts import check_range
from offloadd.blobstore.requests import RequestCounts
from offloadd.errors import ConfigError, Conflict, Fatal, NotFound, OffloaddError, Retriable

# the refusal a full volume records, whatever write met it; cleared by an object written whole
FULL_REFUSAL = "write"
WHOLE_OBJECT_WRITES = frozenset({"complete", "put"})

log = logging.getLogger(__name__)

T = TypeVar("T")

# the filesystem's operations under S3's names (one price list for both drivers)
S3_NAMES = {"start_upload": "CreateMultipartUpload", "put_part": "UploadPart",
            "complete": "CompleteMultipartUpload", "abort": "AbortMultipartUpload",
            "get_range": "GetObject", "head": "HeadObject", "delete": "DeleteObject",
            "list": "ListObjectsV2", "sweep": "ListMultipartUploads"}


# a call waiting for a worker thread gives up after this many deadlines (see _within)
QUEUED_BUDGETS = 4


class _Unanswered(Retriable):
    """An operation that missed its deadline (counted as a ``timeout``)."""


class FilesystemBlobStore(BlobStore, UploadSweeper, WriteFence):
    name = "filesystem"

    def __init__(self, root: str | Path, *, request_timeout_s: float = 30.0,
                 min_transfer_rate_bytes_per_s: float = 1024 * 1024,
                 health: StoreHealth | None = None, workers: int = 16,
                 requests: RequestCounts | None = None) -> None:
        if not (request_timeout_s > 0 and min_transfer_rate_bytes_per_s > 0 and workers >= 1):
            raise ConfigError("filesystem store: request_timeout_s and "
                              "min_transfer_rate_bytes_per_s must be > 0, workers >= 1")
        self.tree = Tree(Path(root).absolute())
        self.root = self.tree.root
        self._uri: str | None = None
        self.uploads: set[FilesystemUpload] = set()  # this instance's, unfinished
        self.request_timeout_s = request_timeout_s
        self.min_transfer_rate_bytes_per_s = min_transfer_rate_bytes_per_s
        self._health = health or StoreHealth(HealthPolicy(stall_after_s=request_timeout_s))
        if self._health.name is None:
            self._health.name = f"file://{self.root}"
        self._workers = Workers(workers, "fs-blobstore")
        # each operation counted under S3's name for it, so one price list fits both drivers
        self.requests = requests or RequestCounts(self.name)
        self._prober: asyncio.Task[None] | None = None
        # the store as a second fence (base.py): create-only once the probe found link(2) works
        self.create_only = False
        self.conditional = ConditionalWrites()

    @property
    def health(self) -> StoreHealth:
        return self._health

    async def call(self, op: str, what: str, fn: Callable[..., T], *args: object,
                   nbytes: int = 0, count: bool = True) -> T:
        """``fn(*args)`` in a worker thread within the operation's deadline; errors translated
        and recorded in the store's health (see the package docstring), and the operation
        counted (``count``) in :attr:`requests`."""
        result_of = "io"
        try:
            result = await self._call(op, what, fn, *args, nbytes=nbytes)
            result_of = "ok"
            return result
        except _Unanswered:
            result_of = "timeout"
            raise
        except (Fatal, NotFound):
            result_of = "client"
            raise
        finally:
            if count:
                self.requests.count(S3_NAMES.get(op, op), result_of)

    async def _call(self, op: str, what: str, fn: Callable[..., T], *args: object,
                    nbytes: int = 0) -> T:
        loop = asyncio.get_running_loop()
        if self._prober is None:
            self._prober = loop.create_task(self._health.run_prober(self._probe),
                                            name=f"fs-prober-{self.root}")
        budget = self.request_timeout_s + nbytes / self.min_transfer_rate_bytes_per_s
        health = self._health
        ticket = health.request_started()
        try:
            started: list[float] = []  # when a worker thread took the call up

            def run() -> T:
                started.append(time.monotonic())
                return fn(*args)

            queued_at = time.monotonic()
            future = aio.retrieved(loop.run_in_executor(self._workers, run))
            try:
                result = await self._within(future, started, queued_at, budget)
            except TimeoutError:
                health.record_stall()
                said = (f"{what}: no answer from the filesystem within {budget:.1f}s (deadline: "
                        "[blobstore] request_timeout_s); the disk or mount may be hung")
                log.warning("%s", said)
                raise _Unanswered(said) from None
            except OSError as e:
                err = translate(e, what)
                if e.errno in FULL:
                    # a full volume is retried, but only an operator frees space: not ready
                    # (/readyz 503 with the reason) until a whole object is written again. Not
                    # until a write of the same kind succeeds: an aborted upload frees room for
                    # a few parts of the next try, and readiness flapped with every retry
                    health.record_refused(FULL_REFUSAL, str(err))
                elif isinstance(err, Fatal):
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
            if op in WHOLE_OBJECT_WRITES:
                health.clear_refusal(FULL_REFUSAL)
            return result
        finally:
            health.request_finished(ticket)

    @staticmethod
    async def _within(future: asyncio.Future[T], started: list[float], queued_at: float,
                      budget: float) -> T:
        """``future``'s result within ``budget`` seconds of a worker thread taking the call up.

        The deadline is for the disk, not for the queue: under a burst of thousands of calls
        on 16 threads, counted from the submit, calls that had not even started missed it. A
        call still queued waits up to ``QUEUED_BUDGETS`` budgets in all (a hung disk holding
        every thread: those fail at their own deadlines, and the health check pauses writes).
        ``TimeoutError`` past the deadline; the call itself is left to finish (shielded)."""
        while True:
            now = time.monotonic()
            if started:
                wait = started[0] + budget - now
            else:
                wait = min(budget, queued_at + QUEUED_BUDGETS * budget - now)
            if wait <= 0:
                raise TimeoutError
            try:
                async with asyncio.timeout(wait):
                    return await asyncio.shield(future)
            except TimeoutError:
                continue  # taken up meanwhile (a new deadline from then), or past it: see above

    async def _probe(self) -> None:
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._workers, os.stat, self.root)
        try:
            async with asyncio.timeout(self.request_timeout_s):
                await asyncio.shield(aio.retrieved(future))
        except FileNotFoundError:
            return  # a root not made yet: the filesystem answered
        except (OSError, TimeoutError) as e:
            raise Retriable(f"filesystem store {self.root}: {e or 'no answer'}") from None

    def driver_properties(self) -> Mapping[str, str]:
        # (asked once per segment: ``as_uri`` was 3 % of a start-up of thousands of topics)
        if self._uri is None:
            self._uri = self.root.as_uri()
        return {"managedLedgerOffloadDriver": self.name, "fileSystemURI": self._uri}

    async def start_upload(self, key: str, metadata: Mapping[str, str], *,
                           count: bool = True) -> FilesystemUpload:
        check_key(key)
        upload = FilesystemUpload(self, key, dict(metadata))
        upload.counted = count
        await self.call("start_upload", f"starting upload of {key} under {self.root}",
                        upload.open_sync, count=count)
        self.uploads.add(upload)
        return upload

    async def put(self, key: str, data: Buffers, metadata: Mapping[str, str], *,
                  crc32c: int | None = None) -> ObjectInfo:
        # one PutObject, as on S3, though it is made of an upload's three steps here: all three
        # in one worker-thread call (a segment's data and index are a put each; one hop per
        # step was most of a small segment's commit on the event loop)
        result_of = "io"
        try:
            check_key(key)
            upload = FilesystemUpload(self, key, dict(metadata))
            upload.counted = False
            self.uploads.add(upload)
            try:
                info = await upload.put_whole(data)
            finally:
                await upload.abort()
            result_of = "ok"
            return info
        except (Fatal, NotFound):
            result_of = "client"
            raise
        finally:
            self.requests.count("PutObject", result_of)

    async def probe_conditional_writes(self) -> ConditionalWrites:
        """Create-only writes publish with ``link(2)``, which never replaces an existing name
        (the metadata sidecar first, then the data); a filesystem without hard links (some
        network and FUSE mounts) fails the probe, and writes keep ``rename(2)``, which
        overwrites."""
        key = f"{PROBE_KEY_PREFIX}{uuid.uuid4().hex}"
        self.create_only = True
        refused, why, answered = False, "", True
        try:
            await self.put(key, [b"first"], {})
            try:
                await self.put(key, [b"second"], {})
            except Conflict:
                refused = True
            else:
                why = "a second create-only write of the probe key was not refused"
        except OffloaddError as exc:
            why = f"the probe failed: {exc}"
            answered = not isinstance(exc, Retriable)  # a hung or failing disk: ask again
        finally:
            self.create_only = False
            with contextlib.suppress(OffloaddError):
                await self.delete(key)
        self.create_only = refused
        self.conditional = ConditionalWrites(
            put=refused, complete=refused,
            how="objects are published with link(2), which refuses an existing key" if refused
            else f"off: {why}; objects are published with rename(2), which overwrites",
            answered=answered)
        return self.conditional

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        check_range(key, start, end)
        return await self.call("get_range", f"reading {key} [{start}, {end}) under {self.root}",
                               self.tree.read, key, start, end, nbytes=end - start)

    async def head(self, key: str) -> ObjectInfo:
        return await self.call("head", f"head of {key} under {self.root}", self.tree.head, key)

    async def delete(self, key: str) -> None:
        await self.call("delete", f"deleting {key} under {self.root}", self.tree.delete, key)

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        infos = await self.call("list", f"listing {prefix!r} under {self.root}",
                                self.tree.list, prefix)
        for info in infos:
            yield info

    async def sweep_incomplete_uploads(self, older_than_s: float) -> int:
        """Delete upload temp files untouched for ``older_than_s`` seconds (what a crash or a
        hung disk left; gc's pass calls it).

        Uploads of this instance are never swept; another process's live upload touches its
        file on every part, so a threshold well above the slowest part's time is safe.
        """
        mine = {u.temp_path for u in self.uploads}
        return await self.call("sweep", f"sweeping {self.tree.uploads}", self.tree.sweep,
                               older_than_s, mine)

    async def close(self) -> None:
        try:
            for upload in list(self.uploads):
                with contextlib.suppress(Retriable):  # a hung disk: gc's sweep removes it later
                    await upload.abort()
        finally:
            if self._prober is not None:
                self._prober.cancel()
                await asyncio.gather(self._prober, return_exceptions=True)
                self._prober = None
            self._workers.shutdown(wait=False)
