"""Segment commits per second with many topics committing at once, on the embedded store and
on ZooKeeper.

Each of ``--topics`` topics owns itself with an epoch fence (what ``offloadd run`` uses:
:mod:`offloadd.commit.fence`), has a managed ledger of one closed ledger, and commits
``--segments`` streaming segments the way the topic task does (:mod:`offloadd.offload.context`):
ASSIGN (``catalog.add_assigned``), then OFFLOADED (``catalog.mark_offloaded``), each a fenced
compare-and-set through :func:`offloadd.commit.edits.apply`. All topics start together (as after
``offload-now`` closes every open segment); the figure is committed segments / wall seconds.
Then every topic is given back as a stopping daemon does (``release_all_s``): one by one on even
repeats (as before), 64 at once on odd ones (as now).

The commit path is the daemon's: when the tree has a commit batcher (:mod:`offloadd.commit.
batch`) the topics share one, as the daemon's topic tasks do; ``--no-batch`` commits one by one
(as before it existed).

    .venv/bin/python bench/commit_rate.py [--store embedded|zookeeper|both] [--topics 1000]
        [--segments 1] [--repeats 3] [--no-batch] [--zk HOST:PORT]

Without ``--zk`` a standalone ZooKeeper is started from Debian's package (as the tests do).
Prints one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from offloadd._proto import mldataformats_pb2 as pb  # noqa: E402
from offloadd.commit import edits, fence  # noqa: E402
from offloadd.metadata.base import MetadataStore  # noqa: E402
from offloadd.metadata.embedded import EmbeddedMetadataStore  # noqa: E402
from offloadd.model import catalog  # noqa: E402
from offloadd.model.catalog import LedgerRange  # noqa: E402
from offloadd.model.keys import managed_ledger_path  # noqa: E402

try:  # the batcher, where the tree has one
    from offloadd.commit.batch import CommitBatcher
except ImportError:  # pragma: no cover - the "before" tree
    CommitBatcher = None  # type: ignore[assignment,misc]

ENTRIES_PER_SEGMENT = 100
DRIVER = catalog.driver_metadata("filesystem", {"root": "/tmp/bench"})


def _ml(i: int) -> str:
    return f"public/ns-{i % 10}/persistent/t-{i}"


async def _setup(store: MetadataStore, topics: int, segments: int) -> list[fence.EpochFence]:
    info = pb.ManagedLedgerInfo()
    li = info.ledgerInfo.add()
    li.ledgerId, li.entries, li.size = 1, ENTRIES_PER_SEGMENT * segments, 1 << 20
    data = info.SerializeToString()
    sem = asyncio.Semaphore(64)

    async def one(i: int) -> fence.EpochFence:
        async with sem:
            await store.create(managed_ledger_path(_ml(i)), data, make_parents=True)
            got = await fence.take(store, _ml(i), "bench")
            assert got is not None
            return got

    return list(await asyncio.gather(*(one(i) for i in range(topics))))


async def _commit_all(store: MetadataStore, fences: list[fence.EpochFence], segments: int,
                      batch: bool) -> float:
    batcher: Any = None
    kwargs: dict[str, Any] = {}
    if batch and CommitBatcher is not None:
        batcher = CommitBatcher(store)
        kwargs["batcher"] = batcher

    async def topic(f: fence.EpochFence) -> None:
        for s in range(segments):
            uid = uuid.uuid4()
            rng = (LedgerRange(1, s * ENTRIES_PER_SEGMENT, (s + 1) * ENTRIES_PER_SEGMENT - 1),)
            now = int(time.time() * 1000)
            await edits.apply(store, f.ml_name, partial(
                catalog.add_assigned, uid=uid, ranges=rng, now_ms=now, driver=DRIVER), f,
                **kwargs)
            await edits.apply(store, f.ml_name, partial(
                catalog.mark_offloaded, uid=uid, now_ms=now, ledger_ids=[1]), f, **kwargs)

    t0 = time.perf_counter()
    await asyncio.gather(*(topic(f) for f in fences))
    elapsed = time.perf_counter() - t0
    if batcher is not None:
        await batcher.close()
    return elapsed


@asynccontextmanager
async def _embedded() -> AsyncIterator[MetadataStore]:
    with tempfile.TemporaryDirectory(prefix="commit-rate-") as tmp:
        store = await EmbeddedMetadataStore.open(Path(tmp))
        try:
            yield store
        finally:
            await store.close()


@asynccontextmanager
async def _zookeeper(hostport: str) -> AsyncIterator[MetadataStore]:
    from offloadd.metadata.zookeeper import ZooKeeperMetadataStore

    store = await ZooKeeperMetadataStore.open(f"zk://{hostport}/bench-{uuid.uuid4().hex}",
                                              session_timeout_s=10.0)
    try:
        yield store
    finally:
        await store.close()


async def _release_all(fences: list[fence.EpochFence], at_once: int) -> float:
    """Give every topic back as a stopping daemon does (``at_once`` releases in flight)."""
    gate = asyncio.Semaphore(at_once)

    async def one(f: fence.EpochFence) -> None:
        async with gate:
            assert await fence.give_back(f)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(f) for f in fences))
    return time.perf_counter() - t0


async def _run(kind: str, args: argparse.Namespace, zk: str | None) -> dict[str, Any]:
    rates: list[float] = []
    releases: dict[str, list[float]] = {"one_by_one": [], "64_at_once": []}
    for r in range(args.repeats):
        opener = _embedded() if kind == "embedded" else _zookeeper(zk or "")
        async with opener as store:
            fences = await _setup(store, args.topics, args.segments)
            elapsed = await _commit_all(store, fences, args.segments, not args.no_batch)
            # the stop's last step, before (one by one) and after (64 at once), in turn
            how = "one_by_one" if r % 2 == 0 else "64_at_once"
            releases[how].append(await _release_all(fences, 1 if how == "one_by_one" else 64))
        rates.append(args.topics * args.segments / elapsed)
    return {"store": kind, "topics": args.topics, "segments_per_topic": args.segments,
            "batched": not args.no_batch and CommitBatcher is not None,
            "commits_per_s": [round(r) for r in rates],
            "commits_per_s_median": round(statistics.median(rates)),
            "release_all_s": {k: [round(x, 2) for x in v] for k, v in releases.items()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", choices=("embedded", "zookeeper", "both"), default="both")
    p.add_argument("--topics", type=int, default=1000)
    p.add_argument("--segments", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-batch", action="store_true")
    p.add_argument("--zk", metavar="HOST:PORT")
    args = p.parse_args()
    kinds = ["embedded", "zookeeper"] if args.store == "both" else [args.store]
    out: list[dict[str, Any]] = []
    server = None
    zk = args.zk
    try:
        if "zookeeper" in kinds and zk is None:
            from tests.fixtures.zookeeper import ZooKeeperServer

            server = ZooKeeperServer(Path(tempfile.mkdtemp(prefix="commit-rate-zk-")))
            server.start()
            server.wait_serving()
            zk = server.address
        import uvloop  # the daemon's event loop

        for kind in kinds:
            out.append(uvloop.run(_run(kind, args, zk)))
    finally:
        if server is not None:
            server.stop()
    print(json.dumps({"bench": "commit_rate", "results": out}, indent=2))


if __name__ == "__main__":
    main()
