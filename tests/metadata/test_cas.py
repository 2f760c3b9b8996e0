"""The compare-and-set loop's creation of missing nodes (:mod:`offloadd.metadata.cas`): many
first records under one parent check that parent once (issue 22: at start-up every topic's
status record checked its namespace's directory, one or two round trips per topic)."""

from __future__ import annotations

import asyncio
import collections

from offloadd.metadata import cas
from offloadd.metadata.base import CheckOp, Versioned
from offloadd.metadata.memory import MemoryMetadataStore


class Counting(MemoryMetadataStore):
    """The memory store, counting ``exists`` and ``create`` calls per path."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: collections.Counter[str] = collections.Counter()

    async def exists(self, path: str) -> bool:
        self.calls[f"exists {path}"] += 1
        await asyncio.sleep(0)  # a round trip: let the other callers in meanwhile
        return await super().exists(path)

    async def get(self, path: str) -> Versioned:
        self.calls[f"get {path}"] += 1
        return await super().get(path)

    async def create(self, path: str, data: bytes, *, ephemeral: bool = False,
                     sequential: bool = False, make_parents: bool = True) -> str:
        self.calls[f"create {path}"] += 1
        await asyncio.sleep(0)
        return await super().create(path, data, ephemeral=ephemeral, sequential=sequential,
                                     make_parents=make_parents)


async def test_first_records_under_one_parent_check_it_once() -> None:
    store = Counting()
    await asyncio.gather(*(cas.update(store, f"/status/ns/t-{i}", lambda node: b"x",
                                      create=True) for i in range(50)))
    await cas.update(store, "/status/ns/late", lambda node: b"x", create=True)
    assert store.calls["exists /status/ns"] == 1
    assert store.calls["create /status/ns"] == 1
    for i in range(50):
        assert (await store.get(f"/status/ns/t-{i}")).data == b"x"


async def test_a_parent_deleted_since_is_made_again() -> None:
    """A write in a ``multi`` creates no parents: the create fails, the loop forgets the
    parent it knew and makes it again on its retry."""
    store = Counting()
    await store.create("/epoch", b"")
    guard = [CheckOp("/epoch", 0)]  # the write goes in a multi (as a fenced one does)
    await cas.update(store, "/status/ns/a", lambda node: b"x", create=True, guard=guard)
    await store.delete("/status/ns", recursive=True)
    await cas.update(store, "/status/ns/b", lambda node: b"y", create=True, guard=guard,
                     sleep=lambda s: asyncio.sleep(0))
    assert (await store.get("/status/ns/b")).data == b"y"
    assert store.calls["create /status/ns"] == 2


async def test_a_known_node_is_written_without_a_read_and_a_stale_one_is_read_again() -> None:
    """``known`` (a node only the caller writes, as it last wrote it): the first attempt goes
    without a read; if the node moved since, that attempt loses its race and the loop reads."""
    store = Counting()
    node = await cas.update(store, "/status/ns/a", lambda node: b"1", create=True)
    assert node is not None
    node = await cas.update(store, "/status/ns/a", lambda node: b"2", known=node)
    assert store.calls["get /status/ns/a"] == 1  # only the first update's
    assert node == await store.get("/status/ns/a")
    await store.set("/status/ns/a", b"someone else")
    seen: list[bytes | None] = []

    def edit(n: Versioned | None) -> bytes:
        seen.append(n.data if n is not None else None)
        return b"3"

    node = await cas.update(store, "/status/ns/a", edit, known=node,
                            sleep=lambda s: asyncio.sleep(0))
    assert seen == [b"2", b"someone else"]  # the stale node, then what was read
    assert node == await store.get("/status/ns/a")
    assert node.data == b"3"
