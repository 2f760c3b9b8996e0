"""``offloadd.aio``: the small asyncio helpers, under the cancellations the daemon delivers."""

from __future__ import annotations

import asyncio
import errno
import gc
import threading
from pathlib import Path

import pytest

from offloadd.aio import retrieved, to_the_end
from offloadd.blobstore.filesystem import FilesystemBlobStore
from offloadd.errors import Retriable
from offloadd.metadata import cas
from offloadd.metadata.memory import MemoryMetadataStore

pytestmark = pytest.mark.timeout(10)


async def test_a_clean_up_survives_repeated_cancellation_and_passes_it_on() -> None:
    steps: list[int] = []
    started = asyncio.Event()

    async def clean_up() -> None:
        started.set()
        for i in range(5):
            await asyncio.sleep(0.01)
            steps.append(i)

    task = asyncio.create_task(to_the_end(clean_up()))
    await started.wait()
    task.cancel()  # ownership lost
    await asyncio.sleep(0.015)
    task.cancel()  # then shutdown
    with pytest.raises(asyncio.CancelledError):
        await task
    assert steps == [0, 1, 2, 3, 4]


async def test_without_cancellation_it_returns_and_errors_propagate() -> None:
    async def fine() -> None:
        await asyncio.sleep(0)

    async def broken() -> None:
        await asyncio.sleep(0)
        raise RuntimeError("delete failed")

    await to_the_end(fine())
    with pytest.raises(RuntimeError, match="delete failed"):
        await to_the_end(broken())


async def test_an_error_after_a_cancellation_still_surfaces() -> None:
    async def broken() -> None:
        await asyncio.sleep(0.02)
        raise RuntimeError("delete failed")

    task = asyncio.create_task(to_the_end(broken()))
    await asyncio.sleep(0.005)
    task.cancel()
    with pytest.raises(RuntimeError, match="delete failed"):
        await task


# ---- "Future exception was never retrieved" (a Python 3.11 asyncio.shield quirk) ----------
class Unretrieved:
    """The loop's exception handler, catching what asyncio reports of unretrieved failures."""

    def __init__(self) -> None:
        self.reports: list[str] = []
        loop = asyncio.get_running_loop()
        self._old = loop.get_exception_handler()
        loop.set_exception_handler(lambda _loop, ctx: self.reports.append(ctx["message"]))

    def close(self) -> None:
        asyncio.get_running_loop().set_exception_handler(self._old)


async def _collected() -> None:
    for _ in range(3):
        await asyncio.sleep(0.01)
        gc.collect()


async def test_a_shielded_future_that_fails_after_its_awaiter_left_is_not_reported() -> None:
    caught = Unretrieved()
    try:
        inner: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiter = asyncio.ensure_future(asyncio.shield(retrieved(inner)))
        await asyncio.sleep(0)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        inner.set_exception(OSError("late"))
        del inner, waiter
        await _collected()
        assert caught.reports == []
    finally:
        caught.close()


async def test_a_filesystem_call_cancelled_before_its_disk_call_fails_is_not_reported(
        tmp_path: Path) -> None:
    """A stop cancels topics with disk calls in flight: those that fail afterwards were
    reported as "Future exception was never retrieved" (blobstore/filesystem/store.py)."""
    store = FilesystemBlobStore(tmp_path / "tier")
    release = threading.Event()

    def blocked() -> None:
        release.wait(5)
        raise OSError(errno.EIO, "late failure")

    caught = Unretrieved()
    try:
        call = asyncio.ensure_future(store.call("head", "k", blocked))
        await asyncio.sleep(0.05)
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        release.set()
        await asyncio.sleep(0.2)  # the worker's failure reaches the (shielded) future
        # the worker thread lets go of the failed call when it takes the next one
        await store.call("head", "k", lambda: None)
        del call
        await _collected()
        assert not [r for r in caught.reports if "never retrieved" in r], caught.reports
    finally:
        caught.close()
        await store.close()


async def test_a_parent_check_cancelled_before_it_fails_is_not_reported() -> None:
    """metadata/cas.py shares one parent check among its callers the same way; a create that
    finds the parent gone forgets the check (``_forget_parent``) without looking at it."""
    gate = asyncio.Event()

    class Failing(MemoryMetadataStore):
        async def exists(self, path: str) -> bool:
            await gate.wait()
            raise Retriable("no answer")

    caught = Unretrieved()
    try:
        store = Failing()
        write = asyncio.ensure_future(cas.update(store, "/a/b/c", lambda _old: b"x",
                                                 create=True))
        await asyncio.sleep(0.01)
        write.cancel()
        await asyncio.gather(write, return_exceptions=True)
        gate.set()
        await asyncio.sleep(0.01)
        assert cas._parents[store]  # the check was shared, and failed
        cas._forget_parent(store, "/a/b/c")
        del store, write
        await _collected()
        assert not [r for r in caught.reports if "never retrieved" in r], caught.reports
    finally:
        caught.close()
