"""The embedded store's reads asked for together go to its worker thread together: each caller
still gets its own node, its own ``NotFound``, and a cancelled caller takes no one else's."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from offloadd.errors import NotFound
from offloadd.metadata.embedded import EmbeddedMetadataStore

pytestmark = pytest.mark.timeout(60)


async def test_reads_asked_together_each_get_their_own_answer(tmp_path: Path) -> None:
    store = await EmbeddedMetadataStore.open(tmp_path)
    try:
        for i in range(0, 300, 2):  # every other node exists
            await store.create(f"/n/{i}", f"v{i}".encode(), make_parents=True)
        await store.set("/n/4", b"again", 0)

        async def one(i: int) -> bytes | None:
            try:
                return (await store.get(f"/n/{i}")).data
            except NotFound:
                return None

        slow = asyncio.ensure_future(store.get("/n/0"))
        got = await asyncio.gather(*(one(i) for i in range(300)))
        assert got == [None if i % 2 else (b"again" if i == 4 else f"v{i}".encode())
                       for i in range(300)]
        assert (await slow).data == b"v0"
        assert (await store.get("/n/4")).version == 1

        # a caller cancelled while its read waits: the others of its batch are answered
        doomed = asyncio.ensure_future(store.get("/n/2"))
        kept = asyncio.ensure_future(store.get("/n/6"))
        await asyncio.sleep(0)
        doomed.cancel()
        assert (await kept).data == b"v6"
        with pytest.raises(asyncio.CancelledError):
            await doomed
    finally:
        await store.close()


async def test_reads_of_a_closed_store_fail_each(tmp_path: Path) -> None:
    store = await EmbeddedMetadataStore.open(tmp_path)
    await store.create("/x", b"1")
    await store.close()
    results = await asyncio.gather(store.get("/x"), store.get("/y"), return_exceptions=True)
    assert all(isinstance(r, Exception) and not isinstance(r, NotFound) for r in results)
