"""The uploader: one segment's data object as a multipart upload, several parts in flight.

A part is a run of whole blocks (``offload/parts.py``). Before its bytes leave, the part takes
its size from the broker-wide throttle (its blocks' bytes: no padding beyond each block's own 4+
bytes); when it has landed (or failed), its ``done`` callback runs, and the caller releases the
offload-buffer bytes behind its blocks. The first failed part fails the whole attempt (the topic
task aborts it and redoes the segment). Each block carries its own CRC32C (stamped into its
header before it is submitted, ``format/checksum.py``); no checksum of the whole object is
computed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence

from offloadd.blobstore.base import BlobStore, MultipartUpload, ObjectInfo
from offloadd.offload.parts import UploadPart

Acquire = Callable[[int], Awaitable[object]]


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
        # done tasks leave the set at once: a finished part must not pin its block's bytes
        self._tasks: set[asyncio.Task[None]] = set()
        self._error: BaseException | None = None
        self._completed = False
        self.length = 0
        self.parts = 0

    async def start(self) -> None:
        self._upload = await self.store.start_upload(self.key, self.metadata)

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
        if self._upload is None:
            raise RuntimeError("upload not started")
        for p in parts:
            self.length = max(self.length, p.offset + p.length)
            self.parts += 1

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
        assert self._upload is not None
        async with self._sem:
            if self._error is not None:
                return
            try:
                if self._acquire is not None:
                    await self._acquire(part.length)
                loop = asyncio.get_running_loop()
                t0 = loop.time()
                await self._upload.put_part(part.number, part.offset, part.buffers)
                if self._on_part_done is not None:
                    self._on_part_done(part.length, loop.time() - t0)
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
        assert self._upload is not None
        info = await self._upload.complete()
        self._completed = True
        return info

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
        if self._upload is not None:
            with contextlib.suppress(Exception):  # offloadd gc sweeps stale uploads
                await self._upload.abort()
