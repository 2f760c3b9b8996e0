"""The in-memory driver's fault hook, which unit tests elsewhere rely on."""

from __future__ import annotations

import asyncio

import pytest

from offloadd.blobstore.memory import MemoryBlobStore
from offloadd.errors import NotFound, Retriable

pytestmark = pytest.mark.timeout(10)


class TestFaultHook:
    """The hook sees every operation first and can fail it or hold it."""

    async def test_a_raising_hook_fails_only_the_chosen_operation(self) -> None:
        seen: list[tuple[str, str]] = []

        def fault(operation: str, key: str) -> None:
            seen.append((operation, key))
            if operation == "put_part":
                raise Retriable("injected")

        store = MemoryBlobStore(fault)
        upload = await store.start_upload("obj", {})
        with pytest.raises(Retriable, match="injected"):
            await upload.put_part(1, 0, [b"x"])
        store.fault = None
        await upload.put_part(1, 0, [b"x"])
        await upload.complete()
        assert seen == [("start_upload", "obj"), ("put_part", "obj")]
        assert await store.get_range("obj", 0, 1) == b"x"

    async def test_an_awaitable_hook_holds_the_operation(self) -> None:
        release = asyncio.Event()

        def fault(operation: str, key: str) -> asyncio.Future[bool] | None:
            return asyncio.ensure_future(release.wait()) if operation == "put" else None

        store = MemoryBlobStore(fault)
        put = asyncio.create_task(store.put("obj", [b"x"], {}))
        await asyncio.sleep(0)
        with pytest.raises(NotFound):
            await store.head("obj")
        release.set()
        await asyncio.wait_for(put, 5)
        assert (await store.head("obj")).size == 1


class TestGivenChecksums:
    """A CRC32C given with a part or a put is checked against the bytes, as S3 checks its
    ``x-amz-checksum-crc32c`` header: tests on this store check what the uploader derives."""

    async def test_a_matching_crc_is_accepted_and_a_wrong_one_refused(self) -> None:
        import crc32c

        from offloadd.errors import Fatal

        store = MemoryBlobStore()
        upload = await store.start_upload("obj", {})
        await upload.put_part(1, 0, [b"ab", b"cd"], crc32c=crc32c.crc32c(b"abcd"))
        with pytest.raises(Fatal, match="BadDigest"):
            await upload.put_part(2, 4, [b"ef"], crc32c=crc32c.crc32c(b"ef") ^ 1)
        await upload.put_part(2, 4, [b"ef"])  # none given: nothing to check
        await upload.complete()
        assert await store.get_range("obj", 0, 6) == b"abcdef"
        with pytest.raises(Fatal, match="BadDigest"):
            await store.put("one", [b"xyz"], {}, crc32c=crc32c.crc32c(b"xyZ"))
        with pytest.raises(NotFound):
            await store.head("one")
        await store.put("one", [b"xyz"], {}, crc32c=crc32c.crc32c(b"xyz"))
