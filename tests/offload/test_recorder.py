"""The persisted per-topic offload status: what is written, when, and by whom (issue 14 item 3).

On the in-memory metadata store with ZooKeeper's semantics; the fence is a version check on a
node the test moves to play a newer owner.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from offloadd.errors import Fenced, FormatError, Retriable
from offloadd.metadata import cas, offload_status
from offloadd.metadata.base import CheckOp, GroupResult, MetadataStore, Op, Versioned
from offloadd.metadata.embedded.store import EmbeddedMetadataStore
from offloadd.metadata.memory import MemoryMetadataStore
from offloadd.metadata.offload_status import OffloadStatus
from offloadd.model import Position
from offloadd.model.keys import offload_status_path
from offloadd.offload.recorder import StatusRecorder, close_many

pytestmark = pytest.mark.timeout(30)

ML = "public/default/persistent/orders"
EPOCH = "/test/epoch"


class VersionFence:
    """Holds while ``/test/epoch`` is at the version it had when taken."""

    def __init__(self, store: MetadataStore, version: int) -> None:
        self.store, self.version = store, version

    def guard_ops(self) -> Sequence[Op]:
        return (CheckOp(EPOCH, self.version),)

    async def verify(self) -> None:
        if (await self.store.get(EPOCH)).version != self.version:
            raise Fenced("a newer owner holds the topic")


class CountingStore(MemoryMetadataStore):
    """Counts writes and reads of status nodes; can be made to fail."""

    def __init__(self) -> None:
        super().__init__()
        self.status_writes = 0
        self.status_reads = 0
        self.down = False

    async def get(self, path: str) -> Versioned:
        self.status_reads += "/offloadd/status/" in path
        return await super().get(path)

    async def multi(self, ops: Sequence[Op]) -> list[int | str | None]:
        if self.down:
            raise Retriable("metadata store unreachable")
        result = await super().multi(ops)
        self.status_writes += any("/offloadd/status/" in getattr(o, "path", "") for o in ops)
        return result


async def fenced_store() -> tuple[CountingStore, VersionFence]:
    store = CountingStore()
    await store.create(EPOCH, b"", make_parents=True)
    return store, VersionFence(store, 0)


async def eventually(cond: Callable[[], object], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.01)


async def recorded(store: MemoryMetadataStore) -> OffloadStatus:
    rec = await offload_status.read(store, ML)
    assert rec is not None
    return rec


class TestRecord:
    """The node's format: small, versioned JSON, strict about what matters."""

    def test_round_trip_and_unknown_keys_are_ignored(self) -> None:
        st = OffloadStatus(state="failing", owner="d1", failed_attempts=3,
                           last_error="S3 PutObject s3://b/k: NoSuchBucket", last_error_ms=5)
        assert OffloadStatus.decode(st.encode(), "x") == st
        doc = st.encode().replace(b'{"failed', b'{"future_key": 1, "failed')
        assert OffloadStatus.decode(doc, "x") == st

    @pytest.mark.parametrize("raw", [b"", b"[]", b'{"state": "sleeping"}', b"{not json"])
    def test_junk_is_a_format_error_naming_the_node(self, raw: bytes) -> None:
        with pytest.raises(FormatError, match="/offloadd/status/t"):
            OffloadStatus.decode(raw, "/offloadd/status/t")

    def test_a_huge_error_message_is_cut(self) -> None:
        st = OffloadStatus(state="failing", last_error="x" * 100_000)
        assert len(st.encode()) < 3000


