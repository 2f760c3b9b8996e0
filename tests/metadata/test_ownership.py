"""Topic ownership and epoch fencing, on every registered store (memory, embedded, ZooKeeper).

Each test plays several daemons as several sessions on one store::

    A: try_acquire -> epoch 1 ......... (session ends) .......... commit(epoch 1) -> Fenced
    B:                       try_acquire -> epoch 2 -> commit(epoch 2) -> applied
"""

from __future__ import annotations

import asyncio

import pytest

from offloadd.errors import Conflict, Fenced, FormatError
from offloadd.metadata import ownership
from offloadd.metadata.base import CreateOp, MetadataStore, SetOp, Versioned
from offloadd.model.keys import owner_path, topic_state_path
from tests.metadata.conftest import Opener

pytestmark = pytest.mark.timeout(30)

ML = "public/default/persistent/orders"


class TestAcquire:
    """One session at a time holds a topic; each acquisition gets a higher epoch."""

    async def test_first_acquisition_gets_epoch_one(self, store: MetadataStore) -> None:
        assert await ownership.try_acquire(store, ML, "daemon-a") == 1
        assert await ownership.current_owner(store, ML) == "daemon-a"
        assert await ownership.current_epoch(store, ML) == 1

    async def test_a_held_topic_is_not_acquired_again(self, open_session: Opener) -> None:
        a, b = await open_session(), await open_session()
        assert await ownership.try_acquire(a, ML, "daemon-a") == 1
        assert await ownership.try_acquire(b, ML, "daemon-b") is None
        assert await ownership.current_owner(b, ML) == "daemon-a"
        assert await ownership.current_epoch(b, ML) == 1

    async def test_when_the_owner_session_ends_the_next_owner_gets_a_higher_epoch(
            self, open_session: Opener) -> None:
        a, b = await open_session(), await open_session()
        await ownership.try_acquire(a, ML, "daemon-a")
        await a.close()
        assert await ownership.current_owner(b, ML) is None
        assert await ownership.try_acquire(b, ML, "daemon-b") == 2
        state = await ownership.read_state(b, ML)
        assert state is not None
        assert (state.epoch, state.owner) == (2, "daemon-b")

    async def test_concurrent_acquirers_have_exactly_one_winner(
            self, open_session: Opener) -> None:
        sessions = [await open_session() for _ in range(5)]
        epochs = await asyncio.gather(*(ownership.try_acquire(s, ML, f"daemon-{i}")
                                        for i, s in enumerate(sessions)))
        assert sorted(epochs, key=lambda e: e or 0) == [None, None, None, None, 1]

    async def test_release_by_the_owner_frees_the_topic_but_keeps_the_epoch(
            self, open_session: Opener) -> None:
        a, b = await open_session(), await open_session()
        await ownership.try_acquire(a, ML, "daemon-a")
        assert not await ownership.release(b, ML, "daemon-b")
        assert await ownership.current_owner(a, ML) == "daemon-a"
        assert await ownership.release(a, ML, "daemon-a")
        assert await ownership.current_owner(a, ML) is None
        assert await ownership.try_acquire(b, ML, "daemon-b") == 2

    async def test_topic_state_written_by_someone_else_is_refused(
            self, store: MetadataStore) -> None:
        await store.create(topic_state_path(ML), b'{"epoch": 7, "owner": "x"}')
        with pytest.raises(FormatError):
            await ownership.try_acquire(store, ML, "daemon-a")


class TestFencedCommit:
    """A commit carries the owner's epoch; a newer owner makes the stale commit fail whole."""

    async def test_current_owner_commits_and_gets_the_op_results(
            self, store: MetadataStore) -> None:
        epoch = await ownership.try_acquire(store, ML, "daemon-a")
        assert epoch == 1
        await store.create("/segments/s1", b"assigned")
        results = await ownership.commit(store, ML, epoch, [
            SetOp("/segments/s1", b"offloaded", 0), CreateOp("/segments/s2", b"assigned")])
        assert results == [1, "/segments/s2"]
        assert await store.get("/segments/s1") == Versioned(b"offloaded", 1)

    async def test_stale_owner_commit_is_fenced_and_applies_nothing(
            self, open_session: Opener) -> None:
        a, b = await open_session(), await open_session()
        await a.create("/segments/s1", b"assigned")
        stale = await ownership.try_acquire(a, ML, "daemon-a")
        assert stale == 1
        await ownership.release(a, ML, "daemon-a")
        assert await ownership.try_acquire(b, ML, "daemon-b") == 2
        with pytest.raises(Fenced):
            await ownership.commit(a, ML, stale, [SetOp("/segments/s1", b"stale write", 0),
                                                  CreateOp("/segments/s9", b"")])
        assert await b.get("/segments/s1") == Versioned(b"assigned", 0)
        assert not await b.exists("/segments/s9")
        with pytest.raises(Fenced):
            await ownership.check_epoch(a, ML, stale)

    async def test_the_bare_fence_op_fails_a_stale_multi_with_conflict(
            self, open_session: Opener) -> None:
        a, b = await open_session(), await open_session()
        stale = await ownership.try_acquire(a, ML, "daemon-a")
        assert stale is not None
        await a.close()
        assert await ownership.try_acquire(b, ML, "daemon-b") == 2
        with pytest.raises(Conflict):
            await b.multi([ownership.fence_op(ML, stale), CreateOp("/x", b"")])
        assert await b.multi([ownership.fence_op(ML, 2), CreateOp("/x", b"")]) == [None, "/x"]

    async def test_a_lost_race_on_the_owners_own_ops_is_a_conflict_not_fenced(
            self, store: MetadataStore) -> None:
        epoch = await ownership.try_acquire(store, ML, "daemon-a")
        assert epoch is not None
        await store.create("/segments/s1", b"")
        await store.set("/segments/s1", b"moved")
        with pytest.raises(Conflict):  # Fenced is not a Conflict: it would escape this
            await ownership.commit(store, ML, epoch, [SetOp("/segments/s1", b"x", 0)])
        assert await store.exists(owner_path(ML))
