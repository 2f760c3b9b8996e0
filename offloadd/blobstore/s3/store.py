"""The S3 driver's :class:`~offloadd.blobstore.base.BlobStore`: :class:`S3BlobStore`."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, suppress
from typing import Any

from botocore.exceptions import ClientError

from offloadd.blobstore.base import (
    PROBE_KEY_PREFIX,
    BlobStore,
    Buffers,
    ConditionalWrites,
    ObjectInfo,
    UploadSweeper,
    WriteFence,
)
from offloadd.blobstore.health import StoreHealth
from offloadd.blobstore.parts import check_range
from offloadd.blobstore.requests import RequestCounts
from offloadd.blobstore.s3.body import Body
from offloadd.blobstore.s3.calls import Requests, State
from offloadd.blobstore.s3.checksums import crc32c_b64
from offloadd.blobstore.s3.errors import error_code
from offloadd.blobstore.s3.multipart import IncompleteUpload, S3MultipartUpload, Uploads
from offloadd.blobstore.s3.options import S3Options
from offloadd.blobstore.s3.session import connect
from offloadd.errors import Conflict, NotFound, OffloaddError, Retriable


class S3BlobStore(BlobStore, UploadSweeper, WriteFence):
    """:class:`~offloadd.blobstore.base.BlobStore` on S3; create with :meth:`open`."""

    name = "aws-s3"

    def __init__(self, calls: Requests, stack: AsyncExitStack) -> None:
        self._calls = calls
        self._stack = stack
        self._uploads = Uploads(calls)
        self._prober: asyncio.Task[None] | None = None
        self.conditional = ConditionalWrites()  # until probed: writes overwrite

    @classmethod
    async def open(cls, options: S3Options, *, health: StoreHealth | None = None,
                   requests: RequestCounts | None = None) -> S3BlobStore:
        """``requests``: where every request of the store's clients is counted (default: a
        counter of its own, :attr:`requests`)."""
        requests = requests or RequestCounts(cls.name)
        stack = AsyncExitStack()
        primary, replicas = await connect(options, stack, requests)
        # the stall watchdog's patience is the request deadline (see health.py, "Stalls")
        health = health or StoreHealth(dataclasses.replace(
            options.health, stall_after_s=options.request_timeout_s))
        if health.name is None:
            health.name = f"s3://{options.bucket}/{options.prefix}".rstrip("/")
        store = cls(Requests(options, primary, replicas, health, requests), stack)
        store._prober = asyncio.get_running_loop().create_task(
            health.run_prober(store._calls.probe), name=f"s3-prober-{options.bucket}"
        )
        return store

    @property
    def options(self) -> S3Options:
        return self._calls.options

    @property
    def health(self) -> StoreHealth:
        return self._calls.health

    @property
    def requests(self) -> RequestCounts:
        return self._calls.counts

    async def close(self) -> None:
        if self._calls.state is State.CLOSED:
            return
        self._calls.state = State.CLOSED
        if self._prober is not None:
            self._prober.cancel()
            await asyncio.gather(self._prober, return_exceptions=True)
        await self._stack.aclose()

    def driver_properties(self) -> Mapping[str, str]:
        return {
            "managedLedgerOffloadDriver": self.name,
            "bucket": self.options.bucket,
            "region": self.options.region,
            "serviceEndpoint": self.options.endpoint or "",
        }

    # -- objects -------------------------------------------------------------------------

    async def start_upload(self, key: str, metadata: Mapping[str, str]) -> S3MultipartUpload:
        return await self._uploads.start(key, metadata)

    async def put(self, key: str, data: Buffers, metadata: Mapping[str, str], *,
                  crc32c: int | None = None) -> ObjectInfo:
        return await self._put(key, Body(data), metadata, self.conditional.put, crc32c)

    async def _put(self, key: str, body: Body, metadata: Mapping[str, str],
                   create_only: bool, crc32c: int | None = None) -> ObjectInfo:
        calls = self._calls
        checksum = crc32c_b64(body.data, crc32c)
        condition = {"IfNoneMatch": "*"} if create_only else {}
        info = ObjectInfo(key, len(body), dict(metadata), 0.0)

        async def put(client: Any) -> None:
            body.seek(0)  # each attempt from the start (botocore reads it to sign over HTTP)
            await client.put_object(
                Bucket=calls.options.bucket,
                Key=calls.key(key),
                Body=body,
                Metadata=dict(metadata),
                ChecksumAlgorithm="CRC32C",
                ChecksumCRC32C=checksum,
                **calls.sse(),
                **condition,
            )

        async def landed() -> ObjectInfo | None:
            """Is the object there already ours (an earlier try whose answer was lost)? Then
            a create-only retry's refusal is no conflict."""
            resp = await calls.head_once(key)
            if resp is None:
                return None
            if int(resp["ContentLength"]) == len(body) and \
                    dict(resp.get("Metadata") or {}) == dict(metadata):
                return dataclasses.replace(info, mtime=resp["LastModified"].timestamp())
            return None

        await calls.run("PutObject", key, put, write=True, nbytes=len(body),
                        already_done=landed if create_only else None)
        return dataclasses.replace(info, mtime=time.time())

    async def probe_conditional_writes(self) -> ConditionalWrites:
        """Write a key of ours (``offloadd-probe-<hex>`` under the prefix) with
        ``If-None-Match: *`` twice, by PutObject and by CompleteMultipartUpload: a store that
        refuses the second (412) supports the condition on that call. Then the key goes. From
        then on ``put`` and ``complete`` carry the condition where it is supported (an S3 that
        ignores it would overwrite, so sending it there would be a promise not kept)."""
        key = f"{PROBE_KEY_PREFIX}{uuid.uuid4().hex}"
        notes: list[str] = []
        put = complete = False
        answered = reachable = True
        try:
            await self._put(key, Body(b"offloadd conditional-write probe"), {}, True)
            try:
                await self._put(key, Body(b"offloadd conditional-write probe, again"), {},
                                True)
                notes.append("PutObject ignores If-None-Match")
            except Conflict:
                put = True
            up = await self._uploads.start(key, {})
            try:
                await up.put_part(1, 0, [b"offloadd conditional-write probe, multipart"])
                self._uploads.create_only = True
                try:
                    await up.complete()
                    notes.append("CompleteMultipartUpload ignores If-None-Match")
                except Conflict:
                    complete = True
            finally:
                self._uploads.create_only = False
                with suppress(OffloaddError):
                    await up.abort()
        except OffloaddError as exc:
            notes.append(f"the probe failed: {exc}")
            # unanswered, whatever the failure: an outage, but also a bucket not created yet
            # or credentials not granted yet (NoSuchBucket, AccessDenied) say nothing about
            # If-None-Match, and the operator's fix must not need a restart to turn the fence on
            answered = False
            reachable = not isinstance(exc, Retriable)
        finally:
            if reachable:  # an unreachable store is not kept waiting for a delete too
                with suppress(OffloaddError):
                    await self.delete(key)
        self._uploads.create_only = complete
        on = [name for name, ok in (("PutObject", put), ("CompleteMultipartUpload", complete))
              if ok]
        how = (f"If-None-Match: * on {' and '.join(on)}" if on else "off") + \
            (f" ({'; '.join(notes)})" if notes else "")
        self.conditional = ConditionalWrites(put=put, complete=complete, how=how,
                                             answered=answered)
        return self.conditional

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        calls = self._calls
        check_range(calls.where(key), start, end)
        if end == start:
            await self.head(key)  # still NotFound for an absent object
            return b""

        async def get(client: Any) -> bytes:
            try:
                resp = await client.get_object(
                    Bucket=calls.options.bucket,
                    Key=calls.key(key),
                    Range=f"bytes={start}-{end - 1}",
                )
            except ClientError as exc:
                if error_code(exc) == "InvalidRange":
                    return b""  # the range starts at or past the object's end
                raise
            async with resp["Body"] as stream:
                data: bytes = await stream.read()
            expected = resp.get("ContentLength")
            if expected is not None and len(data) != int(expected):
                raise Retriable(
                    f"S3 GetObject {calls.where(key)}: body cut short "
                    f"({len(data)} of {expected} bytes)"
                )
            if not resp.get("ContentRange"):
                data = data[start:end]  # a server that ignored Range sent the whole object
            return data

        return await calls.run("GetObject", key, get, read=True, nbytes=end - start)

    async def head(self, key: str) -> ObjectInfo:
        calls = self._calls

        async def head(client: Any) -> ObjectInfo:
            resp = await client.head_object(Bucket=calls.options.bucket, Key=calls.key(key))
            return ObjectInfo(
                key,
                int(resp["ContentLength"]),
                dict(resp.get("Metadata") or {}),
                resp["LastModified"].timestamp(),
            )

        return await calls.run("HeadObject", key, head, read=True)

    async def delete(self, key: str) -> None:
        calls = self._calls

        async def delete(client: Any) -> None:
            await client.delete_object(Bucket=calls.options.bucket, Key=calls.key(key))

        with suppress(NotFound):  # deleting an absent key is not an error
            await calls.run("DeleteObject", key, delete, write=True)

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        strip = len(self.options.prefix)
        pages = self._calls.pages("ListObjectsV2", prefix, "MaxKeys",
                                  lambda c, args: c.list_objects_v2(**args),
                                  {"ContinuationToken": "NextContinuationToken"})
        async for page in pages:
            for obj in page.get("Contents") or ():
                yield ObjectInfo(
                    obj["Key"][strip:], int(obj["Size"]), {}, obj["LastModified"].timestamp()
                )

    # -- incomplete uploads ----------------------------------------------------------------

    def list_incomplete_uploads(self, prefix: str = "") -> AsyncIterator[IncompleteUpload]:
        return self._uploads.list(prefix)

    async def sweep_incomplete_uploads(self, older_than_s: float) -> int:
        """Abort multipart uploads under our prefix started more than ``older_than_s`` ago
        (gc's pass calls it); returns how many were aborted."""
        return await self._uploads.sweep(older_than_s)
