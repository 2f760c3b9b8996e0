"""The store as a second fence on real S3 servers (moto and Ceph RGW, ``s3_server``): the
start-up probe finds what each server refuses, and a second writer's index PUT to an existing key
is refused by the server itself (``docs/s3.md``, "Conditional writes").

What the servers do (pinned here; ``test_server_quirks.py`` pins the raw calls): moto 5.2 honours
``If-None-Match: *`` on PutObject and CompleteMultipartUpload; RGW 16.2 on PutObject only (its
CompleteMultipartUpload completes over an existing object), so there the data object's complete
stays unconditional and the index PUT, the commit marker, is the fenced write.
"""

from __future__ import annotations

import uuid

import pytest

from offloadd.blobstore.s3 import S3BlobStore
from offloadd.errors import Conflict, Fenced
from offloadd.model import EntryRun
from offloadd.model.keys import streaming_data_key, streaming_index_key
from offloadd.offload.attempt import Uploads, open_streaming
from offloadd.offload.parts import DEFAULT_PART_SIZE
from offloadd.offload.runs import Run
from tests.fixtures.s3 import MotoBucket
from tests.s3e2e.test_server_quirks import _is_rgw

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def writer(bucket: MotoBucket) -> S3BlobStore:
    store = await S3BlobStore.open(bucket.options(retry_base_s=0.01, retry_max_s=0.1))
    await store.probe_conditional_writes()
    return store


async def test_the_probe_finds_what_the_server_refuses(s3_bucket: MotoBucket) -> None:
    store = await writer(s3_bucket)
    try:
        found = store.conditional
        assert found.put and found.on
        assert found.complete is (not _is_rgw(s3_bucket)), found.how
        assert "If-None-Match" in found.how
        # the probe's key is gone again, and it was never a key of ours
        assert [o.key async for o in store.list()] == []
    finally:
        await store.close()


async def test_a_second_writers_index_put_is_refused_by_the_server(
        s3_bucket: MotoBucket) -> None:
    first, zombie = await writer(s3_bucket), await writer(s3_bucket)
    key = streaming_index_key(uuid.uuid4())
    try:
        await first.put(key, [b"committed index"], {"role": "index"})
        with pytest.raises(Conflict, match="already exists"):
            await zombie.put(key, [b"zombie index"], {"role": "index", "x": "zombie"})
        assert await first.get_range(key, 0, 100) == b"committed index"
        assert (await first.head(key)).metadata == {"role": "index"}
    finally:
        await first.close()
        await zombie.close()


@pytest.mark.parametrize("part_size", [64, DEFAULT_PART_SIZE], ids=["multipart", "one-put"])
async def test_a_zombie_attempt_stops_fenced_and_touches_nothing(s3_bucket: MotoBucket,
                                                                 part_size: int) -> None:
    """Two attempts at the same segment uuid (a zombie that missed the catalog's fence): the
    later one's seal is refused (Fenced: stop, no retry), the committed pair stays as it was.
    A data object of more than one part is a multipart upload; one within a part, a PUT."""
    first, zombie = await writer(s3_bucket), await writer(s3_bucket)
    uid = uuid.uuid4()
    ml = "public/default/persistent/fenced"

    def run(byte: bytes) -> Run:
        payload = byte * 100
        data = memoryview(len(payload).to_bytes(4, "big") + (0).to_bytes(8, "big") + payload)
        return Run(EntryRun(7, 0, data, [0, len(data)]), lambda: None)

    try:
        att = await open_streaming(Uploads(first, ml, 2, part_size=part_size),
                                   max_block_size=4096, uid=uid)
        att.feed(run(b"a"), 1)
        await att.seal()
        data = await first.get_range(streaming_data_key(uid), 0, 1 << 20)
        index = await first.get_range(streaming_index_key(uid), 0, 1 << 20)
        index_meta = (await first.head(streaming_index_key(uid))).metadata
        late = await open_streaming(Uploads(zombie, ml, 2, part_size=part_size),
                                    max_block_size=4096, uid=uid)
        late.feed(run(b"z"), 1)
        with pytest.raises(Fenced, match="another writer"):
            await late.seal()
        # the commit marker is the committed one, on both servers
        assert await first.get_range(streaming_index_key(uid), 0, 1 << 20) == index
        assert (await first.head(streaming_index_key(uid))).metadata == index_meta
        after = await first.get_range(streaming_data_key(uid), 0, 1 << 20)
        if _is_rgw(s3_bucket) and part_size < DEFAULT_PART_SIZE:
            # RGW completes over the data object (the condition is ignored there): the
            # zombie's bytes replaced it, and the index's block checksums now refuse it on read
            assert after != data
        else:
            assert after == data  # refused: moto's complete, and every server's PUT
    finally:
        await first.close()
        await zombie.close()
