"""Topics starting together learn which of them have a status record from one listing of their
namespace's records, not one read each (issue 22, "Sidecar at scale": a 5,000-topic start-up read
5,000 absent records); those that have one still read it and go on from it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from offloadd import wiring
from offloadd.blobstore.base import StoreView
from offloadd.blobstore.memory import MemoryBlobStore
from offloadd.config import Settings
from offloadd.ledger.local import LocalLedgerStore, RolloverPolicy
from offloadd.metadata import offload_status
from offloadd.metadata.base import Versioned
from offloadd.metadata.memory import MemoryMetadataStore
from offloadd.model import TopicName
from offloadd.model.keys import offload_status_path
from offloadd.shell.daemon import Daemon

pytestmark = pytest.mark.timeout(60)

MANY = [TopicName.parse(f"persistent://public/many/t-{i:02d}") for i in range(12)]
FEW = [TopicName.parse(f"persistent://public/few/t-{i}") for i in range(2)]
RECORDED = {MANY[0], MANY[5], MANY[11], FEW[1]}  # a previous owner wrote these topics' records
STATUS_ROOT = offload_status_path("x").rsplit("/", 1)[0]


class Counting(MemoryMetadataStore):
    def __init__(self) -> None:
        super().__init__()
        self.gets: list[str] = []
        self.listed: list[str] = []

    async def get(self, path: str) -> Versioned:
        self.gets.append(path)
        return await super().get(path)

    async def children(self, path: str) -> list[str]:
        self.listed.append(path)
        return await super().children(path)


async def test_a_namespace_of_new_topics_is_listed_once_and_recorded_topics_read_theirs(
        tmp_path: Path) -> None:
    md = Counting()
    store = LocalLedgerStore(tmp_path / "ledgers", md, RolloverPolicy())
    for t in [*MANY, *FEW]:
        await store.writer.append(t, [b"x" * 100])
    for t in RECORDED:
        await offload_status.write(md, t.managed_ledger, offload_status.OffloadStatus(
            state="stopped", owner="before", get_requests=7, get_since_ms=1234))
    md.gets.clear()
    md.listed.clear()
    daemon = Daemon(Settings(metrics={"enabled": False}),
                    source=wiring.local_view(store.source), metadata=md,
                    tier=StoreView(MemoryBlobStore()), discovery_interval_s=0.1)
    running = asyncio.create_task(daemon.run(install_signals=False))
    try:
        async with asyncio.timeout(30):
            while len(daemon.topics) < len(MANY) + len(FEW):
                await asyncio.sleep(0.02)
        status_reads = sorted(p for p in md.gets if p.startswith(STATUS_ROOT))
        # the 12 topics of one namespace: one listing, and a read of each record it showed;
        # the namespace of two is not listed (a listing for one or two topics costs more than
        # it saves): its topics read theirs as before
        assert [p for p in md.listed if p.startswith(STATUS_ROOT)] == \
            [offload_status_path(MANY[0].managed_ledger).rsplit("/", 1)[0]]
        assert status_reads == sorted(
            offload_status_path(t.managed_ledger) for t in [MANY[0], MANY[5], MANY[11], *FEW])
        for t in [*MANY, *FEW]:
            recorder = daemon.topics[t].recorder
            assert recorder is not None
            # a recorded topic goes on from its record (the GET count's start is kept)
            assert recorder.status.get_since_ms == (1234 if t in RECORDED else None), t
    finally:
        daemon.request_stop()
        await asyncio.wait_for(running, 30)
        await store.close()
    for t in [*MANY, *FEW]:  # the records written from "absent" were created, not lost
        got = await offload_status.read(md, t.managed_ledger)
        assert got is not None and got.state == "stopped", t
