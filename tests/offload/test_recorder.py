"""The persisted per-topic offload status: what is written, when, and by whom (issue 14 item 3).

On the in-memory metadata store with ZooKeeper's semantics; the fence is a version check on a
node the test moves to play a newer owner.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import pytest

from offloadd.errors import Fenced, FormatError, Retriable
from offloadd.metadata import offload_status
from offloadd.metadata.base import CheckOp, Op
from offloadd.metadata.memory import MemoryMetadataStore
from offloadd.metadata.offload_status import OffloadStatus
from offloadd.model import Position
from offloadd.model.keys import offload_status_path
from offloadd.offload.recorder import StatusRecorder

pytestmark = pytest.mark.timeout(30)

ML = "public/default/persistent/orders"
EPOCH = "/test/epoch"


class VersionFence:
    """Holds while ``/test/epoch`` is at the version it had when taken."""

    def __init__(self, store: MemoryMetadataStore, version: int) -> None:
        self.store, self.version = store, version

    def guard_ops(self) -> Sequence[Op]:
        return (CheckOp(EPOCH, self.version),)

    async def verify(self) -> None:
        if (await self.store.get(EPOCH)).version != self.version:
            raise Fenced("a newer owner holds the topic")


class CountingStore(MemoryMetadataStore):
    """Counts writes to status nodes; can be made to fail."""

    def __init__(self) -> None:
        super().__init__()
        self.status_writes = 0
        self.down = False

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
