"""Request accounting: the drivers' counters equal what the server saw.

The S3 driver talks to moto_server through the fault proxy, which logs every request it is sent
(method, path, the fault it injected); the driver's counts by operation and by result must equal
the proxy's, request for request — with retries, 503 SlowDown, 500, connection resets, 404s and
a lost-reply check in the mix.
"""

from __future__ import annotations

import asyncio
import collections
import random
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from offloadd.blobstore.filesystem import FilesystemBlobStore
from offloadd.blobstore.requests import RequestCounts, price_class
from offloadd.blobstore.s3 import S3BlobStore
from offloadd.errors import NotFound, OffloaddError
from tests.fixtures.faultproxy import FaultPlan, FaultProxy
from tests.fixtures.s3 import MotoBucket

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

META = {"role": "data"}


def s3_op(method: str, path: str) -> str:
    """The S3 operation of one request as the server sees it (path-style addressing)."""
    split = urlsplit(path)
    query = parse_qs(split.query, keep_blank_values=True)
    on_object = split.path.strip("/").count("/") >= 1
    if method == "HEAD":
        return "HeadObject" if on_object else "HeadBucket"
    if method == "PUT":
        return "UploadPart" if "partNumber" in query else "PutObject"
    if method == "POST":
        return "CreateMultipartUpload" if "uploads" in query else "CompleteMultipartUpload"
    if method == "DELETE":
        return "AbortMultipartUpload" if "uploadId" in query else "DeleteObject"
    if method == "GET":
        if not on_object:
            return "ListMultipartUploads" if "uploads" in query else "ListObjectsV2"
        return "GetObject"
    raise AssertionError(f"unexpected request {method} {path}")


# what a fault injected by the proxy looks like to the client
FAULT_RESULT = {"500": "server", "503": "throttled", "reset": "io"}


@pytest.fixture
def proxy(moto_server: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_server, seed=16) as p:
        yield p


async def workload(store: S3BlobStore | FilesystemBlobStore, rng: random.Random) -> None:
    """Every kind of request: multipart uploads of several parts, PUTs, ranged GETs, HEADs
    (some of absent keys), listings, deletes, an aborted upload."""
    for n in range(4):
        key = f"seg-{n}"
        up = await store.start_upload(key, META)
        parts = [rng.randbytes(300 + 100 * i) for i in range(3)]
        offset = 0
        for i, p in enumerate(parts, start=1):
            await up.put_part(i, offset, [p])
            offset += len(p)
        await up.complete()
        await store.put(f"{key}-index", [rng.randbytes(64)], META)
        await store.get_range(key, 0, 100)
        await store.get_range(key, 100, offset)
        await store.head(f"{key}-index")
        with pytest.raises(NotFound):
            await store.head(f"absent-{n}")
    doomed = await store.start_upload("abandoned", META)
    await doomed.put_part(1, 0, [b"x" * 10])
    await doomed.abort()
    assert len([o async for o in store.list("seg-")]) == 8
    for n in range(2):
        await store.delete(f"seg-{n}")


class TestS3RequestCounts:
    """Counted per HTTP request, by operation and result, exactly as the proxy saw them."""

    async def test_counts_equal_the_proxys_log_under_faults(
            self, s3_bucket: MotoBucket, proxy: FaultProxy) -> None:
        # faults only where the driver retries (writes wait out no circuit here: few of them)
        proxy.plan = FaultPlan(error_500=0.06, slowdown_503=0.06, reset=0.06)
        counts = RequestCounts("aws-s3")
        store = await S3BlobStore.open(
            s3_bucket.options(endpoint=proxy.url, retry_base_s=0.01, retry_max_s=0.05,
                              max_attempts=20), requests=counts)
        try:
            await workload(store, random.Random(3))
        finally:
            await store.close()
        await asyncio.sleep(0)

        seen: collections.Counter[tuple[str, str]] = collections.Counter()
        for _, method, path, fault in list(proxy.log):
            if fault:
                seen[(s3_op(method, path), FAULT_RESULT[fault])] += 1
        for method, path, status in list(proxy.answers):  # forwarded and answered
            result = "ok" if status < 400 else "server" if status >= 500 else "client"
            seen[(s3_op(method, path), result)] += 1
        assert seen[("HeadObject", "client")] >= 4  # the absent keys' 404s
        got = counts.snapshot()
        assert sum(proxy.injected.values()) >= 5, proxy.injected  # the faults did happen
        assert {k for k, _ in got} >= {"CreateMultipartUpload", "UploadPart",
                                       "CompleteMultipartUpload", "PutObject", "GetObject",
                                       "HeadObject", "ListObjectsV2", "AbortMultipartUpload",
                                       "DeleteObject"}
        assert dict(got) == dict(seen)
        by_class = counts.by_class()
        assert by_class["put"] == sum(n for (op, _), n in seen.items()
                                      if price_class(op) == "put")

    async def test_a_request_cut_by_the_deadline_counts_as_a_timeout(
            self, s3_bucket: MotoBucket, proxy: FaultProxy) -> None:
        counts = RequestCounts("aws-s3")
        store = await S3BlobStore.open(
            s3_bucket.options(endpoint=proxy.url, request_timeout_s=0.5, max_attempts=1),
            requests=counts)
        try:
            await store.put("k", [b"v"], META)
            proxy.freeze("silent")
            with pytest.raises(OffloaddError):
                await store.get_range("k", 0, 1)
        finally:
            proxy.thaw()
            await store.close()
        assert counts.snapshot()[("GetObject", "timeout")] == 1
        assert counts.snapshot()[("PutObject", "ok")] == 1


class TestFilesystemRequestCounts:
    """The filesystem driver counts its operations under S3's names: one PutObject per put."""

    async def test_each_operation_once(self, tmp_path: Path) -> None:
        counts = RequestCounts("filesystem")
        store = FilesystemBlobStore(tmp_path / "tier", requests=counts)
        try:
            await workload(store, random.Random(3))
        finally:
            await store.close()
        got = counts.snapshot()
        assert got[("CreateMultipartUpload", "ok")] == 5
        assert got[("UploadPart", "ok")] == 13
        assert got[("CompleteMultipartUpload", "ok")] == 4
        assert got[("AbortMultipartUpload", "ok")] == 1
        assert got[("PutObject", "ok")] == 4
        assert got[("GetObject", "ok")] == 8
        assert got[("HeadObject", "ok")] == 4 and got[("HeadObject", "client")] == 4
        assert got[("ListObjectsV2", "ok")] == 1 and got[("DeleteObject", "ok")] == 2
        assert sum(got.values()) == 46
