"""The filesystem driver as a second fence: create-only writes publish with ``link(2)``, which
refuses an existing name (``blobstore/base.py``, ``docs/s3.md`` "Conditional writes"); and a
store that does not answer the start-up probe (S3 behind a fault proxy)."""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from offloadd import config, wiring
from offloadd.blobstore.filesystem import FilesystemBlobStore
from offloadd.errors import Conflict
from tests.fixtures.faultproxy import FaultProxy
from tests.fixtures.s3 import MotoBucket

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def fs(tmp_path: Path) -> AsyncIterator[FilesystemBlobStore]:
    store = FilesystemBlobStore(tmp_path / "tier")
    yield store
    await store.close()


def leftovers(store: FilesystemBlobStore) -> list[str]:
    uploads = store.root / ".uploads"
    return sorted(os.listdir(uploads)) if uploads.exists() else []


class TestFilesystemFence:
    """Once probed, an existing key is never replaced, neither its bytes nor its metadata."""

    async def test_the_probe_turns_create_only_writes_on_and_leaves_nothing(
            self, fs: FilesystemBlobStore) -> None:
        found = await fs.probe_conditional_writes()
        assert found.put and found.complete and "link(2)" in found.how
        assert [o.key async for o in fs.list()] == [] and leftovers(fs) == []

    async def test_a_second_writers_put_is_refused(self, fs: FilesystemBlobStore) -> None:
        await fs.probe_conditional_writes()
        await fs.put("k-index", [b"committed"], {"role": "index"})
        zombie = FilesystemBlobStore(fs.root)
        await zombie.probe_conditional_writes()
        try:
            with pytest.raises(Conflict, match="already exists"):
                await zombie.put("k-index", [b"zombie!!!"], {"role": "zombie"})
        finally:
            await zombie.close()
        assert await fs.get_range("k-index", 0, 100) == b"committed"
        assert (await fs.head("k-index")).metadata == {"role": "index"}
        assert leftovers(fs) == []

    async def test_a_multipart_complete_over_an_existing_object_is_refused(
            self, fs: FilesystemBlobStore) -> None:
        await fs.probe_conditional_writes()
        await fs.put("data", [b"committed data"], {"role": "data"})
        up = await fs.start_upload("data", {"role": "zombie"})
        await up.put_part(1, 0, [b"zombie"])
        with pytest.raises(Conflict):
            await up.complete()
        await up.abort()
        assert await fs.get_range("data", 0, 100) == b"committed data"
        assert (await fs.head("data")).metadata == {"role": "data"}
        assert leftovers(fs) == []

    async def test_data_without_its_sidecar_is_not_replaced_either(
            self, fs: FilesystemBlobStore) -> None:
        await fs.probe_conditional_writes()
        fs.root.mkdir(parents=True, exist_ok=True)
        (fs.root / "bare").write_bytes(b"put there by hand")
        with pytest.raises(Conflict):
            await fs.put("bare", [b"new"], {"role": "index"})
        assert (fs.root / "bare").read_bytes() == b"put there by hand"
        assert (await fs.head("bare")).metadata == {}  # our sidecar was taken back

    async def test_without_hard_links_the_probe_says_off_and_writes_overwrite(
            self, fs: FilesystemBlobStore, monkeypatch: pytest.MonkeyPatch) -> None:
        def no_links(src: object, dst: object) -> None:
            raise OSError(errno.EPERM, "Operation not permitted (no hard links here)")

        monkeypatch.setattr(os, "link", no_links)
        found = await fs.probe_conditional_writes()
        assert not found.on and found.how.startswith("off")
        await fs.put("k", [b"one"], {})
        await fs.put("k", [b"two"], {})  # as before the fence: the contract's overwrite
        assert await fs.get_range("k", 0, 10) == b"two"

    async def test_unprobed_writes_overwrite_as_the_contract_says(
            self, fs: FilesystemBlobStore) -> None:
        await fs.put("k", [b"one"], {})
        await fs.put("k", [b"two"], {})
        assert await fs.get_range("k", 0, 10) == b"two" and not fs.conditional.on


@pytest.mark.integration
async def test_a_store_unreachable_at_start_up_is_asked_again(
        s3_bucket: MotoBucket, moto_server: str) -> None:
    """An outage during the probe neither holds the start-up nor turns the fence off for good:
    the answer stays unknown (writes overwrite meanwhile) until a later probe gets one."""
    with FaultProxy(moto_server, seed=16) as proxy:
        settings = config.load(
            None, blobstore__driver="aws-s3", blobstore__endpoint=proxy.url,
            blobstore__bucket=s3_bucket.name, blobstore__access_key_id="testing",
            blobstore__secret_access_key="testing", blobstore__request_timeout_s=1.0,
            blobstore__max_attempts=2)
        proxy.set_outage(True)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        tier = await wiring.open_tier(settings, probe_writes=True)
        try:
            assert loop.time() - t0 < 4 * settings.blobstore.request_timeout_s + 5
            assert tier.fence is not None
            found = tier.fence.conditional
            assert not found.answered and not found.on
            proxy.set_outage(False)
            found = await tier.fence.probe_conditional_writes()
            assert found.answered and found.put and found.complete
        finally:
            await tier.store.close()
