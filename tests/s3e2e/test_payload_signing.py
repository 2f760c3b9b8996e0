"""Bodies sent over HTTPS are not SHA-256 signed (the CRC32C header and TLS protect them; the hash
would cost about a second of CPU per GiB); over plain HTTP botocore signs them."""

from __future__ import annotations

import pytest

from offloadd.blobstore.s3 import S3BlobStore, S3MultipartUpload, S3Options
from offloadd.errors import Retriable


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("scheme", "unsigned"), [("https", True), ("http", False)])
async def test_upload_bodies_are_unsigned_only_over_https(scheme: str, unsigned: bool) -> None:
    # nothing listens on port 9: the request is built and signed, then refused
    store = await S3BlobStore.open(S3Options(
        bucket="signing", endpoint=f"{scheme}://127.0.0.1:9", access_key_id="a",
        secret_access_key="b", max_attempts=1, connect_timeout_s=1))
    seen: list[tuple[str, object]] = []

    def capture(request: object, **kwargs: object) -> None:
        headers = getattr(request, "headers", {})
        seen.append((str(kwargs.get("event_name")), headers.get("X-Amz-Content-SHA256")))

    events = store._calls.primary.client.meta.events
    events.register("before-send.s3.UploadPart", capture)
    events.register("before-send.s3.PutObject", capture)
    try:
        with pytest.raises(Retriable):
            await S3MultipartUpload(store._uploads, "k", "upload", {}).put_part(1, 0, [b"x" * 100])
        with pytest.raises(Retriable):
            await store.put("k-index", [b"y" * 100], {})
    finally:
        await store.close()
    assert len(seen) == 2
    for _, sha in seen:
        value = sha.decode() if isinstance(sha, bytes) else sha
        assert (value == "UNSIGNED-PAYLOAD") is unsigned, seen
