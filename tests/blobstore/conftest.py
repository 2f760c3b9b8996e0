"""Fixtures for the blob-store contract suite: one fresh, empty store per test per driver."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Protocol

import pytest

from offloadd.blobstore.base import BlobStore, UploadSweeper
from offloadd.blobstore.filesystem import FilesystemBlobStore
from offloadd.blobstore.memory import MemoryBlobStore
from offloadd.blobstore.s3 import S3BlobStore
from tests.fixtures.s3 import MotoBucket, moto_server, s3_bucket

__all__ = ["moto_server", "s3_bucket"]  # the S3 fixtures, visible to every test in this folder

# Opens an empty store for one test; may pull other fixtures through request.getfixturevalue (a
# server, say) and register clean-up with request.addfinalizer. The suite closes the store.
StoreFactory = Callable[[pytest.FixtureRequest, Path], Awaitable[BlobStore]]


async def _memory(request: pytest.FixtureRequest, tmp_path: Path) -> BlobStore:
    return MemoryBlobStore()


async def _filesystem(request: pytest.FixtureRequest, tmp_path: Path) -> BlobStore:
    return FilesystemBlobStore(tmp_path / "blobs")


async def _s3(request: pytest.FixtureRequest, tmp_path: Path) -> BlobStore:
    bucket: MotoBucket = request.getfixturevalue("s3_bucket")
    return await S3BlobStore.open(bucket.options(retry_base_s=0.01, retry_max_s=0.1))


# Register new drivers HERE: one pytest.param per driver, whose value is a StoreFactory. Mark ones
# that start real servers, e.g. for S3:
#     pytest.param(_s3, id="s3", marks=pytest.mark.integration)
# where _s3(request, tmp_path) gets the server with request.getfixturevalue(...), creates a bucket
# unique to the test and returns a driver on it.
IMPLEMENTATIONS = [
    pytest.param(_memory, id="memory"),
    pytest.param(_filesystem, id="filesystem"),
    pytest.param(_s3, id="s3", marks=pytest.mark.integration),
]


@pytest.fixture(params=IMPLEMENTATIONS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[BlobStore]:
    factory: StoreFactory = request.param
    opened = await factory(request, tmp_path)
    yield opened
    await opened.close()


# ---- optional capabilities ---------------------------------------------------------------------


class SweepingStore(BlobStore, UploadSweeper, Protocol):
    """A store whose incomplete uploads outlive the process that started them."""


# Opens two instances on one storage: one plays a process that crashed mid-upload, the other
# the gc pass that sweeps after it. The suite closes both.
PairFactory = Callable[[pytest.FixtureRequest, Path],
                       Awaitable[tuple[SweepingStore, SweepingStore]]]


async def _filesystem_pair(request: pytest.FixtureRequest,
                           tmp_path: Path) -> tuple[SweepingStore, SweepingStore]:
    return FilesystemBlobStore(tmp_path / "blobs"), FilesystemBlobStore(tmp_path / "blobs")


async def _s3_pair(request: pytest.FixtureRequest,
                   tmp_path: Path) -> tuple[SweepingStore, SweepingStore]:
    bucket: MotoBucket = request.getfixturevalue("s3_bucket")
    options = bucket.options(retry_base_s=0.01, retry_max_s=0.1)
    return await S3BlobStore.open(options), await S3BlobStore.open(options)


# Register HERE every driver that declares UploadSweeper.
SWEEPERS = [
    pytest.param(_filesystem_pair, id="filesystem"),
    pytest.param(_s3_pair, id="s3", marks=pytest.mark.integration),
]


@pytest.fixture(params=SWEEPERS)
async def sweeping_pair(request: pytest.FixtureRequest,
                        tmp_path: Path) -> AsyncIterator[tuple[SweepingStore, SweepingStore]]:
    factory: PairFactory = request.param
    crashed, survivor = await factory(request, tmp_path)
    yield crashed, survivor
    await crashed.close()
    await survivor.close()
