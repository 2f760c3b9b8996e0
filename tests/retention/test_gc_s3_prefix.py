"""gc on an S3 tier with a key prefix: the driver applies the prefix, gc must not add it again."""

from __future__ import annotations

import time
import uuid

import pytest

from offloadd import config, wiring
from offloadd.blobstore.s3 import S3BlobStore
from offloadd.metadata.memory import MemoryMetadataStore
from offloadd.retention.gc import gc_pass
from tests.fixtures.s3 import MotoBucket

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def test_gc_sweeps_orphans_under_the_drivers_key_prefix(s3_bucket: MotoBucket) -> None:
    prefix = "tier/offloadd/"
    store = await S3BlobStore.open(s3_bucket.options(prefix=prefix, retry_base_s=0.01,
                                                     retry_max_s=0.1))
    try:
        orphan = f"{uuid.uuid4()}-index"
        await store.put(orphan, [b"x"], {})
        settings = config.load(None, blobstore__driver="aws-s3", blobstore__prefix=prefix,
                               blobstore__bucket=s3_bucket.name)
        await gc_pass(MemoryMetadataStore(), wiring.s3_view(store), None,
                      wiring.gc_settings(settings), now=time.time() + 10,
                      grace_s=0)
        keys = [o.key async for o in store.list("")]
        assert orphan not in keys
        listed = s3_bucket.boto3().list_objects_v2(Bucket=s3_bucket.name).get("Contents", [])
        assert listed == []  # nothing left under the prefix either
    finally:
        await store.close()
