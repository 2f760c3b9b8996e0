"""What each S3 server does with the three things Ceph's RADOS Gateway treats differently from S3
(``../shared/RGW.md``), pinned so that a server upgrade that changes them is noticed, beside why
offloadd does not depend on them (``docs/s3.md``, "Ceph RGW"):

* ``CompleteMultipartUpload`` with ``If-None-Match: *``: RGW completes over an existing object.
  offloadd never relies on it: every upload attempt gets a fresh key (a new uuid), and the
  catalog's compare-and-set decides which attempt counts.
* ``x-amz-checksum-crc32c``: offloadd sends it with every part and put; RGW neither checks nor
  keeps it (moto keeps it, unchecked). Every block carries its own CRC32C and every read checks
  it (``verify`` too), so the end-to-end suite stays green on RGW.
* SSE-S3 (``AES256``): RGW accepts the header and stores plaintext, and says nothing back. An
  operator who needs encryption at rest on RGW configures SSE-KMS or RGW's own encryption.
"""

from __future__ import annotations

import pytest

from offloadd.blobstore.s3 import S3BlobStore
from tests.fixtures.s3 import MotoBucket

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _is_rgw(bucket: MotoBucket) -> bool:
    server = bucket.boto3().list_buckets()["ResponseMetadata"]["HTTPHeaders"].get("server", "")
    return "moto" not in server.lower() and "werkzeug" not in server.lower()


def test_conditional_complete(s3_bucket: MotoBucket) -> None:
    s3 = s3_bucket.boto3()
    s3.put_object(Bucket=s3_bucket.name, Key="k", Body=b"first")
    up = s3.create_multipart_upload(Bucket=s3_bucket.name, Key="k")
    part = s3.upload_part(Bucket=s3_bucket.name, Key="k", UploadId=up["UploadId"],
                          PartNumber=1, Body=b"second")
    done = {"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]}
    try:
        s3.complete_multipart_upload(Bucket=s3_bucket.name, Key="k", UploadId=up["UploadId"],
                                     MultipartUpload=done, IfNoneMatch="*")
        refused = False
    except s3.exceptions.ClientError as exc:
        refused = exc.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    body = s3.get_object(Bucket=s3_bucket.name, Key="k")["Body"].read()
    if _is_rgw(s3_bucket):
        assert not refused and body == b"second"  # the condition is ignored
    else:
        assert body == (b"first" if refused else b"second")


async def test_crc32c_header(s3_bucket: MotoBucket) -> None:
    store = await S3BlobStore.open(s3_bucket.options())
    try:
        await store.put("obj", [b"hello, tier"], {"role": "index"})
        up = await store.start_upload("mp", {"role": "data"})
        await up.put_part(1, 0, [b"x" * 8])
        await up.put_part(2, 8, [b"y" * 3])
        await up.complete()
    finally:
        await store.close()
    s3 = s3_bucket.boto3()
    for key in ("obj", "mp"):
        head = s3.head_object(Bucket=s3_bucket.name, Key=key, ChecksumMode="ENABLED")
        assert s3.get_object(Bucket=s3_bucket.name, Key=key)["ContentLength"] > 0
        if _is_rgw(s3_bucket):
            assert "ChecksumCRC32C" not in head  # neither kept nor returned
    obj = s3.head_object(Bucket=s3_bucket.name, Key="obj", ChecksumMode="ENABLED")
    if not _is_rgw(s3_bucket):
        assert "ChecksumCRC32C" in obj  # moto keeps what offloadd sent


def test_sse_s3(s3_bucket: MotoBucket) -> None:
    s3 = s3_bucket.boto3()
    put = s3.put_object(Bucket=s3_bucket.name, Key="enc", Body=b"secret",
                        ServerSideEncryption="AES256")
    head = s3.head_object(Bucket=s3_bucket.name, Key="enc")
    if _is_rgw(s3_bucket):  # accepted, not applied, not mentioned
        assert "ServerSideEncryption" not in put and "ServerSideEncryption" not in head
    else:
        assert head.get("ServerSideEncryption") == "AES256"


async def test_a_wrong_crc32c_header_is_not_checked(s3_bucket: MotoBucket) -> None:
    """Neither moto nor RGW checks ``x-amz-checksum-crc32c`` against the bytes (AWS S3 refuses
    a part that does not match: ``BadDigest``), so no test here can see a refusal:
    ``test_part_checksums.py`` compares the header with the bytes sent instead. Pinned so that
    a server that starts checking is noticed (then a refusal test belongs here)."""
    store = await S3BlobStore.open(s3_bucket.options(max_attempts=1))
    try:
        up = await store.start_upload("mp", {})
        await up.put_part(1, 0, [b"x" * 8], crc32c=0x12345678)  # not the CRC32C of the bytes
        await up.complete()
    finally:
        await store.close()
    assert s3_bucket.boto3().get_object(Bucket=s3_bucket.name, Key="mp")["Body"].read() == \
        b"x" * 8