class TestRecorder:
    """State changes are written at once; everything else at most once per interval."""

    async def test_a_failure_is_written_at_once_and_a_success_clears_it(self) -> None:
        store, fence = await fenced_store()
        rec = StatusRecorder(store, ML, fence, "d1", interval_s=60)
        rec.start()
        try:
            await eventually(lambda: rec.writes == 1)  # the owner's first record
            rec.failed("S3 PutObject s3://b/k: NoSuchBucket (HTTP 404)", 1, when_ms=1000)
            await eventually(lambda: rec.writes == 2)
            st = await recorded(store)
            assert (st.state, st.owner, st.failed_attempts, st.failing_since_ms) == (
                "failing", "d1", 1, 1000)
            assert "NoSuchBucket" in (st.last_error or "")
            rec.failed("S3 PutObject s3://b/k: NoSuchBucket (HTTP 404)", 2, when_ms=2000)
            rec.succeeded(Position(7, 99), "uid-1", when_ms=3000)  # state change: at once
            await eventually(lambda: rec.writes == 3)
            st = await recorded(store)
            assert (st.state, st.failed_attempts, st.failing_since_ms) == ("ok", 0, None)
            assert (st.last_success_ms, st.last_success_position, st.last_segment) == (
                3000, "7:99", "uid-1")
            assert st.last_error_ms == 2000  # the history stays
        finally:
            await rec.close()

    async def test_a_busy_topic_is_not_a_write_per_segment(self) -> None:
        store, fence = await fenced_store()
        rec = StatusRecorder(store, ML, fence, "d1", interval_s=0.5)
        rec.start()
        try:
            await eventually(lambda: rec.writes == 1)
            started = time.monotonic()
            for i in range(200):  # 200 commits in about a second (longer on a loaded machine)
                rec.succeeded(Position(1, i), f"u{i}")
                await asyncio.sleep(0.005)
            await eventually(lambda: rec.status.last_success_position == "1:199")
            await eventually(lambda: store.status_writes >= 2)
            await asyncio.sleep(0.6)
            # one write per interval at most (plus the first and the last), however long the
            # 200 commits took: never one per commit
            intervals = (time.monotonic() - started) / 0.5
            assert 2 <= store.status_writes <= intervals + 3, (store.status_writes, intervals)
            assert store.status_writes < 50
            assert (await recorded(store)).last_success_position == "1:199"  # latest wins
        finally:
            await rec.close()

    async def test_read_back_requests_add_up_across_owners(self) -> None:
        """GET-class requests of the read-back checks: summed, written with the next periodic
        write (or on close), and a new owner goes on from the record."""
        store, fence = await fenced_store()
        rec = StatusRecorder(store, ML, fence, "d1", interval_s=60)
        rec.start()
        await eventually(lambda: rec.writes == 1)
        rec.read_requests(3, 65_000, when_ms=500)
        rec.read_requests(0, 0, when_ms=600)  # a check that read nothing changes nothing
        rec.read_requests(3, 70_000, when_ms=700)
        await rec.close()
        st = await recorded(store)
        assert (st.get_requests, st.get_bytes, st.get_since_ms) == (6, 135_000, 500)
        nxt = StatusRecorder(store, ML, fence, "d2", initial=st, interval_s=60)
        nxt.read_requests(3, 1000, when_ms=900)
        assert (nxt.status.get_requests, nxt.status.get_since_ms) == (9, 500)

    async def test_stopping_keeps_a_failing_streak_and_a_new_owner_continues_it(self) -> None:
        store, fence = await fenced_store()
        rec = StatusRecorder(store, ML, fence, "d1", interval_s=60)
        rec.start()
        rec.failed("boom", 4, when_ms=10)
        rec.stopped()
        await rec.close()
        st = await recorded(store)
        assert (st.state, st.failed_attempts, st.last_error) == ("stopped", 4, "boom")
        nxt = StatusRecorder(store, ML, fence, "d2", initial=st, interval_s=60)
        nxt.start()
        await eventually(lambda: nxt.writes == 1)
        await nxt.close()
        st = await recorded(store)
        assert (st.state, st.owner, st.failed_attempts, st.failing_since_ms) == (
            "failing", "d2", 4, 10)

    async def test_an_unreachable_store_never_reaches_the_pipeline(self) -> None:
        store, fence = await fenced_store()
        rec = StatusRecorder(store, ML, fence, "d1", interval_s=0.2)
        store.down = True
        rec.start()
        try:
            rec.failed("boom", 1)
            await asyncio.sleep(0.3)
            assert rec.writes == 0
            store.down = False
            await eventually(lambda: rec.writes >= 1)
            assert (await recorded(store)).state == "failing"
        finally:
            await rec.close()

    async def test_a_stale_owner_never_overwrites_its_successor(self) -> None:
        store, fence = await fenced_store()
        rec = StatusRecorder(store, ML, fence, "d1", interval_s=60)
        rec.start()
        await eventually(lambda: rec.writes == 1)
        await store.set(EPOCH, b"d2")  # a newer owner took the topic...
        await offload_status.write(store, ML, OffloadStatus(owner="d2"))  # ...and wrote
        rec.failed("late news from the old owner", 9)
        rec.stopped()
        await rec.close()
        assert (await recorded(store)).owner == "d2"
        assert (await store.get(offload_status_path(ML))).version == 1


