"""Multipart uploads on S3: :class:`S3MultipartUpload`, and the store's :class:`Uploads`.

Parts may be uploaded concurrently and in any order; ``complete()`` checks that numbers run
1..N and offsets are contiguous before asking S3. S3 wants every part but the last to be at
least 5 MiB: callers size parts; S3's ``EntityTooSmall`` comes back as a ``Fatal`` that says
so. Lost responses are handled where a blind retry would go wrong: a retried
``CreateMultipartUpload`` aborts the stray upload a lost answer may have left for the same key
(keys are fresh per attempt, so any other upload of that key is ours), a retried
``CompleteMultipartUpload`` first checks (HEAD: size and multipart ETag) whether the earlier
attempt already published the object, and ``NoSuchUpload`` on abort means done. What an abort
leaves behind (a store that did not answer) is for gc's sweep of incomplete uploads
(:meth:`Uploads.sweep`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from botocore.exceptions import ClientError

from offloadd.blobstore.base import Buffers, MultipartUpload, ObjectInfo
from offloadd.blobstore.parts import check_part, check_parts
from offloadd.blobstore.s3.body import Body
from offloadd.blobstore.s3.calls import Requests
from offloadd.blobstore.s3.checksums import crc32c_b64, multipart_etag
from offloadd.blobstore.s3.errors import HINTS, error_code
from offloadd.errors import Fatal, OffloaddError

log = logging.getLogger(__name__)

MIN_PART_SIZE = 5 * 1024 * 1024  # S3's minimum for every part but the last
MAX_PART_NUMBER = 10_000


@dataclass(frozen=True)
class IncompleteUpload:
    key: str  # without the store's prefix
    upload_id: str
    initiated: float  # seconds since the epoch


class Uploads:
    """The multipart uploads of one store: start one, list, abort and sweep them."""

    def __init__(self, calls: Requests) -> None:
        self.calls = calls
        # CompleteMultipartUpload with If-None-Match: * (the store's probe said it refuses)
        self.create_only = False

    async def start(self, key: str, metadata: Mapping[str, str]) -> S3MultipartUpload:
        calls = self.calls
        tries = 0

        async def create(client: Any) -> str:
            nonlocal tries
            tries += 1
            resp = await client.create_multipart_upload(
                Bucket=calls.options.bucket,
                Key=calls.key(key),
                Metadata=dict(metadata),
                ChecksumAlgorithm="CRC32C",
                **calls.sse(),
            )
            return str(resp["UploadId"])

        upload_id = await calls.run("CreateMultipartUpload", key, create, write=True)
        if tries > 1:
            await self._abort_strays(key, keep=upload_id)
        return S3MultipartUpload(self, key, upload_id, metadata)

    async def list(self, prefix: str = "") -> AsyncIterator[IncompleteUpload]:
        strip = len(self.calls.options.prefix)
        pages = self.calls.pages("ListMultipartUploads", prefix, "MaxUploads",
                                 lambda c, args: c.list_multipart_uploads(**args),
                                 {"KeyMarker": "NextKeyMarker",
                                  "UploadIdMarker": "NextUploadIdMarker"})
        async for page in pages:
            for u in page.get("Uploads") or ():
                yield IncompleteUpload(
                    u["Key"][strip:], str(u["UploadId"]), u["Initiated"].timestamp()
                )

    async def sweep(self, older_than_s: float) -> int:
        """Abort uploads under our prefix started more than ``older_than_s`` ago (gc's pass
        calls it: an upload this old belongs to a crashed or abandoned attempt). Returns how
        many were aborted."""
        cutoff = time.time() - older_than_s
        # Collect first: aborting while paging would move the list's markers.
        stale = [u async for u in self.list() if u.initiated < cutoff]
        aborted = 0
        for u in stale:
            if await self.abort(u.key, u.upload_id):
                aborted += 1
        if aborted:
            log.info("swept %d stale multipart uploads from %s", aborted, self.calls.where(""))
        return aborted

    async def abort(self, key: str, upload_id: str) -> bool:
        """Abort one upload; False (logged) when the store did not let us."""
        calls = self.calls

        async def abort(client: Any) -> None:
            try:
                await client.abort_multipart_upload(
                    Bucket=calls.options.bucket, Key=calls.key(key), UploadId=upload_id
                )
            except ClientError as exc:
                if error_code(exc) not in ("NoSuchUpload", "404"):
                    raise  # else: already gone, maybe by an earlier attempt whose reply was lost

        try:
            await calls.run("AbortMultipartUpload", key, abort)
        except OffloaddError as exc:
            log.warning("abort of upload %s of %s failed (%s); gc's sweep of incomplete uploads "
                        "will remove it", upload_id, calls.where(key), exc)
            return False
        return True

    async def _abort_strays(self, key: str, keep: str) -> None:
        """Abort uploads of ``key`` that lost CreateMultipartUpload answers left behind."""
        try:
            strays = [u async for u in self.list(key) if u.key == key and u.upload_id != keep]
            for u in strays:
                await self.abort(u.key, u.upload_id)
        except OffloaddError as exc:
            log.warning("could not look for stray uploads of %s: %s", self.calls.where(key), exc)


@dataclass(frozen=True)
class _Part:
    number: int
    offset: int
    size: int
    etag: str
    checksum: str


class S3MultipartUpload(MultipartUpload):
    """One S3 multipart upload; see the module docstring."""

    def __init__(self, uploads: Uploads, key: str, upload_id: str,
                 metadata: Mapping[str, str]) -> None:
        self.key = key
        self.upload_id = upload_id
        self._uploads = uploads
        self._calls = uploads.calls
        self._metadata = dict(metadata)
        self._parts: dict[int, _Part] = {}
        self._finished: Literal["completed", "aborted"] | None = None

    def _check_open(self, op: str) -> None:
        if self._finished is not None:
            raise Fatal(f"{op} {self._calls.where(self.key)}: the upload was {self._finished}")

    async def put_part(self, part_number: int, offset: int, data: Buffers, *,
                       crc32c: int | None = None) -> None:
        self._check_open("UploadPart")
        calls = self._calls
        check_part(f"UploadPart {calls.where(self.key)}", part_number, offset, MAX_PART_NUMBER)
        body = Body(data)
        checksum = crc32c_b64(body.data, crc32c)

        async def upload(client: Any) -> str:
            body.seek(0)  # each attempt from the start (botocore reads it to sign over HTTP)
            try:
                resp = await client.upload_part(
                    Bucket=calls.options.bucket,
                    Key=calls.key(self.key),
                    UploadId=self.upload_id,
                    PartNumber=part_number,
                    Body=body,
                    ChecksumAlgorithm="CRC32C",
                    ChecksumCRC32C=checksum,
                )
            except ClientError as exc:
                if error_code(exc) == "NoSuchUpload":
                    raise Fatal(
                        f"UploadPart {calls.where(self.key)} part {part_number}: "
                        f"{HINTS['NoSuchUpload']}"
                    ) from None
                raise
            return str(resp["ETag"])

        etag = await calls.run("UploadPart", self.key, upload, write=True, nbytes=len(body))
        self._parts[part_number] = _Part(part_number, offset, len(body), etag, checksum)

    async def complete(self) -> ObjectInfo:
        self._check_open("CompleteMultipartUpload")
        calls = self._calls
        size = check_parts(f"CompleteMultipartUpload {calls.where(self.key)}",
                           {p.number: (p.offset, p.size) for p in self._parts.values()})
        parts = sorted(self._parts.values(), key=lambda p: p.number)
        info = ObjectInfo(self.key, size, dict(self._metadata), 0.0)
        etag = None if calls.options.sse == "aws:kms" else multipart_etag([p.etag for p in parts])

        async def published() -> ObjectInfo | None:
            """Did an earlier attempt, whose reply was lost, already publish the object?"""
            resp = await calls.head_once(self.key)
            if resp is None:
                return None
            if int(resp["ContentLength"]) != size:
                return None
            if etag is not None and str(resp.get("ETag", "")).strip('"') != etag:
                return None
            return dataclasses.replace(info, mtime=resp["LastModified"].timestamp())

        tries = 0
        condition = {"IfNoneMatch": "*"} if self._uploads.create_only else {}

        async def complete(client: Any) -> ObjectInfo:
            nonlocal tries
            tries += 1
            try:
                await client.complete_multipart_upload(
                    Bucket=calls.options.bucket,
                    Key=calls.key(self.key),
                    UploadId=self.upload_id,
                    MultipartUpload={
                        "Parts": [
                            {"PartNumber": p.number, "ETag": p.etag, "ChecksumCRC32C": p.checksum}
                            for p in parts
                        ]
                    },
                    **condition,
                )
            except ClientError as exc:
                # a retry refused because an earlier try, whose answer was lost, completed it
                if tries > 1 and error_code(exc) in ("NoSuchUpload", "PreconditionFailed"):
                    done = await published()
                    if done is not None:
                        return done
                raise
            return dataclasses.replace(info, mtime=time.time())

        result = await calls.run(
            "CompleteMultipartUpload", self.key, complete, write=True, already_done=published
        )
        self._finished = "completed"
        return result

    async def abort(self) -> None:
        """Best effort (retried, never raises): what is left is for gc's sweep."""
        if self._finished is not None:
            return
        if await self._uploads.abort(self.key, self.upload_id):
            self._finished = "aborted"
