"""The commit batcher on every registered store (memory: no batch capability, each write on its
own; embedded: one SQLite transaction; ZooKeeper: one ``multi``): many topics' fenced
compare-and-set writes in one request, a refused write failing alone.
"""

from __future__ import annotations

import asyncio

import pytest

from offloadd._proto import mldataformats_pb2 as pb
from offloadd.commit import edits, epochs
from offloadd.commit.batch import CommitBatcher
from offloadd.commit.fence import EpochFence, take
from offloadd.errors import Conflict, Fatal, Fenced, NotFound
from offloadd.metadata import managed_ledger
from offloadd.metadata.base import (
    BatchedMulti,
    BatchedReads,
    CheckOp,
    CreateOp,
    MetadataStore,
    SetOp,
    Versioned,
)
from offloadd.model.keys import managed_ledger_path
from tests.metadata.conftest import Opener

pytestmark = pytest.mark.timeout(60)

MLS = [f"public/default/persistent/t-{i}" for i in range(6)]


async def _topics(store: MetadataStore, owner: str = "d1") -> list[EpochFence]:
    fences = []
    for ml in MLS:
        await store.create(managed_ledger_path(ml), pb.ManagedLedgerInfo().SerializeToString(),
                           make_parents=True)
        fence = await take(store, ml, owner)
        assert fence is not None
        fences.append(fence)
    return fences


def _add_ledger(ledger_id: int):  # type: ignore[no-untyped-def]
    def edit(info: pb.ManagedLedgerInfo) -> bool:
        info.ledgerInfo.add(ledgerId=ledger_id)
        return True

    return edit


async def _ledgers(store: MetadataStore, ml: str) -> list[int]:
    info, _ = await managed_ledger.load(store, ml)
    return [li.ledgerId for li in info.ledgerInfo]


class TestMultiBatch:
    """The store capability itself: each group all or nothing, a refused one alone."""

    async def test_a_stale_version_fails_only_its_group(self, store: MetadataStore) -> None:
        if not isinstance(store, BatchedMulti):
            pytest.skip("this store has no batch capability (the batcher sends one by one)")
        for p in ("/a", "/b", "/c"):
            await store.create(p, b"0")
        await store.set("/b", b"moved")  # /b is at version 1 now
        results = await store.multi_batch([
            [CheckOp("/c", 0), SetOp("/a", b"A", 0)],
            [CreateOp("/b-side", b"x"), SetOp("/b", b"B", 0)],  # stale: /b is at 1
            [SetOp("/c", b"C", 0)],
        ])
        assert results[0] == [None, 1]
        assert isinstance(results[1], Conflict)
        assert results[2] == [1]
        assert (await store.get("/a")).data == b"A"
        assert (await store.get("/b")).data == b"moved"
        assert not await store.exists("/b-side")  # the refused group left nothing behind
        assert (await store.get("/c")).data == b"C"

    async def test_groups_see_the_groups_before_them(self, store: MetadataStore) -> None:
        if not isinstance(store, BatchedMulti):
            pytest.skip("this store has no batch capability")
        await store.create("/n", b"0")
        results = await store.multi_batch([
            [SetOp("/n", b"1", 0)],
            [SetOp("/n", b"2", 0)],  # lost the race to the group before it
            [SetOp("/n", b"2", 1)],
            [CreateOp("/n/kid", b"")],
            [CheckOp("/missing", 0)],
        ])
        assert results[0] == [1]
        assert isinstance(results[1], Conflict)
        assert results[2] == [2]
        assert results[3] == ["/n/kid"]
        assert isinstance(results[4], NotFound)
        assert (await store.get("/n")).data == b"2"