class TestKnownNode:
    """Only the owner writes its record, so it writes from the node it last wrote, without a
    read first (issue 22: a read per record, 10,000 of them at a stop); a node changed behind
    its back is read again, and what a crash leaves is continued by the next owner."""

    async def test_later_records_are_written_without_a_read(self) -> None:
        store, fence = await fenced_store()
        rec = StatusRecorder(store, ML, fence, "d1", interval_s=0.01)
        rec.start()
        try:
            await eventually(lambda: rec.writes == 1)
            reads = store.status_reads
            for i in range(3):
                rec.succeeded(Position(1, i), f"u{i}")
                await eventually(lambda i=i: rec.writes == 2 + i)  # type: ignore[misc]
            assert store.status_reads == reads  # the old code read the node before each write
            assert (await recorded(store)).last_success_position == "1:2"
        finally:
            await rec.close()

    async def test_a_node_changed_behind_its_back_is_read_again(self) -> None:
        store, fence = await fenced_store()
        rec = StatusRecorder(store, ML, fence, "d1", interval_s=0.01)
        rec.start()
        try:
            await eventually(lambda: rec.writes == 1)
            await store.set(offload_status_path(ML), OffloadStatus(owner="by hand").encode())
            rec.succeeded(Position(2, 5), "u")
            await eventually(lambda: rec.writes == 2)
            st = await recorded(store)
            assert (st.owner, st.last_success_position) == ("d1", "2:5")
        finally:
            await rec.close()

    async def test_after_a_crash_the_next_owner_goes_on_from_the_record(self) -> None:
        store, fence = await fenced_store()
        rec = StatusRecorder(store, ML, fence, "d1", interval_s=0.01)
        rec.start()
        rec.succeeded(Position(3, 7), "u1", when_ms=100)
        await eventually(lambda: rec.writes >= 1 and rec.status == rec._written)
        rec._started = False  # the process dies: no "stopped", nothing more written
        if rec._task is not None:  # (the writing task runs only while there is something)
            rec._task.cancel()
            await asyncio.gather(rec._task, return_exceptions=True)
        await store.set(EPOCH, b"d2")  # the next owner takes the topic
        known = cas.Known()
        previous = await offload_status.read(store, ML, known)
        reads = store.status_reads
        nxt = StatusRecorder(store, ML, VersionFence(store, 1), "d2", interval_s=0.01,
                             initial=previous, known=known)
        nxt.start()
        try:
            await eventually(lambda: nxt.writes == 1)
            nxt.succeeded(Position(3, 9), "u2", when_ms=200)
            await eventually(lambda: nxt.writes == 2)
            assert store.status_reads == reads
            st = await recorded(store)
            assert (st.state, st.owner, st.last_success_position, st.last_segment) == (
                "ok", "d2", "3:9", "u2")
        finally:
            await nxt.close()
        await rec.close()  # the dead owner's leftovers change nothing
        assert (await recorded(store)).owner == "d2"


class CountingEmbedded(EmbeddedMetadataStore):
    """The embedded store (it takes batches), counting requests and status-node reads."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.batches = 0
        self.multis = 0
        self.status_reads = 0

    async def get(self, path: str) -> Versioned:
        self.status_reads += "/offloadd/status/" in path
        return await super().get(path)

    async def multi(self, ops: Sequence[Op]) -> list[int | str | None]:
        self.multis += 1
        return await super().multi(ops)

    async def multi_batch(self, groups: Sequence[Sequence[Op]]) -> list[GroupResult]:
        self.batches += 1
        return await super().multi_batch(groups)


class TestCloseMany:
    """A stop writes thousands of "stopped" records: in a few batched requests, each record
    still fenced and compare-and-set, with no read (issue 22: a read, a task and a write per
    topic made most of a 10,000-topic stop)."""

    async def test_every_record_lands_in_a_few_requests(self, tmp_path: Path) -> None:
        store = CountingEmbedded(tmp_path)
        await store.create(EPOCH, b"", make_parents=True)
        await store.create("/test/epoch-b", b"", make_parents=True)
        try:
            names = [f"public/default/persistent/t-{i}" for i in range(600)]
            recs = [StatusRecorder(store, ml, VersionFence(store, 0), "d1", interval_s=60)
                    for ml in names]
            fenced = StatusRecorder(store, "public/default/persistent/fenced",
                                    OtherFence(store, 0), "d1", interval_s=60)
            for r in [*recs, fenced]:
                r.start()
            await eventually(lambda: all(r.writes == 1 for r in [*recs, fenced]), timeout=30)
            # one node changed behind its recorder's back, one topic taken by a newer owner
            await store.set(offload_status_path(names[7]), OffloadStatus(owner="x").encode())
            await store.set("/test/epoch-b", b"d2")
            await offload_status.write(store, "public/default/persistent/fenced",
                                       OffloadStatus(owner="d2"))
            store.batches = store.multis = store.status_reads = 0
            for i, r in enumerate(recs):
                r.succeeded(Position(1, i), f"u{i}", when_ms=i)  # pending (60 s interval)
            # as the scheduler's stop: "stopped" is told by close_many once the recorders'
            # tasks are stopped (told before, each task would start that urgent write first)
            closing = asyncio.ensure_future(close_many([*recs, fenced], store,
                                                       stopped=[*recs, fenced]))
            await closing
            assert store.batches == 3  # 601 records, 256 a request (the old code: 601 writes)
            assert store.multis <= 2 and store.status_reads <= 2  # the stale one, the fenced
            for i, ml in enumerate(names):
                st = await offload_status.read(store, ml)
                assert st is not None
                assert (st.state, st.owner, st.last_success_position) == (
                    "stopped", "d1", f"1:{i}"), ml
            st = await offload_status.read(store, "public/default/persistent/fenced")
            assert st is not None and st.owner == "d2"
        finally:
            await store.close()


class OtherFence(VersionFence):
    """A fence on a node of its own (``/test/epoch-b``)."""

    def guard_ops(self) -> Sequence[Op]:
        return (CheckOp("/test/epoch-b", self.version),)

    async def verify(self) -> None:
        if (await self.store.get("/test/epoch-b")).version != self.version:
            raise Fenced("a newer owner holds the topic")
