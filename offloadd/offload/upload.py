"""The uploader: one segment's data object as a multipart upload, several parts in flight.

The multipart upload is created with the first part, not before: a segment that closes before it
has filled one part (a low-rate topic rolled by time) is written by a single PUT instead
(:meth:`SegmentUpload.finish`), two PUT-class requests fewer than create + part + complete.

A part is a run of whole blocks (``offload/parts.py``). Before its bytes leave, the part takes
its size from the broker-wide throttle (its blocks' bytes: no padding beyond each block's own 4+
bytes); when it has landed (or failed), its ``done`` callback runs, and the caller releases the
offload-buffer bytes behind its blocks. The first failed part fails the whole attempt (the topic
task aborts it and redoes the segment). Each block carries its own CRC32C (stamped into its
header before it is submitted, ``format/checksum.py``); each part goes with the CRC32C combined
from its blocks' (the store's per-part checksum, see ``blobstore/base.py``); no checksum of the
whole object is computed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

from offloadd.blobstore.base import BlobStore, MultipartUpload, ObjectInfo
from offloadd.offload.parts import UploadPart

Acquire = Callable[[int], Awaitable[object]]
T = TypeVar("T")


class SegmentUpload:
    def __init__(self, store: BlobStore, key: str, metadata: Mapping[str, str], *,
                 in_flight: int, acquire: Acquire | None = None,
                 on_part_done: Callable[[int, float], None] | None = None) -> None:
        self.store = store
        self.key = key
        self.metadata = dict(metadata)
        self._sem = asyncio.Semaphore(in_flight)
        self._in_flight = in_flight
        self._acquire = acquire
        self._on_part_done = on_part_done
        self._upload: MultipartUpload | None = None
        self._starting: asyncio.Future[MultipartUpload] | None = None
        # done tasks leave the set at once: a finished part must not pin its block's bytes
        self._tasks: set[asyncio.Task[None]] = set()
        self._error: BaseException | None = None
        self._completed = False
        self.length = 0
        self.parts = 0
        self.requests = 0  # PUT-class requests that wrote the object (retries not counted)

    async def start(self) -> None:
        """Create the multipart upload now (otherwise the first submitted part does)."""
        self._upload = await self._begin()

    def _begin(self) -> asyncio.Future[MultipartUpload]:
        if self._starting is None:
            self._starting = asyncio.ensure_future(self.store.start_upload(self.key,
                                                                           self.metadata))
            self.requests += 2  # its create and, later, its complete
        return self._starting

    @property
    def failed(self) -> BaseException | None:
        return self._error

    async def wait_for_room(self) -> None:
        """Wait until fewer parts are pending than may be in flight: reading further ahead
        than the uploads can take only holds memory (and fresh buffers) for nothing."""
        while len(self._tasks) >= self._in_flight and self._error is None:
            await asyncio.wait(list(self._tasks), return_when=asyncio.FIRST_COMPLETED)

    def submit(self, parts: Sequence[UploadPart], done: Callable[[UploadPart], None]) -> None:
        """Schedule ``parts``; ``done(part)`` runs once per part when it landed (or failed)."""
        if self._completed:
            raise RuntimeError(f"{self.key}: the object is already written")
        if parts:
            self._begin()
        for p in parts:
            self.length = max(self.length, p.offset + p.length)
            self.parts += 1
            self.requests += 1

        def finished(part: UploadPart) -> Callable[[asyncio.Task[None]], None]:
            def callback(t: asyncio.Task[None]) -> None:
                self._tasks.discard(t)
                done(part)
            return callback

        for p in parts:
            t = asyncio.create_task(self._put(p), name=f"part-{self.key}-{p.number}")
            t.add_done_callback(finished(p))
            self._tasks.add(t)

    async def _put(self, part: UploadPart) -> None:
        assert self._starting is not None
        async with self._sem:
            if self._error is not None:
                return
            try:
                upload = self._upload = await self._starting
                await self._send(part, lambda: upload.put_part(part.number, part.offset,
                                                               part.buffers,
                                                               crc32c=part.crc32c))
            except BaseException as exc:
                if self._error is None:
                    self._error = exc
                if isinstance(exc, asyncio.CancelledError):
                    raise

    async def drain(self) -> None:
        """Wait for every submitted part; raise the first failure."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        if self._error is not None:
            raise self._error

    async def complete(self) -> ObjectInfo:
        await self.drain()
        if self._upload is None:
            raise RuntimeError(f"{self.key}: no part was submitted")
        info = await self._upload.complete()
        self._completed = True
        return info

    async def finish(self, last: UploadPart | None,
                     done: Callable[[UploadPart], None]) -> ObjectInfo:
        """Submit the ``last`` part (if any) and complete the object. An object that is all
        one part is written by one PUT instead of create, part and complete (through the
        throttle like any part; create-only like a completion where the store fences
        writes)."""
        if last is None or self._starting is not None:
            if last is not None:
                self.submit([last], done)
            return await self.complete()
        try:
            self.length, self.parts, self.requests = last.offset + last.length, 1, 1
            info = await self._send(last, lambda: self.store.put(self.key, last.buffers,
                                                                 self.metadata,
                                                                 crc32c=last.crc32c))
            self._completed = True
            return info
        finally:
            done(last)

    async def _send(self, part: UploadPart, write: Callable[[], Awaitable[T]]) -> T:
        """``write()`` the bytes of ``part`` once the throttle lets them through, reporting
        how long the write took."""
        if self._acquire is not None:
            await self._acquire(part.length)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        result = await write()
        if self._on_part_done is not None:
            self._on_part_done(part.length, loop.time() - t0)
        return result

    async def abort(self) -> None:
        """Cancel in-flight parts and discard the upload (best effort); a completed upload is
        an object now, which only deleting it removes."""
        if self._completed:
            return
        for t in self._tasks:
            t.cancel()
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        self._tasks.clear()
        if self._starting is not None and self._upload is None:
            # a create in flight may still make an upload on the server: wait for it (the
            # store's deadlines bound this) so that it can be aborted, not left to the sweep
            with contextlib.suppress(Exception):
                self._upload = await asyncio.shield(self._starting)
        if self._upload is not None:
            with contextlib.suppress(Exception):  # offloadd gc sweeps stale uploads
                await self._upload.abort()