class TestBatcher:
    async def test_many_topics_commit_in_one_batch(self, store: MetadataStore) -> None:
        fences = await _topics(store)
        batcher = CommitBatcher(store, window_s=0.05)
        await asyncio.gather(*(edits.apply(store, f.ml_name, _add_ledger(7), f, batcher=batcher)
                               for f in fences))
        for ml in MLS:
            assert await _ledgers(store, ml) == [7]
        if batcher.batching:
            assert (batcher.batches, batcher.writes) == (1, len(MLS))
        else:
            assert batcher.batches == 0

    async def test_a_fenced_edit_in_a_batch_is_refused_and_the_others_commit(
            self, open_session: Opener) -> None:
        a, b = await open_session(), await open_session()
        fences = await _topics(a, "daemon-a")
        # daemon-a's session for topic 2 ends; daemon-b takes it over (a higher epoch)
        await epochs.release(a, MLS[2], "daemon-a")
        assert await take(b, MLS[2], "daemon-b") is not None
        batcher = CommitBatcher(a, window_s=0.05)
        outcomes = await asyncio.gather(
            *(edits.apply(a, f.ml_name, _add_ledger(7), f, batcher=batcher) for f in fences),
            return_exceptions=True)
        assert isinstance(outcomes[2], Fenced)
        for i, ml in enumerate(MLS):
            assert await _ledgers(b, ml) == ([] if i == 2 else [7])
            if i != 2:
                assert not isinstance(outcomes[i], BaseException)

    async def test_lost_races_in_one_batch_are_retried_and_lose_no_update(
            self, store: MetadataStore) -> None:
        """Writes of one node in one batch: all but one carry a stale version, are refused
        alone, and go round the compare-and-set loop again; every edit lands once."""
        [fence, *_] = await _topics(store)
        batcher = CommitBatcher(store, window_s=0.05)
        await asyncio.gather(*(edits.apply(store, fence.ml_name, _add_ledger(i), fence,
                                           batcher=batcher) for i in range(1, 9)))
        assert sorted(await _ledgers(store, fence.ml_name)) == list(range(1, 9))
        if batcher.batching:
            assert batcher.writes > 8  # the refused ones went again

    async def test_a_failed_request_fails_every_write_of_the_batch(
            self, open_session: Opener) -> None:
        store = await open_session()
        if not isinstance(store, BatchedMulti):
            pytest.skip("this store has no batch capability")
        for p in ("/a", "/b"):
            await store.create(p, b"0")
        batcher = CommitBatcher(store, window_s=0.05)
        writes = [asyncio.ensure_future(batcher.multi([SetOp(p, b"1", 0)])) for p in ("/a", "/b")]
        await asyncio.sleep(0)  # queued, waiting for the window
        await store.close()  # the batch's request will find the session gone
        outcomes = await asyncio.gather(*writes, return_exceptions=True)
        assert [type(o) for o in outcomes] == [Fatal, Fatal], outcomes
        assert batcher.batches == 1

    async def test_batches_respect_the_size_cap(self, store: MetadataStore) -> None:
        fences = await _topics(store)
        batcher = CommitBatcher(store, window_s=0.05, max_groups=4)
        await asyncio.gather(*(edits.apply(store, f.ml_name, _add_ledger(7), f, batcher=batcher)
                               for f in fences))
        for ml in MLS:
            assert await _ledgers(store, ml) == [7]
        if batcher.batching:
            assert batcher.batches == 2


async def test_get_many_reads_every_node_and_none_for_the_absent(store: MetadataStore) -> None:
    if not isinstance(store, BatchedReads):
        pytest.skip("this store has no batched reads (status reads one by one)")
    await store.create("/r/a", b"A", make_parents=True)
    await store.create("/r/b", b"B")
    await store.set("/r/b", b"B2")
    got = await store.get_many(["/r/a", "/r/missing", "/r/b", "/r"])
    assert got == [Versioned(b"A", 0), None, Versioned(b"B2", 1), Versioned(b"", 0)]


async def test_get_many_keeps_the_order_across_its_batches(store: MetadataStore) -> None:
    """More paths than one query or one batch of pipelined reads holds (the embedded store
    asks 500 a query, ZooKeeper sends 256 at a time), absent ones and repeats among them."""
    if not isinstance(store, BatchedReads):
        pytest.skip("this store has no batched reads (status reads one by one)")
    await store.create("/m", b"")
    await store.multi([CreateOp(f"/m/{i}", str(i).encode()) for i in range(0, 1200, 3)])
    paths = [f"/m/{i}" for i in range(1200)] + ["/m/3", "/m/4"]
    got = await store.get_many(paths)
    want = [Versioned(str(i).encode(), 0) if i % 3 == 0 else None for i in range(1200)]
    assert got == [*want, Versioned(b"3", 0), None]
