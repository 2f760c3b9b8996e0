"""The stop's rule (issue 22: 10,000 open segments, systemd's 30 s stop timeout): open segments
close for ``[daemon] stop_close_budget_s``, a few at a time; then at most ``LEAVE_OVER`` closes
under way are abandoned and every other unfinished topic is left as a crash leaves it. The next
start commits the rest: nothing lost, nothing twice, verify clean."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from pathlib import Path

import pytest

from offloadd import wiring
from offloadd.blobstore.base import StoreView
from offloadd.blobstore.memory import MemoryBlobStore
from offloadd.config import Settings
from offloadd.ledger.local import LocalLedgerStore, RolloverPolicy
from offloadd.metadata import managed_ledger
from offloadd.metadata.memory import MemoryMetadataStore
from offloadd.model import TopicName, catalog
from offloadd.offload import scheduler
from offloadd.read.reader import TierReader
from offloadd.read.verify import verify
from offloadd.shell.daemon import Daemon

pytestmark = pytest.mark.timeout(120)

TOPICS = [TopicName.parse(f"persistent://public/default/stop-{i:03d}") for i in range(240)]
ENTRIES = 4


async def committed(md: MemoryMetadataStore, topic: TopicName) -> int:
    info, _ = await managed_ledger.load(md, topic.managed_ledger)
    return sum(s.entries for s in catalog.segments(info) if s.complete)


async def test_a_small_close_budget_ends_the_stop_and_the_next_start_commits_the_rest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 80 closes at a time, each object's write held 0.3 s (a close writes two): within the
    # 1 s budget the first 80 commit and the next 80 are under way (64 of them abandoned, 16
    # left), and the last 80 still wait for their turn (left, having begun nothing of it)
    monkeypatch.setattr(scheduler, "STOP_CLOSES_AT_ONCE", 80)
    md = MemoryMetadataStore()
    store = LocalLedgerStore(tmp_path / "ledgers", md, RolloverPolicy())
    payloads: dict[TopicName, list[bytes]] = {}
    for t in TOPICS:
        payloads[t] = [f"{t}-{i}".encode() * 20 for i in range(ENTRIES)]
        for p in payloads[t]:
            await store.writer.append(t, [p])
    slow = [True]

    def fault(op: str, key: str) -> Awaitable[None] | None:
        if op in ("put", "complete") and slow[0]:
            return asyncio.sleep(0.3)
        return None

    blob = MemoryBlobStore(fault)
    # a 20 s deadline: the old stop closed for two thirds of it, and committed everything
    settings = Settings(metrics={"enabled": False},
                        daemon={"shutdown_deadline_s": 20.0, "stop_close_budget_s": 1.0})

    def daemon() -> Daemon:
        return Daemon(settings, source=wiring.local_view(store.source), metadata=md,
                      tier=StoreView(blob), discovery_interval_s=0.1)

    first = daemon()
    running = asyncio.create_task(first.run(install_signals=False))
    try:
        async with asyncio.timeout(60):  # every topic has read its entries: segments open
            while not (len(first.topics) == len(TOPICS) and all(
                    r.offloader.attempt is not None and r.offloader.attempt.entries == ENTRIES
                    for r in first.topics.values())):
                await asyncio.sleep(0.05)
        assert [await committed(md, t) for t in TOPICS] == [0] * len(TOPICS)
        offloaders = {t: first.topics[t].offloader for t in TOPICS}
        first.request_stop()
        await asyncio.wait_for(running, 30)
    finally:
        running.cancel()
    done = [await committed(md, t) for t in TOPICS]
    assert 0 < done.count(ENTRIES) < len(TOPICS)  # the budget cut the closes short
    assert set(done) <= {0, ENTRIES}
    unfinished = [offloaders[t] for t, n in zip(TOPICS, done, strict=True) if n == 0]
    abandoned = [o for o in unfinished if not o.leave_open]
    assert 0 < len(abandoned) <= scheduler.LEAVE_OVER  # at most 64 abandoned mid-way
    assert len(abandoned) < len(unfinished)  # the others left as a crash leaves them

    slow[0] = False
    second = daemon()
    running = asyncio.create_task(second.run(install_signals=False))
    try:
        async with asyncio.timeout(60):
            while True:
                second.scheduler.trigger()  # close whatever is open again
                if [await committed(md, t) for t in TOPICS] == [ENTRIES] * len(TOPICS):
                    break
                await asyncio.sleep(0.1)
    finally:
        second.request_stop()
        await asyncio.wait_for(running, 30)
    reader = TierReader(md, blob)
    for t in TOPICS:  # nothing lost, nothing twice
        assert [bytes(e.payload) async for e in reader.read(t)] == payloads[t]
    rep = await verify(md, blob, wiring.local_view(store.source), TOPICS, grace_s=0)
    assert rep.ok, rep.to_json()
    await store.close()
