"""The compare-and-set loop (:mod:`offloadd.metadata.cas`) at scale (issue 22): many first
records under one parent check that parent once (at start-up every topic's status record
checked its namespace's directory, one or two round trips per topic); a writer's copy of the
node (``Known``) saves the read before each write, and an out-of-date copy never wins."""

from __future__ import annotations

import asyncio
import collections

import pytest

from offloadd.errors import NotFound
from offloadd.metadata import cas
from offloadd.metadata.base import CheckOp, Versioned
from offloadd.metadata.memory import MemoryMetadataStore


class Counting(MemoryMetadataStore):
    """The memory store, counting ``exists`` and ``create`` calls per path."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: collections.Counter[str] = collections.Counter()

    async def get(self, path: str) -> Versioned:
        self.calls[f"get {path}"] += 1
        return await super().get(path)

    async def exists(self, path: str) -> bool:
        self.calls[f"exists {path}"] += 1
        await asyncio.sleep(0)  # a round trip: let the other callers in meanwhile
        return await super().exists(path)

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


def append(item: bytes) -> cas.Edit:
    """An edit adding ``item`` to a comma-separated list (refused when it is there already)."""
    def edit(node: Versioned | None) -> bytes | None:
        items = node.data.split(b",") if node is not None and node.data else []
        return None if item in items else b",".join([*items, item])
    return edit


async def test_a_known_node_is_written_without_reading_it() -> None:
    store = Counting()
    known = cas.Known()
    await cas.update(store, "/n", append(b"a"), create=True, known=known)  # absent: read
    await cas.update(store, "/n", append(b"b"), known=known)
    await cas.update(store, "/n", append(b"c"), guard=[CheckOp("/n", 1)], known=known)
    assert store.calls["get /n"] == 1
    node = await store.get("/n")
    assert (node.data, node.version) == (b"a,b,c", 2)
    assert known.node == node


async def test_a_known_absence_creates_without_reading() -> None:
    store = Counting()
    known = cas.Known()
    known.set(None)  # as a read that found nothing left it
    await cas.update(store, "/s/n", append(b"a"), create=True, known=known)
    assert store.calls["get /s/n"] == 0
    assert (await store.get("/s/n")).data == b"a"
    # not where absence is an error: that is read
    gone = cas.Known()
    gone.set(None)
    with pytest.raises(NotFound):
        await cas.update(store, "/other", append(b"a"), known=gone)
    assert store.calls["get /other"] == 1


async def test_an_out_of_date_copy_loses_and_the_edit_sees_the_node_as_it_is() -> None:
    """Another writer moved the node since the copy: the copy's write loses the race, the node
    is read, and what the other writer did is kept."""
    store = Counting()
    known = cas.Known()
    await cas.update(store, "/n", append(b"a"), create=True, known=known)
    await cas.update(store, "/n", append(b"x"))  # someone else
    await cas.update(store, "/n", append(b"b"), known=known, sleep=lambda s: asyncio.sleep(0))
    assert (await store.get("/n")).data == b"a,x,b"
    assert known.node == await store.get("/n")


async def test_a_copy_that_already_has_the_change_is_not_trusted() -> None:
    """The copy says "nothing to change", but the node lost the item since: it is read and
    written again (a no-op decided on a copy could drop the write)."""
    store = Counting()
    known = cas.Known()
    await cas.update(store, "/n", append(b"a"), create=True, known=known)
    await store.set("/n", b"", 0)  # someone else took it out
    got = await cas.update(store, "/n", append(b"a"), known=known)
    assert got is not None and got.data == b"a"
    assert (await store.get("/n")).data == b"a"


async def test_an_edit_refusing_an_out_of_date_copy_is_asked_again() -> None:
    """An edit that cannot apply to the copy (a record it needs is newer than the copy) is
    asked again of a fresh read rather than failing the caller."""
    store = Counting()
    known = cas.Known()
    await cas.update(store, "/n", append(b"a"), create=True, known=known)
    await cas.update(store, "/n", append(b"ledger-7"))  # someone else adds what we need

    def close_7(node: Versioned | None) -> bytes:
        assert node is not None
        if b"ledger-7" not in node.data.split(b","):
            raise ValueError("no ledger 7")
        return node.data.replace(b"ledger-7", b"ledger-7-closed")

    await cas.update(store, "/n", close_7, known=known)
    assert (await store.get("/n")).data == b"a,ledger-7-closed"
