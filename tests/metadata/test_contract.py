"""The MetadataStore contract: ZooKeeper's semantics, checked against every implementation, and
each optional capability (``offloadd.metadata.base``) against every implementation declaring it.

Implementations are registered in ``conftest.py``; each test gets a fresh, empty store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from offloadd.errors import Conflict, Fatal, NotFound
from offloadd.metadata.base import (
    CheckOp,
    CreateOp,
    DeleteOp,
    MetadataStore,
    Sessions,
    SetOp,
    Versioned,
)
from offloadd.metadata.embedded import EmbeddedMetadataStore
from offloadd.metadata.memory import MemoryMetadataStore
from offloadd.metadata.readonly import ReadOnlyMetadataStore
from offloadd.metadata.zookeeper import ZooKeeperMetadataStore
from tests.metadata.conftest import Opener, SessionStore

pytestmark = pytest.mark.timeout(30)


class TestCreateAndGet:
    """Nodes are created once, start at version 0 and read back byte for byte."""

    async def test_created_node_reads_back_at_version_zero(self, store: MetadataStore) -> None:
        data = bytes(range(256)) * 400
        assert await store.create("/a", data) == "/a"
        assert await store.get("/a") == Versioned(data, 0)
        assert await store.exists("/a")

    async def test_creating_an_existing_node_conflicts(self, store: MetadataStore) -> None:
        await store.create("/a", b"1")
        with pytest.raises(Conflict):
            await store.create("/a", b"2")
        assert (await store.get("/a")).data == b"1"

    async def test_missing_parents_are_created_empty(self, store: MetadataStore) -> None:
        await store.create("/x/y/z", b"leaf")
        assert await store.get("/x") == Versioned(b"", 0)
        assert await store.get("/x/y") == Versioned(b"", 0)

    async def test_without_make_parents_a_missing_parent_is_not_found(
            self, store: MetadataStore) -> None:
        with pytest.raises(NotFound):
            await store.create("/x/y", b"", make_parents=False)
        assert not await store.exists("/x")

    async def test_missing_node_is_not_found(self, store: MetadataStore) -> None:
        assert not await store.exists("/nope")
        with pytest.raises(NotFound):
            await store.get("/nope")

    async def test_relative_path_is_refused(self, store: MetadataStore) -> None:
        with pytest.raises(Fatal):
            await store.create("relative", b"")


class TestCompareAndSet:
    """set/delete with a version succeed only at that version; -1 means any."""

    async def test_set_bumps_the_version(self, store: MetadataStore) -> None:
        await store.create("/a", b"0")
        assert await store.set("/a", b"1", 0) == 1
        assert await store.set("/a", b"2") == 2
        assert await store.get("/a") == Versioned(b"2", 2)

    async def test_set_at_a_stale_version_conflicts_and_changes_nothing(
            self, store: MetadataStore) -> None:
        await store.create("/a", b"0")
        await store.set("/a", b"1", 0)
        with pytest.raises(Conflict):
            await store.set("/a", b"lost", 0)
        assert await store.get("/a") == Versioned(b"1", 1)

    async def test_set_and_delete_of_missing_node_are_not_found(
            self, store: MetadataStore) -> None:
        with pytest.raises(NotFound):
            await store.set("/nope", b"")
        with pytest.raises(NotFound):
            await store.delete("/nope")

    async def test_delete_at_a_stale_version_conflicts(self, store: MetadataStore) -> None:
        await store.create("/a", b"")
        await store.set("/a", b"x")
        with pytest.raises(Conflict):
            await store.delete("/a", 0)
        await store.delete("/a", 1)
        assert not await store.exists("/a")

    async def test_concurrent_increments_from_two_sessions_lose_nothing(
            self, open_session: Opener) -> None:
        first, second = await open_session(), await open_session()
        await first.create("/counter", b"0")

        async def increment(s: MetadataStore, times: int) -> None:
            for _ in range(times):
                while True:
                    current = await s.get("/counter")
                    try:
                        await s.set("/counter", str(int(current.data) + 1).encode(),
                                    current.version)
                        break
                    except Conflict:
                        continue

        await asyncio.gather(increment(first, 25), increment(second, 25))
        assert await first.get("/counter") == Versioned(b"50", 50)


class TestChildrenAndDelete:
    """children lists direct children by name; deleting a parent needs recursive=True."""

    async def test_children_are_sorted_names_of_direct_children(
            self, store: MetadataStore) -> None:
        for name in ["b", "a", "c"]:
            await store.create(f"/p/{name}", b"")
        await store.create("/p/a/deeper", b"")
        assert await store.children("/p") == ["a", "b", "c"]
        assert await store.children("/p/b") == []
        assert await store.children("/") == ["p"]

    async def test_children_of_missing_node_is_not_found(self, store: MetadataStore) -> None:
        with pytest.raises(NotFound):
            await store.children("/nope")

    async def test_deleting_a_node_with_children_conflicts(self, store: MetadataStore) -> None:
        await store.create("/p/c", b"")
        with pytest.raises(Conflict):
            await store.delete("/p")
        assert await store.exists("/p/c")

    async def test_recursive_delete_removes_the_subtree_only(self, store: MetadataStore) -> None:
        for path in ["/p/a/b", "/p/c", "/pq", "/p-"]:
            await store.create(path, b"")
        await store.delete("/p", recursive=True)
        for gone in ["/p", "/p/a", "/p/a/b", "/p/c"]:
            assert not await store.exists(gone)
        assert await store.children("/") == ["p-", "pq"]


class TestMulti:
    """multi applies every op or none; later ops see earlier ones."""

    async def test_all_ops_apply_and_report_their_results(self, store: MetadataStore) -> None:
        await store.create("/a", b"")
        await store.create("/gone", b"")
        results = await store.multi([
            CheckOp("/a", 0),
            CreateOp("/b", b"new"),
            SetOp("/b", b"newer", 0),
            SetOp("/a", b"x", -1),
            DeleteOp("/gone", 0),
        ])
        assert results == [None, "/b", 1, 1, None]
        assert await store.get("/b") == Versioned(b"newer", 1)
        assert not await store.exists("/gone")

    async def test_a_failing_check_leaves_nothing_applied(self, store: MetadataStore) -> None:
        await store.create("/a", b"a")
        await store.create("/victim", b"")
        await store.create("/guard", b"")
        await store.set("/guard", b"moved on")
        with pytest.raises(Conflict):
            await store.multi([
                SetOp("/a", b"changed"),
                CreateOp("/b", b""),
                DeleteOp("/victim"),
                CheckOp("/guard", 0),
            ])
        assert await store.get("/a") == Versioned(b"a", 0)
        assert not await store.exists("/b")
        assert await store.exists("/victim")

    async def test_an_op_on_a_missing_node_fails_the_whole_multi(
            self, store: MetadataStore) -> None:
        with pytest.raises(NotFound):
            await store.multi([CreateOp("/b", b""), SetOp("/missing", b"")])
        assert not await store.exists("/b")


class TestSequentialAndEphemeral:
    """Sequential names carry a 10-digit counter; ephemerals end with their session."""

    async def test_sequential_creates_append_a_growing_ten_digit_counter(
            self, store: MetadataStore) -> None:
        await store.create("/q", b"")
        first = await store.create("/q/item-", b"", sequential=True)
        second = await store.create("/q/item-", b"", sequential=True)
        assert (first, second) == ("/q/item-0000000000", "/q/item-0000000001")
        assert await store.children("/q") == ["item-0000000000", "item-0000000001"]

    async def test_ephemeral_node_vanishes_when_its_session_closes(
            self, open_session: Opener) -> None:
        owner, observer = await open_session(), await open_session()
        await owner.create("/locks/owner", b"me", ephemeral=True)
        await owner.create("/locks/kept", b"")
        assert await observer.get("/locks/owner") == Versioned(b"me", 0)
        await owner.close()
        assert not await observer.exists("/locks/owner")
        assert await observer.children("/locks") == ["kept"]

    async def test_closing_twice_is_harmless(self, store: MetadataStore) -> None:
        await store.close()
        await store.close()


# ---- optional capabilities --------------------------------------------------------------------


@pytest.mark.parametrize(("implementation", "declared"), [
    (ZooKeeperMetadataStore, {MetadataStore, Sessions}),
    (EmbeddedMetadataStore, {MetadataStore}),
    (MemoryMetadataStore, {MetadataStore}),
    (ReadOnlyMetadataStore, {MetadataStore}),
])
def test_each_implementation_declares_what_it_offers(
        implementation: type, declared: set[type]) -> None:
    """The protocol and the capabilities are in each class's bases (mypy holds the class to
    them); none is declared that is not offered."""
    assert {MetadataStore, Sessions} & set(implementation.__mro__) == declared


@pytest.mark.timeout(40)
class TestSessions:
    """A session's state and id, and its transitions told to listeners on the event loop."""

    async def test_an_open_store_is_connected_with_an_id(
            self, session_store: tuple[SessionStore, Callable[[], None]]) -> None:
        store, _ = session_store
        assert store.session_state.value == "connected"
        assert isinstance(store.session_id, int)

    async def test_a_lost_session_is_told_then_replaced_by_a_new_one(
            self, session_store: tuple[SessionStore, Callable[[], None]]) -> None:
        store, expire = session_store
        heard: list[str] = []
        removed: list[str] = []
        store.add_session_listener(lambda state: heard.append(state.value))
        remove = store.add_session_listener(lambda state: removed.append(state.value))
        remove()
        old = store.session_id
        await store.create("/mine", b"", ephemeral=True)
        await asyncio.to_thread(expire)
        async with asyncio.timeout(30):
            while heard[-1:] != ["connected"]:
                await asyncio.sleep(0.05)
        assert "lost" in heard and removed == []
        assert store.session_state.value == "connected"
        assert store.session_id not in (None, old)
        assert not await store.exists("/mine")  # the lost session took its ephemeral node


async def test_read_only_wrapper_batches_reads_over_any_store() -> None:
    """The wrapper offers get_many (status uses it) whether or not the store it wraps batches,
    and no attribute of the wrapped store leaks through (a write helper would)."""
    inner = MemoryMetadataStore()
    await inner.create("/a", b"1")
    await inner.create("/b", b"2")
    ro = ReadOnlyMetadataStore(inner)
    assert await ro.get_many(["/a", "/missing", "/b"]) == [
        Versioned(b"1", 0), None, Versioned(b"2", 0)]
    assert not hasattr(ro, "session")  # the memory store's extra, not the wrapper's
