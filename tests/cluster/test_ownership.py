"""Cluster ownership in one process: partitioning, fenced acquisition, hand-off, session loss,
and daemons sharing one memory tree (each daemon a session on it)::

    a: register ─ acquire its share (epoch 1) ─────── HANDOFF c's share ─ release
    b: register ─ acquire its share (epoch 1) ─────── HANDOFF c's share ─ release
    c:                                   register ─────────────────────── acquire (epoch 2)
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from offloadd.commit import epochs
from offloadd.commit.cluster import (
    CHECKS_PER_PASS,
    MEMBERS,
    ClusterOwnership,
    EpochFence,
    check_owner_id,
    member_path,
    read_members,
    rendezvous_owner,
)
from offloadd.commit.ownership import Revoke
from offloadd.errors import ConfigError, Conflict, Fenced
from offloadd.metadata.base import CheckOp, SetOp, Versioned
from offloadd.metadata.memory import MemoryMetadataStore, MemoryTree
from offloadd.model import TopicName
from offloadd.model.keys import topic_state_path
from tests.cluster._support import Cluster, SessionedStore, until

pytestmark = pytest.mark.timeout(60)

TOPICS = [TopicName.parse(f"persistent://public/default/t{i}") for i in range(40)]


async def joined(*owners: ClusterOwnership) -> None:
    """Two passes each: everyone registers, then everyone sees everyone."""
    for _ in range(2):
        for o in owners:
            await o.revoked([])


class TestPartitioning:
    """Every member computes the same owner for a topic; membership changes move few topics."""

    def test_the_owner_does_not_depend_on_the_order_members_are_listed(self) -> None:
        members = ["d1", "d2", "d3"]
        for t in TOPICS:
            assert rendezvous_owner(t, members) == rendezvous_owner(t, reversed(members))

    def test_every_member_gets_a_share_of_many_topics(self) -> None:
        many = [TopicName.parse(f"persistent://public/default/x{i}") for i in range(300)]
        shares = [sum(rendezvous_owner(t, ["d1", "d2", "d3"]) == m for t in many)
                  for m in ("d1", "d2", "d3")]
        assert sum(shares) == 300 and min(shares) > 60

    def test_a_leaving_member_moves_only_its_own_topics(self) -> None:
        before = {t: rendezvous_owner(t, ["d1", "d2", "d3"]) for t in TOPICS}
        after = {t: rendezvous_owner(t, ["d1", "d3"]) for t in TOPICS}
        moved = {t for t in TOPICS if before[t] != after[t]}
        assert moved == {t for t in TOPICS if before[t] == "d2"}
        assert moved

    def test_no_members_means_no_owner(self) -> None:
        assert rendezvous_owner(TOPICS[0], []) is None

    @pytest.mark.parametrize("bad", ["", "a/b", ".", "..", "tab\there"])
    def test_an_owner_id_that_is_not_one_znode_name_is_refused(self, bad: str) -> None:
        with pytest.raises(ConfigError, match="owner_id"):
            check_owner_id(bad)


class TestAcquisition:
    """A member acquires only its share, at a new epoch, fenced against stale owners."""

    async def test_each_topic_goes_to_exactly_the_member_the_partitioner_names(self) -> None:
        tree = MemoryTree()
        a = ClusterOwnership(MemoryMetadataStore(tree), "a")
        b = ClusterOwnership(MemoryMetadataStore(tree), "b")
        await joined(a, b)
        assert a.members == b.members == ("a", "b")
        got_a = {t for t in TOPICS if await a.acquire(t) is not None}
        got_b = {t for t in TOPICS if await b.acquire(t) is not None}
        assert got_a == {t for t in TOPICS if rendezvous_owner(t, ["a", "b"]) == "a"}
        assert got_b == set(TOPICS) - got_a
        assert got_a and got_b
        store = MemoryMetadataStore(tree)
        for t in TOPICS:
            assert await epochs.current_owner(store, t.managed_ledger) == (
                "a" if t in got_a else "b")
            assert await epochs.current_epoch(store, t.managed_ledger) == 1

    async def test_a_member_writes_its_registration_as_json(self) -> None:
        store = MemoryMetadataStore()
        a = ClusterOwnership(store, "a", wall_ms=lambda: 1234)
        await a.revoked([])
        doc = json.loads((await store.get(member_path("a"))).data)
        assert doc["owner"] == "a" and doc["since_ms"] == 1234 and isinstance(doc["pid"], int)
        assert [m.owner for m in await read_members(store)] == ["a"]
        await a.close()
        assert await store.children(MEMBERS) == []

    async def test_the_fence_rejects_a_commit_once_a_newer_owner_holds_the_topic(self) -> None:
        tree = MemoryTree()
        sa, sb = MemoryMetadataStore(tree), MemoryMetadataStore(tree)
        a, b = ClusterOwnership(sa, "a"), ClusterOwnership(sb, "b")
        await joined(a)
        topic = TOPICS[0]
        fence = await a.acquire(topic)
        assert isinstance(fence, EpochFence) and fence.epoch == 1
        assert list(fence.guard_ops()) == [CheckOp(topic_state_path(topic.managed_ledger), 0)]
        await sb.create("/data", b"v0")
        await sa.multi([*fence.guard_ops(), SetOp("/data", b"by a", 0)])
        await sa.close()  # a dies; its member and owner nodes go with the session
        await joined(b)
        fence_b = await b.acquire(topic)
        assert fence_b is not None and fence_b.epoch == 2  # type: ignore[attr-defined]
        late = MemoryMetadataStore(tree)  # whatever connection a's late commit arrives on
        with pytest.raises(Conflict):
            await late.multi([*fence.guard_ops(), SetOp("/data", b"late", 1)])
        with pytest.raises(Fenced):
            await EpochFence(late, topic.managed_ledger, 1).verify()
        assert (await late.get("/data")).data == b"by a"
        await fence_b.verify()

    async def test_a_joining_member_gets_its_share_by_hand_off(self) -> None:
        tree = MemoryTree()
        a = ClusterOwnership(MemoryMetadataStore(tree), "a")
        await joined(a)
        held = [t for t in TOPICS if await a.acquire(t) is not None]
        assert held == TOPICS
        c = ClusterOwnership(MemoryMetadataStore(tree), "c")
        await joined(c)
        verdicts = await a.revoked(held)
        moving = {t for t in TOPICS if rendezvous_owner(t, ["a", "c"]) == "c"}
        assert verdicts == dict.fromkeys(moving, Revoke.HANDOFF)
        assert all([await c.acquire(t) is None for t in moving])  # a still holds them
        for t in moving:
            await a.release(t)
        fences = [await c.acquire(t) for t in moving]
        assert all(f is not None and f.epoch == 2 for f in fences)  # type: ignore[attr-defined]
        assert await a.revoked([t for t in held if t not in moving]) == {}

    async def test_a_member_id_held_by_another_live_session_keeps_the_daemon_out(self) -> None:
        tree = MemoryTree()
        first = ClusterOwnership(MemoryMetadataStore(tree), "same")
        second = ClusterOwnership(MemoryMetadataStore(tree), "same")
        await joined(first, second)
        assert second.members == ()
        assert await second.acquire(TOPICS[0]) is None
        assert await first.acquire(TOPICS[0]) is not None


class TestSessions:
    """A lost session voids every holding made in it; the daemon rejoins with the new one."""

    async def test_a_lost_session_revokes_every_topic_held_in_it(self) -> None:
        tree = MemoryTree()
        store = SessionedStore(tree)
        a = ClusterOwnership(store, "a", sessions=store)
        told: list[dict[TopicName, Revoke]] = []
        a.bind(lambda verdicts: told.append(dict(verdicts)))
        await joined(a)
        held = TOPICS[:3]
        for t in held:
            assert await a.acquire(t) is not None
        await store.expire(reconnect=False)
        assert told == [dict.fromkeys(held, Revoke.LOST)]  # at once, not at the next pass
        assert await a.revoked(held) == dict.fromkeys(held, Revoke.LOST)
        assert await a.acquire(TOPICS[5]) is None  # nothing new while the session is gone
        for t in held:
            await a.release(t)  # a no-op: the owner nodes went with the session
        await store.reconnect()
        await a.revoked([])
        fences = [await a.acquire(t) for t in held]
        assert [f.epoch for f in fences] == [2, 2, 2]  # type: ignore[union-attr]

    async def test_a_new_session_id_voids_holdings_even_without_a_lost_event(self) -> None:
        store = SessionedStore(MemoryTree())
        a = ClusterOwnership(store, "a", sessions=store)
        await joined(a)
        assert await a.acquire(TOPICS[0]) is not None
        await store.inner.close()
        store.inner = MemoryMetadataStore(store._tree)
        store.session_id = 99  # reconnected in a new session; the LOST event never came
        assert await a.revoked([TOPICS[0]]) == {TOPICS[0]: Revoke.LOST}

    async def test_a_suspended_connection_acquires_nothing_but_keeps_running_topics(
            self) -> None:
        store = SessionedStore(MemoryTree())
        a = ClusterOwnership(store, "a", sessions=store)
        await joined(a)
        assert await a.acquire(TOPICS[0]) is not None
        store.suspend()
        assert await a.revoked([TOPICS[0]]) == {}
        assert await a.acquire(TOPICS[1]) is None
        store.resume()
        assert await a.acquire(TOPICS[1]) is not None


class TestDaemonsShareTopics:
    """Daemons on one store: each topic runs in exactly one daemon, through joins and deaths."""

    async def test_a_joining_daemon_takes_its_share_without_a_topic_ever_running_twice(
            self, tmp_path: Path) -> None:
        cl = Cluster(tmp_path, topics=8)
        await cl.start_writer()
        a, b = cl.add("a"), cl.add("b")
        overlaps: list[dict[TopicName, int]] = []

        async def watch() -> None:
            while True:
                counts = cl.owner_counts()
                if any(n > 1 for n in counts.values()):
                    overlaps.append(counts)
                await asyncio.sleep(0.005)

        watcher = asyncio.create_task(watch())
        await until(lambda: len(a.running | b.running) == 8, 10, "a and b to run all topics")
        c = cl.add("c")
        share_c = {t for t in cl.topics if rendezvous_owner(t, ["a", "b", "c"]) == "c"}
        await until(lambda: c.running == share_c, 10, "c to run its share")
        await asyncio.sleep(0.5)
        await cl.stop_writer()
        await until(cl.drained, 20, "every entry committed")
        for node in (a, b, c):
            await node.stop()
        watcher.cancel()
        assert overlaps == []
        rep = await cl.verify()
        assert rep.ok, rep.to_json()
        assert sum(t.entries for t in rep.topics) == cl.written

    async def test_a_dead_daemons_topics_are_taken_over_and_streaming_goes_on(
            self, tmp_path: Path) -> None:
        cl = Cluster(tmp_path, topics=6)
        await cl.start_writer()
        a, b = cl.add("a"), cl.add("b")
        await until(lambda: len(a.running | b.running) == 6, 10, "all topics running")
        await until(lambda: _all_committed_some(cl), 10, "a segment on every topic")
        lost = set(a.running)
        before = await cl.committed()
        await a.crash()
        await until(lambda: b.running == set(cl.topics), 10, "b to take over a's topics")
        await until(lambda: _grew(cl, before, lost), 10, "a's topics to stream on under b")
        await cl.stop_writer()
        await until(cl.drained, 20, "every entry committed")
        await b.stop()
        rep = await cl.verify()
        assert rep.ok, rep.to_json()
        assert sum(t.entries for t in rep.topics) == cl.written

    async def test_a_daemon_whose_session_is_lost_stops_its_topics_and_rejoins(
            self, tmp_path: Path) -> None:
        cl = Cluster(tmp_path, topics=4)
        await cl.start_writer()
        store = SessionedStore(cl.tree)
        a = cl.add("a", store, sessions=store)
        await until(lambda: len(a.running) == 4, 10, "a to run every topic")
        await until(lambda: _all_committed_some(cl), 10, "a segment on every topic")
        first = dict(a.daemon.topics)
        await store.expire()
        await until(lambda: all(r.task.done() for r in first.values()), 5,
                    "the old session's tasks to stop")
        assert all(r.task.cancelled() for r in first.values())
        await until(lambda: a.ownership.held() == dict.fromkeys(cl.topics, 2), 10,
                    "a to re-acquire every topic at epoch 2")
        await asyncio.sleep(0.3)
        await cl.stop_writer()
        await until(cl.drained, 20, "every entry committed")
        await a.stop()
        rep = await cl.verify()
        assert rep.ok, rep.to_json()
        assert sum(t.entries for t in rep.topics) == cl.written


async def _all_committed_some(cl: Cluster) -> bool:
    return all(n > 0 for n in (await cl.committed()).values())


async def _grew(cl: Cluster, before: dict[TopicName, int], topics: set[TopicName]) -> bool:
    now = await cl.committed()
    return all(now[t] > before[t] for t in topics)


class EpochReads(MemoryMetadataStore):
    """Counts reads of topic state (epoch) nodes."""

    reads = 0

    async def get(self, path: str) -> Versioned:
        if path.startswith(topic_state_path("x").rsplit("/", 1)[0]):
            self.reads += 1
        return await super().get(path)


class TestChecksAtScale:
    async def test_a_pass_reads_a_few_epochs_in_turn_and_still_finds_a_stolen_topic(
            self) -> None:
        """An idle daemon must not read every topic's epoch every second (1,000 reads a
        second at 1,000 topics); in turn, every topic is still checked."""
        tree = MemoryTree()
        store = EpochReads(tree)
        a = ClusterOwnership(store, "a")
        await joined(a)
        many = [TopicName.parse(f"persistent://public/default/s{i}") for i in range(100)]
        held = [t for t in many if await a.acquire(t) is not None]
        assert held == many
        stolen = many[77]
        path = topic_state_path(stolen.managed_ledger)
        # another owner took it (epoch = node version + 1)
        await store.set(path, json.dumps({"epoch": 2, "owner": "z"}).encode(), 0)
        found: dict[TopicName, Revoke] = {}
        for _ in range(4):  # ceil(100 / CHECKS_PER_PASS) passes
            before = store.reads
            found |= await a.revoked(held)
            assert store.reads - before <= CHECKS_PER_PASS
        assert found == {stolen: Revoke.LOST}
