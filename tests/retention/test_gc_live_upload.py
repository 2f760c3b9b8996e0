"""The S3 test server tells the truth about upload times, so gc's upload sweep is tested for real.

Plain moto 5.2.5 dates every multipart upload 2010-11-10: a gc pass with any grace then aborts
every upload in flight, including the daemon's own live ones, and tests of the sweep pass for
the wrong reason. The fixture starts moto through ``tests/fixtures/moto_clock.py``.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from offloadd import config, wiring
from offloadd.blobstore.s3 import S3BlobStore
from offloadd.metadata.memory import MemoryMetadataStore
from offloadd.retention.gc import gc_pass
from tests.fixtures.s3 import MotoBucket

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_the_fixture_reports_when_an_upload_really_started(s3_bucket: MotoBucket) -> None:
    client = s3_bucket.boto3()
    before = datetime.now(UTC)
    client.create_multipart_upload(Bucket=s3_bucket.name, Key="k")
    after = datetime.now(UTC)
    (upload,) = client.list_multipart_uploads(Bucket=s3_bucket.name)["Uploads"]
    # moto's XML carries whole seconds: allow that truncation, nothing more
    assert before.replace(microsecond=0) <= upload["Initiated"]
    assert upload["Initiated"] <= after


async def test_gc_leaves_a_live_upload_alone_and_sweeps_it_once_stale(
        s3_bucket: MotoBucket) -> None:
    store = await S3BlobStore.open(s3_bucket.options(retry_base_s=0.01, retry_max_s=0.1))
    try:
        upload = await store.start_upload("live-segment", {})
        await upload.put_part(1, 0, [b"first part of a segment still being written"])
        settings = config.load(None, blobstore__driver="aws-s3", blobstore__bucket=s3_bucket.name)
        assert settings.retention.orphan_grace_s == 3600
        report = await gc_pass(MemoryMetadataStore(), wiring.s3_view(store), None,
                               wiring.gc_settings(settings), now=time.time())
        assert report.uploads_swept == 0, report
        left = [u.key async for u in store.list_incomplete_uploads()]
        assert left == ["live-segment"]
        # the same upload, seen an hour and a minute later, is stale: the sweep does work
        aborted = await store.sweep_incomplete_uploads(older_than_s=-3660)
        assert aborted == 1
        assert [u async for u in store.list_incomplete_uploads()] == []
    finally:
        await store.close()
