"""The BlobStore contract, checked against every driver registered in ``conftest.py``, and each
optional capability (``offloadd.blobstore.base``) against every driver that declares it."""

from __future__ import annotations

import asyncio

import pytest

from offloadd.blobstore.base import (
    BlobStore,
    MultipartUpload,
    ObjectInfo,
    StoreHealthView,
    UploadSweeper,
)
from offloadd.blobstore.filesystem import FilesystemBlobStore, FilesystemUpload
from offloadd.blobstore.health import StoreHealth
from offloadd.blobstore.memory import MemoryBlobStore, MemoryUpload
from offloadd.blobstore.s3 import S3BlobStore, S3MultipartUpload
from offloadd.errors import Fatal, NotFound
from tests.blobstore.conftest import SweepingStore

pytestmark = pytest.mark.timeout(30)

METADATA = {
    "s3managedledgeroffloaderformatversion": "1",
    "role": "data",
    "managedledgername": "tenant/ns/persistent/topic",
}


def pattern(size: int, seed: int = 0) -> bytes:
    return bytes((i * 31 + seed) % 251 for i in range(size))


async def keys(store: BlobStore, prefix: str = "") -> list[str]:
    return [info.key async for info in store.list(prefix)]


async def assert_absent(store: BlobStore, key: str) -> None:
    with pytest.raises(NotFound):
        await store.head(key)
    with pytest.raises(NotFound):
        await store.get_range(key, 0, 1)
    assert key not in await keys(store)


class TestMultipartUpload:
    """Parts arrive in any order, as several buffers each; the object appears on complete()."""

    async def test_out_of_order_parts_assemble_in_number_order(self, store: BlobStore) -> None:
        body = pattern(3000)
        upload = await store.start_upload("obj", METADATA)
        assert isinstance(upload, MultipartUpload)
        # Part 2 is given as three buffers of different kinds, which the driver must not need
        # joined.
        view = memoryview(bytearray(body[1000:2000]))
        await asyncio.gather(
            upload.put_part(3, 2000, [body[2000:]]),
            upload.put_part(1, 0, [body[:1000]]),
            upload.put_part(2, 1000, [view[:10], bytes(view[10:500]), bytearray(view[500:])]),
        )
        info = await upload.complete()
        assert (info.key, info.size) == ("obj", 3000)
        assert await store.get_range("obj", 0, 3000) == body
        assert (await store.head("obj")).metadata == METADATA

    async def test_object_is_absent_until_complete(self, store: BlobStore) -> None:
        upload = await store.start_upload("obj", METADATA)
        await upload.put_part(1, 0, [b"first half "])
        await assert_absent(store, "obj")
        await upload.put_part(2, 11, [b"second half"])
        await assert_absent(store, "obj")
        await upload.complete()
        assert await store.get_range("obj", 0, 100) == b"first half second half"

    async def test_aborted_upload_leaves_nothing_visible(self, store: BlobStore) -> None:
        upload = await store.start_upload("obj", METADATA)
        await upload.put_part(1, 0, [b"doomed"])
        await upload.abort()
        await assert_absent(store, "obj")
        assert await keys(store) == []

    async def test_a_resent_part_replaces_the_first_attempt(self, store: BlobStore) -> None:
        upload = await store.start_upload("obj", {})
        await upload.put_part(1, 0, [b"a much longer first attempt"])
        await upload.put_part(1, 0, [b"short"])
        await upload.put_part(2, 5, [b"!"])
        assert (await upload.complete()).size == 6
        assert await store.get_range("obj", 0, 100) == b"short!"

    @pytest.mark.parametrize(
        ("parts", "why"),
        [
            ([], "no parts"),
            ([(1, 0, b"abc"), (3, 3, b"def")], "part numbers skip 2"),
            ([(1, 0, b"abc"), (2, 4, b"def")], "a hole at byte 3"),
            ([(1, 0, b"abc"), (2, 2, b"def")], "parts overlap"),
            ([(1, 1, b"abc")], "the first part does not start at 0"),
        ],
    )
    async def test_completing_parts_that_do_not_tile_the_object_is_fatal(
        self, store: BlobStore, parts: list[tuple[int, int, bytes]], why: str
    ) -> None:
        upload = await store.start_upload("obj", {})
        for number, offset, data in parts:
            await upload.put_part(number, offset, [data])
        with pytest.raises(Fatal):
            await upload.complete()
        await upload.abort()
        await assert_absent(store, "obj")

    async def test_abort_after_complete_keeps_the_object(self, store: BlobStore) -> None:
        upload = await store.start_upload("obj", {})
        await upload.put_part(1, 0, [b"kept"])
        await upload.complete()
        await upload.abort()
        assert await store.get_range("obj", 0, 4) == b"kept"


