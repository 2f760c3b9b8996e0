"""The S3 end-to-end tests run against both S3 servers we have: ``moto_server`` (an emulator)
and Ceph's RADOS Gateway (a production implementation, ``tests/fixtures/rgw.py``), one of each
for the whole session; each test gets a fresh bucket (:class:`~tests.fixtures.s3.MotoBucket`
works for either: same credentials, path-style addressing)."""

from __future__ import annotations

import itertools
import os

import pytest

from tests.fixtures.rgw import rgw_server
from tests.fixtures.s3 import MotoBucket, moto_server

__all__ = ["moto_server", "rgw_server", "s3_bucket", "s3_server"]

_bucket_ids = itertools.count()


@pytest.fixture(scope="session", params=["moto", "rgw"])
def s3_server(request: pytest.FixtureRequest) -> str:
    """The endpoint of one S3 server: every test that uses it runs once on each."""
    endpoint: str = request.getfixturevalue(f"{request.param}_server")
    return endpoint


@pytest.fixture
def s3_bucket(s3_server: str) -> MotoBucket:
    bucket = MotoBucket(s3_server, f"offloadd-e2e-{os.getpid()}-{next(_bucket_ids)}")
    bucket.boto3().create_bucket(Bucket=bucket.name)
    return bucket
