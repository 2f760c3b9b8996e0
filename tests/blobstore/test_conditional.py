"""The filesystem driver as a second fence: create-only writes publish with ``link(2)``, which
refuses an existing name (``blobstore/base.py``, ``docs/s3.md`` "Conditional writes")."""

from __future__ import annotations

import errno
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from offloadd.blobstore.filesystem import FilesystemBlobStore
from offloadd.errors import Conflict

pytestmark = pytest.mark.timeout(30)


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