class TestPutAndRead:
    """put stores bytes and metadata; ranges are exact except at the object's end."""

    async def test_put_stores_bytes_and_metadata(self, store: BlobStore) -> None:
        info = await store.put("idx", [b"index ", bytearray(b"bytes")], METADATA)
        assert (info.key, info.size) == ("idx", 11)
        head = await store.head("idx")
        assert (head.key, head.size, dict(head.metadata)) == ("idx", 11, METADATA)
        assert head.mtime > 0

    async def test_put_overwrites_an_existing_object(self, store: BlobStore) -> None:
        await store.put("k", [b"old old old"], {"role": "data"})
        await store.put("k", [b"new"], {"role": "index"})
        assert await store.get_range("k", 0, 100) == b"new"
        assert (await store.head("k")).metadata == {"role": "index"}

    async def test_an_empty_object_can_be_put(self, store: BlobStore) -> None:
        await store.put("empty", [b""], {})
        assert (await store.head("empty")).size == 0
        assert await store.get_range("empty", 0, 10) == b""

    @pytest.mark.parametrize(
        ("start", "end", "expected"),
        [
            (0, 1000, slice(0, 1000)),
            (100, 200, slice(100, 200)),
            (990, 1000, slice(990, 1000)),
            (990, 2000, slice(990, 1000)),  # short: the object ends at 1000
            (1000, 1010, slice(1000, 1000)),  # starts at the end: empty
            (5, 5, slice(5, 5)),
        ],
    )
    async def test_ranges_are_exact_and_short_only_at_the_end(
        self, store: BlobStore, start: int, end: int, expected: slice
    ) -> None:
        body = pattern(1000, seed=7)
        await store.put("obj", [body], {})
        assert await store.get_range("obj", start, end) == body[expected]

    async def test_missing_keys_are_not_found(self, store: BlobStore) -> None:
        await assert_absent(store, "missing")


class TestListAndDelete:
    """list filters by prefix in key order; delete is idempotent."""

    async def test_list_returns_matching_keys_in_order_with_sizes(self, store: BlobStore) -> None:
        for key, size in [("b-index", 3), ("a", 1), ("b", 2), ("ba", 4), ("c/d", 5)]:
            await store.put(key, [pattern(size)], {})
        infos = [i async for i in store.list()]
        assert all(isinstance(i, ObjectInfo) for i in infos)
        assert [(i.key, i.size) for i in infos] == [
            ("a", 1),
            ("b", 2),
            ("b-index", 3),
            ("ba", 4),
            ("c/d", 5),
        ]
        assert await keys(store, "b") == ["b", "b-index", "ba"]
        assert await keys(store, "c/") == ["c/d"]
        assert await keys(store, "zzz") == []

    async def test_delete_removes_the_object_and_is_idempotent(self, store: BlobStore) -> None:
        await store.put("gone", [b"x"], METADATA)
        await store.put("stays", [b"y"], {})
        await store.delete("gone")
        await store.delete("gone")
        await store.delete("never-existed")
        await assert_absent(store, "gone")
        assert await keys(store) == ["stays"]

    async def test_driver_properties_name_the_driver(self, store: BlobStore) -> None:
        props = store.driver_properties()
        assert props["managedLedgerOffloadDriver"] == store.name
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in props.items())


# ---- optional capabilities --------------------------------------------------------------------


@pytest.mark.parametrize(("implementation", "declared"), [
    (S3BlobStore, {BlobStore, UploadSweeper}),
    (FilesystemBlobStore, {BlobStore, UploadSweeper}),
    (MemoryBlobStore, {BlobStore}),
    (S3MultipartUpload, {MultipartUpload}),
    (FilesystemUpload, {MultipartUpload}),
    (MemoryUpload, {MultipartUpload}),
    (StoreHealth, {StoreHealthView}),
])
def test_each_implementation_declares_what_it_offers(
        implementation: type, declared: set[type]) -> None:
    """Protocols and capabilities are in each class's bases (mypy holds the class to them, and
    the wiring hands them out typed); none is declared that is not offered."""
    protocols = {BlobStore, MultipartUpload, UploadSweeper, StoreHealthView}
    assert protocols & set(implementation.__mro__) == declared


class TestUploadSweeper:
    """gc's sweep discards what a crashed process left mid-upload, and nothing else."""

    async def test_an_abandoned_upload_is_discarded_once_old_enough(
            self, sweeping_pair: tuple[SweepingStore, SweepingStore]) -> None:
        crashed, survivor = sweeping_pair
        abandoned = await crashed.start_upload("dead", METADATA)
        await abandoned.put_part(1, 0, [pattern(100)])
        await survivor.put("kept", [b"committed"], METADATA)
        assert await survivor.sweep_incomplete_uploads(older_than_s=3600) == 0  # too young
        assert await survivor.sweep_incomplete_uploads(older_than_s=-60) == 1
        assert await survivor.sweep_incomplete_uploads(older_than_s=-60) == 0
        await assert_absent(survivor, "dead")
        assert await survivor.get_range("kept", 0, 100) == b"committed"
        assert await keys(survivor) == ["kept"]
