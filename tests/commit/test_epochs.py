"""Topic ownership and epoch fencing, on every registered store (memory, embedded, ZooKeeper).

Each test plays several daemons as several sessions on one store::

    A: try_acquire -> epoch 1 ......... (session ends) .......... write(fence 1) -> Fenced
    B:                       try_acquire -> epoch 2 -> write(fence 2) -> applied
"""

from __future__ import annotations

import asyncio

import pytest

from offloadd.commit import epochs
from offloadd.commit.fence import take
from offloadd.errors import Conflict, Fenced, FormatError
from offloadd.metadata import cas
from offloadd.metadata.base import CreateOp, MetadataStore, Versioned
from offloadd.model.keys import owner_path, topic_state_path
from tests.metadata.conftest import Opener

pytestmark = pytest.mark.timeout(30)

ML = "public/default/persistent/orders"


class TestAcquire:
    """One session at a time holds a topic; each acquisition gets a higher epoch."""

    async def test_first_acquisition_gets_epoch_one(self, store: MetadataStore) -> None:
        assert await epochs.try_acquire(store, ML, "daemon-a") == 1
        assert await epochs.current_owner(store, ML) == "daemon-a"
        assert await epochs.current_epoch(store, ML) == 1

    async def test_a_held_topic_is_not_acquired_again(self, open_session: Opener) -> None:
        a, b = await open_session(), await open_session()
        assert await epochs.try_acquire(a, ML, "daemon-a") == 1
        assert await epochs.try_acquire(b, ML, "daemon-b") is None
        assert await epochs.current_owner(b, ML) == "daemon-a"
        assert await epochs.current_epoch(b, ML) == 1

    async def test_when_the_owner_session_ends_the_next_owner_gets_a_higher_epoch(
            self, open_session: Opener) -> None:
        a, b = await open_session(), await open_session()
        await epochs.try_acquire(a, ML, "daemon-a")
        await a.close()
        assert await epochs.current_owner(b, ML) is None
        assert await epochs.try_acquire(b, ML, "daemon-b") == 2
        state = await epochs.read_state(b, ML)
        assert state is not None
        assert (state.epoch, state.owner) == (2, "daemon-b")

    async def test_concurrent_acquirers_have_exactly_one_winner(
            self, open_session: Opener) -> None:
        sessions = [await open_session() for _ in range(5)]
        won = await asyncio.gather(*(epochs.try_acquire(s, ML, f"daemon-{i}")
                                     for i, s in enumerate(sessions)))
        assert sorted(won, key=lambda e: e or 0) == [None, None, None, None, 1]

    async def test_release_by_the_owner_frees_the_topic_but_keeps_the_epoch(
            self, open_session: Opener) -> None:
        a, b = await open_session(), await open_session()
        await epochs.try_acquire(a, ML, "daemon-a")
        assert not await epochs.release(b, ML, "daemon-b")
        assert await epochs.current_owner(a, ML) == "daemon-a"
        assert await epochs.release(a, ML, "daemon-a")
        assert await epochs.current_owner(a, ML) is None
        assert await epochs.try_acquire(b, ML, "daemon-b") == 2

    async def test_topic_state_written_by_someone_else_is_refused(
            self, store: MetadataStore) -> None:
        await store.create(topic_state_path(ML), b'{"epoch": 7, "owner": "x"}')
        with pytest.raises(FormatError):
            await epochs.try_acquire(store, ML, "daemon-a")


class TestFencedCommit:
    """A write carries the owner's epoch fence; a newer owner makes the stale write fail whole."""

    async def test_the_current_owner_writes_with_its_extra_ops(
            self, store: MetadataStore) -> None:
        fence = await take(store, ML, "daemon-a")
        assert fence is not None and fence.epoch == 1
        await store.create("/segments/s1", b"assigned")
        stored = await cas.update(store, "/segments/s1", lambda node: b"offloaded",
                                  guard=fence.guard_ops(), also=[CreateOp("/segments/s2", b"")],
                                  on_conflict=fence.verify)
        assert stored == Versioned(b"offloaded", 1)
        assert await store.get("/segments/s1") == Versioned(b"offloaded", 1)
        assert await store.exists("/segments/s2")

    async def test_stale_owner_write_is_fenced_and_applies_nothing(
            self, open_session: Opener) -> None:
        a, b = await open_session(), await open_session()
        await a.create("/segments/s1", b"assigned")
        stale = await take(a, ML, "daemon-a")
        assert stale is not None and stale.epoch == 1
        await epochs.release(a, ML, "daemon-a")
        assert await epochs.try_acquire(b, ML, "daemon-b") == 2
        with pytest.raises(Fenced):
            await cas.update(a, "/segments/s1", lambda node: b"stale write",
                             guard=stale.guard_ops(), also=[CreateOp("/segments/s9", b"")],
                             on_conflict=stale.verify)
        assert await b.get("/segments/s1") == Versioned(b"assigned", 0)
        assert not await b.exists("/segments/s9")
        with pytest.raises(Fenced):
            await epochs.check_epoch(a, ML, stale.epoch)

    async def test_the_bare_fence_op_fails_a_stale_multi_with_conflict(
            self, open_session: Opener) -> None:
        a, b = await open_session(), await open_session()
        stale = await epochs.try_acquire(a, ML, "daemon-a")
        assert stale is not None
        await a.close()
        assert await epochs.try_acquire(b, ML, "daemon-b") == 2
        with pytest.raises(Conflict):
            await b.multi([epochs.fence_op(ML, stale), CreateOp("/x", b"")])
        assert await b.multi([epochs.fence_op(ML, 2), CreateOp("/x", b"")]) == [None, "/x"]

    async def test_a_lost_race_on_the_owners_own_node_is_retried_not_fenced(
            self, store: MetadataStore, monkeypatch: pytest.MonkeyPatch) -> None:
        fence = await take(store, ML, "daemon-a")
        assert fence is not None
        await store.create("/segments/s1", b"v0")
        seen: list[bytes] = []
        read = store.get

        async def get(path: str) -> Versioned:
            node = await read(path)
            if path == "/segments/s1" and not seen:
                await store.set(path, b"other")  # another writer, after this read
            return node

        def edit(node: Versioned | None) -> bytes:
            assert node is not None
            seen.append(node.data)
            return node.data + b"+a"

        monkeypatch.setattr(store, "get", get)
        stored = await cas.update(store, "/segments/s1", edit, guard=fence.guard_ops(),
                                  on_conflict=fence.verify)
        assert seen == [b"v0", b"other"]  # re-read and re-applied, not reported as fenced
        assert stored == Versioned(b"other+a", 2)
        assert await read("/segments/s1") == Versioned(b"other+a", 2)
        assert await store.exists(owner_path(ML))
