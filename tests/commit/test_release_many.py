"""Giving up many topics at once (a stop): owner nodes released in few requests, on every store.

    daemon a holds 300 topics, daemon b holds 5 more
    a: release_many(all 305) ─▶ read the 305 owner nodes together ─▶ delete a's 300 in
       ceil(300 / RELEASES_PER_REQUEST) batched requests; b's 5 are left alone
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest

from offloadd.commit import epochs
from offloadd.commit.cluster import ClusterOwnership, _Held
from offloadd.metadata.base import (
    BatchedMulti,
    BatchedReads,
    GroupResult,
    MetadataStore,
    Op,
    Versioned,
)
from offloadd.model import TopicName
from offloadd.model.keys import owner_path
from tests.metadata.conftest import Opener

pytestmark = pytest.mark.timeout(60)

OURS = [TopicName.parse(f"persistent://public/default/t-{i}") for i in range(300)]
THEIRS = [TopicName.parse(f"persistent://public/default/other-{i}") for i in range(5)]


class Counted:
    """The real store, with each request it is asked for counted by name."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> object:
        self.calls[name] += 1
        return getattr(self.store, name)


class CountedBatched(Counted):
    async def multi_batch(self, groups: Sequence[Sequence[Op]]) -> list[GroupResult]:
        self.calls["multi_batch"] += 1
        assert isinstance(self.store, BatchedMulti)
        return await self.store.multi_batch(groups)

    async def get_many(self, paths: Sequence[str]) -> list[Versioned | None]:
        self.calls["get_many"] += 1
        assert isinstance(self.store, BatchedReads)
        return await self.store.get_many(paths)


def counted(store: MetadataStore) -> Counted:
    batched = isinstance(store, BatchedMulti) and isinstance(store, BatchedReads)
    return CountedBatched(store) if batched else Counted(store)


async def test_a_stop_releases_every_held_topic_in_few_requests(open_session: Opener) -> None:
    a_store, b_store = await open_session(), await open_session()
    for t in OURS:
        assert await epochs.try_acquire(a_store, t.managed_ledger, "daemon-a") == 1
    for t in THEIRS:
        assert await epochs.try_acquire(b_store, t.managed_ledger, "daemon-b") == 1
    spy = counted(a_store)
    own = ClusterOwnership(spy, "daemon-a")  # type: ignore[arg-type]
    for t in OURS:  # what acquire() notes, without registering a member for this test
        own._held[t] = _Held(epoch=1, generation=0)
    spy.calls.clear()

    await own.release_many([*OURS, *THEIRS])

    for t in OURS:
        assert await epochs.current_owner(b_store, t.managed_ledger) is None
        assert await epochs.current_epoch(b_store, t.managed_ledger) == 1  # the epoch stays
    for t in THEIRS:
        assert await epochs.current_owner(b_store, t.managed_ledger) == "daemon-b"
    assert own.held() == {}
    if isinstance(spy, CountedBatched):
        # one read and two deletes' requests for 300 topics, not 300 of each
        assert spy.calls["delete"] == 0 and spy.calls["get"] == 0
        assert spy.calls["get_many"] == 2 and spy.calls["multi_batch"] == 2
    # a topic released is taken by the next owner at the next epoch
    assert await epochs.try_acquire(b_store, OURS[0].managed_ledger, "daemon-b") == 2


async def test_a_node_changed_since_it_was_read_is_left_and_the_others_released(
        open_session: Opener) -> None:
    store = await open_session()
    names = [t.managed_ledger for t in OURS[:10]]
    for n in names:
        await epochs.try_acquire(store, n, "daemon-a")
    if not (isinstance(store, BatchedMulti) and isinstance(store, BatchedReads)):
        pytest.skip("the store has no batch capabilities: releases go one by one")

    class Racing(CountedBatched):
        """Another request changes one owner node between the read and the deletes."""

        async def multi_batch(self, groups: Sequence[Sequence[Op]]) -> list[GroupResult]:
            path = owner_path(names[3])
            node = await self.store.get(path)
            await self.store.set(path, node.data, node.version)
            return await super().multi_batch(groups)

    out = await epochs.release_many(Racing(store), names, "daemon-a")  # type: ignore[arg-type]
    assert out == dict.fromkeys(names)  # the refused delete is not an error: not ours now
    left = [n for n in names if await epochs.current_owner(store, n) is not None]
    assert left == [names[3]]
