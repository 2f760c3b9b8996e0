"""What only the filesystem driver promises: its layout, key rules, sweeping, error mapping."""

from __future__ import annotations

import errno
import json
import os
import re
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from pathlib import Path

import pytest

from offloadd.blobstore.filesystem import FilesystemBlobStore
from offloadd.errors import Fatal, NotFound, Retriable

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[FilesystemBlobStore]:
    s = FilesystemBlobStore(tmp_path)
    yield s
    await s.close()


def uploads(root: Path) -> list[str]:
    d = root / ".uploads"
    return sorted(os.listdir(d)) if d.exists() else []


class TestLayout:
    """Objects are plain files of exactly their bytes, with a JSON metadata sidecar."""

    async def test_object_is_a_plain_file_with_a_sidecar(
        self, store: FilesystemBlobStore, tmp_path: Path
    ) -> None:
        await store.put("dir/obj", [b"abc", b"def"], {"role": "index"})
        assert (tmp_path / "dir" / "obj").read_bytes() == b"abcdef"
        sidecar = json.loads((tmp_path / ".meta" / "dir" / "obj.json").read_bytes())
        assert sidecar == {"metadata": {"role": "index"}}
        assert uploads(tmp_path) == []

    def test_driver_properties_carry_the_root_as_a_file_uri(self, tmp_path: Path) -> None:
        props = FilesystemBlobStore(tmp_path).driver_properties()
        assert props == {
            "managedLedgerOffloadDriver": "filesystem",
            "fileSystemURI": tmp_path.absolute().as_uri(),
        }

    async def test_a_file_placed_by_hand_is_an_object_without_metadata(
        self, store: FilesystemBlobStore, tmp_path: Path
    ) -> None:
        (tmp_path / "manual").write_bytes(b"12345")
        info = await store.head("manual")
        assert (info.size, dict(info.metadata)) == (5, {})

    async def test_a_prefix_directory_is_not_an_object(self, store: FilesystemBlobStore) -> None:
        await store.put("a/b", [b"x"], {})
        with pytest.raises(NotFound):
            await store.get_range("a", 0, 1)
        with pytest.raises(NotFound):
            await store.head("a")

    async def test_a_put_is_one_worker_thread_call(self, store: FilesystemBlobStore) -> None:
        """Opening, writing and completing a put go in one call (issue 22: a segment's data
        and index are a put each, and a worker-thread hop per step was most of a small
        segment's commit on the event loop)."""
        await store.put("warm", [b"x"], {})  # (the first call starts the health prober)
        calls: list[object] = []
        submit = store._workers.submit

        def counting(fn: Callable[..., object], /, *args: object) -> Future[object]:
            calls.append(fn)
            return submit(fn, *args)

        store._workers.submit = counting  # type: ignore[method-assign,assignment]
        info = await store.put("obj", [b"abc", b"def"], {"role": "data"})
        assert len(calls) == 1, calls
        assert (info.key, info.size) == ("obj", 6)
        assert store.requests.snapshot()[("PutObject", "ok")] == 2  # counted as before

    async def test_parts_of_many_small_buffers_and_short_writes_are_written_whole(
        self, store: FilesystemBlobStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        real_pwritev = os.pwritev

        def stingy_pwritev(fd: int, buffers: list[memoryview], offset: int) -> int:
            # The kernel may write less than asked; give at most 7 bytes per call.
            budget, taken = 7, []
            for b in buffers:
                if budget <= 0:
                    break
                taken.append(b[:budget])
                budget -= len(taken[-1])
            return real_pwritev(fd, taken, offset)

        buffers = [bytes([i % 256]) * (i % 5) for i in range(3000)]  # more than IOV_MAX
        await store.put("many", buffers, {})
        monkeypatch.setattr(os, "pwritev", stingy_pwritev)
        await store.put("stingy", [b"0123456789", b"abcdefghij", b"XYZ"], {})
        assert await store.get_range("many", 0, 10**6) == b"".join(buffers)
        assert await store.get_range("stingy", 0, 100) == b"0123456789abcdefghijXYZ"


class TestKeys:
    """Keys that could escape the root or hit the store's own folders are refused."""

    @pytest.mark.parametrize(
        "key",
        [
            "../escape",
            "/absolute",
            "a/../../b",
            "",
            "a//b",
            "./a",
            "dir/",
            ".uploads/x",
            ".meta/x.json",
        ],
    )
    async def test_bad_keys_are_fatal_and_named(
        self, store: FilesystemBlobStore, tmp_path: Path, key: str
    ) -> None:
        with pytest.raises(Fatal, match=re.escape(repr(key))):
            await store.put(key, [b"x"], {})
        with pytest.raises(Fatal):
            await store.get_range(key, 0, 1)
        assert not (tmp_path.parent / "escape").exists()

    async def test_a_key_cannot_be_both_object_and_prefix(self, store: FilesystemBlobStore) -> None:
        await store.put("a", [b"x"], {})
        with pytest.raises(Fatal):
            await store.put("a/b", [b"y"], {})
        assert await store.get_range("a", 0, 10) == b"x"


class TestUploadsFolder:
    """Uploads in progress live in .uploads/, which listings skip and sweeps clean."""

    async def test_abort_removes_the_temp_file(
        self, store: FilesystemBlobStore, tmp_path: Path
    ) -> None:
        upload = await store.start_upload("obj", {})
        await upload.put_part(1, 0, [b"partial"])
        assert len(uploads(tmp_path)) == 1
        await upload.abort()
        assert uploads(tmp_path) == []

    async def test_stale_leftovers_are_swept_but_live_uploads_are_not(
        self, store: FilesystemBlobStore, tmp_path: Path
    ) -> None:
        live = await store.start_upload("live", {})
        await live.put_part(1, 0, [b"live"])
        crashed = tmp_path / ".uploads" / "left-by-a-crash"
        crashed.write_bytes(b"half an object")
        recent = tmp_path / ".uploads" / "another-process-busy"
        recent.write_bytes(b"in progress")
        hour_ago = time.time() - 3600
        os.utime(crashed, (hour_ago, hour_ago))
        os.utime(live.temp_path, (hour_ago, hour_ago))  # live in this instance: kept anyway

        assert [i.key async for i in store.list()] == []
        assert await store.sweep_incomplete_uploads(older_than_s=600) == 1
        assert not crashed.exists()
        assert recent.exists()
        await live.complete()
        assert await store.get_range("live", 0, 10) == b"live"

    async def test_sweeping_a_store_never_written_finds_nothing(self, tmp_path: Path) -> None:
        assert await FilesystemBlobStore(tmp_path / "new").sweep_incomplete_uploads(0) == 0

    async def test_close_aborts_unfinished_uploads(self, tmp_path: Path) -> None:
        store = FilesystemBlobStore(tmp_path)
        upload = await store.start_upload("obj", {})
        await upload.put_part(1, 0, [b"x"])
        await store.close()
        assert uploads(tmp_path) == []


class TestErrors:
    """OSErrors become NotFound, Retriable or Fatal with a message saying what to do."""

    @pytest.mark.parametrize(
        ("code", "error", "words"),
        [
            (errno.ENOSPC, Retriable, "disk full"),
            (errno.EIO, Retriable, "I/O error"),
            (errno.EAGAIN, Retriable, "temporarily"),
            (errno.EACCES, Fatal, "permission denied"),
            (errno.EROFS, Fatal, "read-only"),
        ],
    )
    async def test_write_errors_are_translated(
        self,
        store: FilesystemBlobStore,
        monkeypatch: pytest.MonkeyPatch,
        code: int,
        error: type[Exception],
        words: str,
    ) -> None:
        upload = await store.start_upload("obj", {})

        def failing_pwritev(fd: int, buffers: list[memoryview], offset: int) -> int:
            raise OSError(code, os.strerror(code))

        monkeypatch.setattr(os, "pwritev", failing_pwritev)
        with pytest.raises(error, match=words) as caught:
            await upload.put_part(1, 0, [b"x"])
        assert "obj" in str(caught.value)
        await upload.abort()

    async def test_a_put_that_fails_leaves_no_temporary_file(
        self, store: FilesystemBlobStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        def failing_pwritev(fd: int, buffers: list[memoryview], offset: int) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(os, "pwritev", failing_pwritev)
        with pytest.raises(Retriable, match="disk full"):
            await store.put("obj", [b"x"], {})
        assert uploads(tmp_path) == []
        monkeypatch.undo()
        await store.put("obj", [b"y"], {})  # nothing of the failed one in the way
        assert (tmp_path / "obj").read_bytes() == b"y"

    async def test_a_full_volume_is_not_ready_until_an_object_is_written_whole(
        self, store: FilesystemBlobStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # an aborted upload frees room for a few parts of the next try: those parts must not
        # make the store ready again while the volume stays full (readiness flapped with them)
        real_pwritev = os.pwritev
        full = True

        def pwritev(fd: int, buffers: list[memoryview], offset: int) -> int:
            if full:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real_pwritev(fd, buffers, offset)

        monkeypatch.setattr(os, "pwritev", pwritev)
        upload = await store.start_upload("obj", {})
        with pytest.raises(Retriable, match="disk full"):
            await upload.put_part(1, 0, [b"x"])
        ok, why = store.health.readiness()
        assert not ok and "disk full" in why, why
        await upload.abort()

        full = False
        upload = await store.start_upload("obj", {})
        await upload.put_part(1, 0, [b"x"])
        assert not store.health.readiness()[0]  # a part written is not room for an object
        await upload.complete()
        assert store.health.readiness() == (True, "blob store circuit is healthy")

        full = True
        with pytest.raises(Retriable, match="disk full"):
            await store.put("other", [b"y"], {})
        assert not store.health.readiness()[0]
        full = False
        await store.put("other", [b"y"], {})
        assert store.health.readiness()[0]

    async def test_a_missing_root_reads_as_not_found(self, tmp_path: Path) -> None:
        store = FilesystemBlobStore(tmp_path / "nowhere")
        with pytest.raises(NotFound):
            await store.head("obj")
        assert [i async for i in store.list()] == []
