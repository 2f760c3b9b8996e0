"""What the topic task must never do when ownership or the metadata connection wavers; both are
reachable in a cluster (a ZooKeeper leader dying mid-commit, a stalled owner waking up).

Both were failures of ``offloadd/offload/topic.py`` once; these tests keep them fixed:

- a commit whose reply is lost (``Retriable`` after ZooKeeper applied it) is abandoned, and the
  abandon deletes the objects of what is now a committed segment;
- a stale owner that reaches recovery redoes the *new* owner's ASSIGNED segment, deleting its
  objects, before any fence check (the check comes only at its own commit);
- a stalled owner that wakes to an expired session (its commit refused, its record redone by the
  new owner, the metadata unreadable until the client reconnects) still deletes the sealed pair
  it can no longer commit, even when ownership loss cancels the task during that clean-up.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from offloadd import wiring
from offloadd._proto import mldataformats_pb2 as pb
from offloadd.blobstore.memory import MemoryBlobStore
from offloadd.commit import epochs
from offloadd.commit.cluster import EpochFence
from offloadd.errors import Retriable
from offloadd.ledger.local import LocalLedgerStore, RolloverPolicy
from offloadd.metadata import managed_ledger
from offloadd.metadata.base import Op, Versioned
from offloadd.metadata.memory import MemoryMetadataStore, MemoryTree
from offloadd.model import TopicName, catalog
from offloadd.model.catalog import SegmentKind
from offloadd.offload.buffer import OffloadBuffer
from offloadd.offload.context import OffloadMode
from offloadd.offload.roller import RollPolicy
from offloadd.offload.topic import OffloadEnv, TopicOffloader, TopicPolicy
from offloadd.read.verify import verify
from offloadd.retry import Backoff
from tests.cluster._support import until

pytestmark = pytest.mark.timeout(30)

TOPIC = TopicName.parse("persistent://public/default/safety")
ML = TOPIC.managed_ledger
ROLL = RollPolicy(20_000, 600, 8192)


def offloader(store: MemoryMetadataStore, source: LocalLedgerStore, blob: MemoryBlobStore,
              epoch: int, mode: str = "streaming") -> TopicOffloader:
    env = OffloadEnv(source=source.source, metadata=store, blobstore=blob,
                     buffer=OffloadBuffer(8 << 20), retry=Backoff(0.01, 0.05),
                     idle_poll_s=0.05)
    return TopicOffloader(TOPIC, env, lambda: TopicPolicy(ROLL, mode=OffloadMode(mode)),
                          EpochFence(store, ML, epoch))


async def history(tmp: Path, store: MemoryMetadataStore, n: int = 50,
                  per_ledger: int = 1000) -> LocalLedgerStore:
    local = LocalLedgerStore(tmp / "ledgers", store, RolloverPolicy(max_entries=per_ledger))
    for i in range(n):
        await local.writer.append(TOPIC, [f"{i:04d}".encode() * 250])
    return local


async def running(tmp: Path, store: MemoryMetadataStore, tree: MemoryTree, *,
                  mode: str = "streaming", per_ledger: int = 1000,
                  ) -> tuple[TopicOffloader, asyncio.Task[None], MemoryBlobStore,
                             LocalLedgerStore]:
    """50 entries written through ``store``; owner "a" acquired; its topic task started."""
    local = await history(tmp, store, per_ledger=per_ledger)
    epoch = await epochs.try_acquire(MemoryMetadataStore(tree), ML, "a")
    assert epoch is not None
    blob = MemoryBlobStore()
    off = offloader(store, local, blob, epoch, mode=mode)
    return off, asyncio.create_task(off.run()), blob, local


class ReplyLost(MemoryMetadataStore):
    """Applies the ``nth`` multi, then reports the connection lost (the reply never came)."""

    def __init__(self, tree: MemoryTree, nth: int) -> None:
        super().__init__(tree)
        self.nth = nth
        self.seen = 0

    async def multi(self, ops: Sequence[Op]) -> list[int | str | None]:
        result = await super().multi(ops)
        self.seen += 1
        if self.seen == self.nth:
            raise Retriable("connection lost; the write may have been applied")
        return result


async def test_a_commit_whose_reply_is_lost_keeps_the_committed_segments_objects(
        tmp_path: Path) -> None:
    tree = MemoryTree()
    store = ReplyLost(tree, nth=2)  # 1: assign, 2: mark offloaded (lands, reply lost)
    off, task, blob, local = await running(tmp_path, store, tree)
    await until(lambda: store.seen >= 2, 10, "the lost reply")
    await until(lambda: _drained(off, store, 50), 10, "everything committed")
    off.request_stop()
    await asyncio.wait_for(task, 10)
    rep = await verify(store, blob, wiring.local_view(local.source), [TOPIC], grace_s=0)
    assert rep.ok, rep.to_json()


class SessionExpiresAtCommit(MemoryMetadataStore):
    """At the ``nth`` multi (the commit of a sealed segment) the session has expired: the write
    is not applied, the new owner has taken over the segment's redo (its record carries another
    uuid now), and the next
    ``unreadable`` reads fail, each after ``latency_s``, while the client reconnects."""

    def __init__(self, tree: MemoryTree, *, nth: int, unreadable: int,
                 latency_s: float = 0.05) -> None:
        super().__init__(tree)
        self.tree, self.nth, self.unreadable, self.latency_s = tree, nth, unreadable, latency_s
        self.seen = 0
        self.failing = 0
        self.failed_reads = 0
        self.expired: list[uuid.UUID] = []  # the uid whose commit was refused
        self.on_unreadable: Callable[[], None] = lambda: None

    async def multi(self, ops: Sequence[Op]) -> list[int | str | None]:
        self.seen += 1
        if self.seen != self.nth:
            return await super().multi(ops)
        other = MemoryMetadataStore(self.tree)
        info, _ = await managed_ledger.load(other, ML)
        [seg] = [s for s in catalog.segments(info) if not s.complete]

        def redo(i: pb.ManagedLedgerInfo) -> bool:  # the new owner's redo has a fresh uuid
            if seg.kind is SegmentKind.LEDGER:
                driver = catalog.driver_metadata(seg.driver, dict(seg.driver_properties))
                return catalog.assign_ledger(i, seg.ranges[0].ledger_id, uuid.uuid4(), 0,
                                             driver)
            return catalog.reassign(i, seg.uid, uuid.uuid4(), 0)

        await managed_ledger.update(other, ML, redo)
        self.expired.append(seg.uid)
        self.failing = self.unreadable
        raise Retriable("session expired; the write was not applied")

    async def get(self, path: str) -> Versioned:
        if self.failing:
            self.failing -= 1
            self.failed_reads += 1
            self.on_unreadable()
            await asyncio.sleep(self.latency_s)
            raise Retriable("connection lost; reconnecting")
        return await super().get(path)


def _pair_left(blob: MemoryBlobStore, uid: uuid.UUID) -> list[str]:
    return [k for k in blob.objects if k.startswith(str(uid))]


async def test_an_uncommittable_sealed_pair_is_deleted_once_the_metadata_reads_again(
        tmp_path: Path) -> None:
    tree = MemoryTree()
    store = SessionExpiresAtCommit(tree, nth=2, unreadable=3)  # 1: assign, 2: refused commit
    off, task, blob, local = await running(tmp_path, store, tree)
    await until(lambda: bool(store.expired) and not store.failing, 10, "the refused commit")
    await until(lambda: _drained(off, store, 50), 10, "everything committed")
    off.request_stop()
    await asyncio.wait_for(task, 10)
    assert store.failed_reads == 3
    assert _pair_left(blob, store.expired[0]) == []
    rep = await verify(store, blob, wiring.local_view(local.source), [TOPIC], grace_s=0)
    assert rep.ok and rep.orphans == [], rep.to_json()


async def test_losing_ownership_during_the_clean_up_does_not_leave_the_pair(
        tmp_path: Path) -> None:
    tree = MemoryTree()
    store = SessionExpiresAtCommit(tree, nth=2, unreadable=2)
    _, task, blob, _ = await running(tmp_path, store, tree)

    def revoke() -> None:  # the session's loss revokes the topic (LOST)
        task.cancel()

    store.on_unreadable = revoke
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 10)
    assert store.expired and store.failed_reads == 2
    assert _pair_left(blob, store.expired[0]) == []


async def test_a_whole_ledger_pair_whose_commit_is_refused_is_deleted(tmp_path: Path) -> None:
    tree = MemoryTree()
    store = SessionExpiresAtCommit(tree, nth=2, unreadable=3)  # 1: assign, 2: refused commit
    # 4 closed ledgers of 10 entries, 1 open
    off, task, blob, _ = await running(tmp_path, store, tree, mode="ledger", per_ledger=10)

    reader = MemoryMetadataStore(tree)  # the test's own session, never failing

    async def closed_ledgers_committed() -> bool:
        info, _ = await managed_ledger.load(reader, ML)
        return sum(s.entries for s in catalog.segments(info) if s.complete) >= 40

    await until(closed_ledgers_committed, 10, "the closed ledgers committed")
    off.request_stop()
    await asyncio.wait_for(task, 10)
    assert store.expired and store.failed_reads == 3
    assert _pair_left(blob, store.expired[0]) == []
    info, _ = await managed_ledger.load(reader, ML)
    referenced = {str(s.uid) for s in catalog.segments(info)}
    assert {k.split("-ledger-")[0] for k in blob.objects} == referenced


async def test_a_stale_owner_recovering_never_deletes_the_new_owners_segment(
        tmp_path: Path) -> None:
    tree = MemoryTree()
    old_session = MemoryMetadataStore(tree)
    epoch_a = await epochs.try_acquire(old_session, ML, "a")
    await old_session.close()  # a stalls past its session; b takes over
    store_b = MemoryMetadataStore(tree)
    epoch_b = await epochs.try_acquire(store_b, ML, "b")
    assert epoch_a == 1 and epoch_b == 2
    local = await history(tmp_path, store_b)

    gate, parked = asyncio.Event(), asyncio.Event()

    async def hold_index(op: str, key: str) -> None:
        if op == "put" and key.endswith("-index") and not gate.is_set():
            parked.set()
            await gate.wait()

    blob = MemoryBlobStore(hold_index)
    b = offloader(store_b, local, blob, epoch_b)
    task_b = asyncio.create_task(b.run())
    b.trigger()
    await asyncio.wait_for(parked.wait(), 10)  # b: segment ASSIGNED, data complete, index next

    a = offloader(MemoryMetadataStore(tree), local, blob, epoch_a)  # a wakes up, recovers
    await asyncio.wait_for(a.run(), 10)  # ends on Fenced at its own commit
    gate.set()
    await until(lambda: _drained(b, store_b, 50), 10, "b's commits")
    b.request_stop()
    await asyncio.wait_for(task_b, 10)
    rep = await verify(store_b, blob, wiring.local_view(local.source), [TOPIC], grace_s=0)
    assert rep.ok, rep.to_json()


async def _drained(off: TopicOffloader, store: MemoryMetadataStore, n: int) -> bool:
    """Every entry committed; until then, close the open tail segment."""
    info, _ = await managed_ledger.load(store, ML)
    if sum(s.entries for s in catalog.segments(info) if s.complete) >= n:
        return True
    off.trigger()
    return False
