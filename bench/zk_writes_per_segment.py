"""ZooKeeper writes per committed segment, for segments spanning 1 ledger and 10 ledgers.

For each scenario: the embedded writer puts history into a fresh chroot (one topic, 1 KiB
entries; ledgers of 10 000 entries for "1 ledger", of 10 entries for "10 ledgers"), then one
daemon with cluster ownership (what ``offloadd run`` uses: membership, acquisition, the epoch
fence on every commit) offloads it in segments of ~100 entries, on a real ZooKeeper. Its metadata
store is wrapped to count write requests — ``create``, ``set``, ``delete`` and ``multi`` (one
request, one ZooKeeper transaction, however many ops) — sorted by what they touch:

``segment``    writes carrying a ``/managed-ledgers`` node (assign, mark offloaded);
``ownership``  the rest (member registration, acquire, release): per daemon / per topic, not
               per segment.

Cross-check independent of our counting: the server's zxid (``srvr``), which advances by one per
write transaction the server processes, from any client. Only the daemon writes while it is
measured, but it also pays one-off transactions per run (its session, the parent nodes kazoo
creates one by one, registration, acquisition, release); so each scenario runs twice, with N and
2N entries, and the server-side figure is the marginal one: extra zxids / extra segments.

    .venv/bin/python bench/zk_writes_per_segment.py [--zk HOST:PORT] [--entries 2000]

Without ``--zk`` a standalone ZooKeeper is started from Debian's package (as the tests do).
Prints one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from offloadd import config, wiring  # noqa: E402
from offloadd.blobstore.filesystem import FilesystemBlobStore  # noqa: E402
from offloadd.commit.cluster import ClusterOwnership  # noqa: E402
from offloadd.ledger.local import LocalLedgerSource, LocalLedgerWriter, RolloverPolicy  # noqa: E402
from offloadd.metadata import managed_ledger  # noqa: E402
from offloadd.metadata.base import MetadataStore, Op, Versioned  # noqa: E402
from offloadd.metadata.zookeeper import ZooKeeperMetadataStore  # noqa: E402
from offloadd.model import TopicName, catalog  # noqa: E402
from offloadd.model.keys import MANAGED_LEDGERS  # noqa: E402
from offloadd.shell.daemon import Daemon  # noqa: E402
from tests.fixtures.zookeeper import ZooKeeperServer, four_letter  # noqa: E402

TOPIC = TopicName.parse("persistent://public/default/bench")
ENTRY = 1024


class CountingStore:
    """Passes everything through; counts write requests by kind and by what they touch."""

    def __init__(self, inner: MetadataStore) -> None:
        self.inner = inner
        self.writes: Counter[str] = Counter()
        self.ops = 0

    def _count(self, paths: Sequence[str]) -> None:
        kind = "segment" if any(p.startswith(MANAGED_LEDGERS + "/") for p in paths) \
            else "ownership"
        self.writes[kind] += 1
        self.ops += len(paths)

    async def get(self, path: str) -> Versioned:
        return await self.inner.get(path)

    async def exists(self, path: str) -> bool:
        return await self.inner.exists(path)

    async def children(self, path: str) -> list[str]:
        return await self.inner.children(path)

    async def create(self, path: str, data: bytes, *, ephemeral: bool = False,
                     sequential: bool = False, make_parents: bool = True) -> str:
        self._count([path])
        return await self.inner.create(path, data, ephemeral=ephemeral, sequential=sequential,
                                       make_parents=make_parents)

    async def set(self, path: str, data: bytes, version: int = -1) -> int:
        self._count([path])
        return await self.inner.set(path, data, version)

    async def delete(self, path: str, version: int = -1, *, recursive: bool = False) -> None:
        self._count([path])
        await self.inner.delete(path, version, recursive=recursive)

    async def multi(self, ops: Sequence[Op]) -> list[int | str | None]:
        self._count([op.path for op in ops])
        return await self.inner.multi(ops)

    async def close(self) -> None:
        await self.inner.close()


def zxid(port: int) -> int:
    for line in four_letter(port, "srvr").splitlines():
        if line.startswith("Zxid:"):
            return int(line.split(":", 1)[1].strip(), 16) & 0xFFFF_FFFF
    raise RuntimeError(f"no zxid from ZooKeeper on port {port}")


async def write_history(url: str, path: Path, entries: int, per_ledger: int) -> None:
    md = await ZooKeeperMetadataStore.open(url)
    try:
        writer = LocalLedgerWriter(path, md, RolloverPolicy(max_entries=per_ledger))
        payload = bytes(range(256)) * (ENTRY // 256)
        for _ in range(entries // per_ledger if per_ledger < entries else 1):
            n = min(per_ledger, entries)
            await writer.append(TOPIC, [payload] * n)
        await writer.close()
    finally:
        await md.close()


async def offload(url: str, path: Path, tier: Path, total: int, seg_entries: int
                  ) -> tuple[CountingStore, list[catalog.Segment], float]:
    settings = config.load(None, metadata__url=url,
                           offload__max_size_per_segment_mbytes=seg_entries * (ENTRY + 12) / 2**20,
                           offload__max_segment_rollover_time_minutes=60,
                           retention__orphan_grace_s=7200,
                           offload__max_block_size_bytes=64 * 1024, metrics__enabled=False)
    store = CountingStore(await ZooKeeperMetadataStore.open(url))
    ownership = ClusterOwnership(store, "bench", sessions=store.inner)  # the real session
    daemon = Daemon(settings, source=wiring.local_view(LocalLedgerSource(path, store)),
                    metadata=store, tier=wiring.filesystem_view(FilesystemBlobStore(tier)),
                    ownership=ownership, discovery_interval_s=0.2)
    t0 = time.perf_counter()
    task = asyncio.create_task(daemon.run(install_signals=False))
    try:
        while True:
            await asyncio.sleep(0.05)
            info, _ = await managed_ledger.load(store.inner, TOPIC.managed_ledger)
            segs = catalog.segments(info)
            if sum(s.entries for s in segs if s.complete) >= total:
                break
            for r in daemon.topics.values():  # close the short tail segment once it is read
                if r.offloader.position is not None and r.offloader.status()[
                        "open_segment_bytes"]:
                    pos = r.offloader.position
                    last = info.ledgerInfo[-1]
                    if (pos.ledger_id, pos.entry_id) > (last.ledgerId, last.entries - 1):
                        r.offloader.trigger()
        wall = time.perf_counter() - t0
    finally:
        daemon.request_stop()
        await task
        await store.close()
    return store, [s for s in segs if s.complete], wall


async def scenario(name: str, url: str, port: int, work: Path, entries: int, per_ledger: int,
                   seg_entries: int) -> dict[str, Any]:
    path, tier = work / "ledgers", work / "tier"
    await write_history(url, path, entries, per_ledger)
    z0 = zxid(port)
    store, segs, wall = await offload(url, path, tier, entries, seg_entries)
    z1 = zxid(port)
    n = len(segs)
    spans = [len(s.ranges) for s in segs]
    client = sum(store.writes.values())
    return {
        "scenario": name,
        "entries": entries,
        "entries_per_ledger": per_ledger,
        "segments": n,
        "ledgers_per_segment": {"mean": round(sum(spans) / n, 2), "min": min(spans),
                                "max": max(spans)},
        "segment_writes": store.writes["segment"],
        "segment_writes_per_segment": round(store.writes["segment"] / n, 3),
        "ownership_writes": store.writes["ownership"],
        "client_writes_total": client,
        "ops_in_writes": store.ops,
        "zxid_delta": z1 - z0,
        "wall_s": round(wall, 2),
    }


async def run(hosts: str, port: int, entries: int) -> list[dict[str, Any]]:
    out = []
    scenarios = (("1 ledger per segment", 10 * entries), ("10 ledgers per segment", 10))
    for name, per_ledger in scenarios:
        runs = []
        for n in (entries, 2 * entries):
            with tempfile.TemporaryDirectory(prefix="offloadd-zkw-") as d:
                url = f"zk://{hosts}/bench-{uuid.uuid4().hex[:8]}"
                runs.append(await scenario(name, url, port, Path(d), n, per_ledger, 100))
        small, big = runs
        extra = big["segments"] - small["segments"]
        marginal = (big["zxid_delta"] - small["zxid_delta"]) / extra
        out.append({**big, "runs": runs, "zxid_per_extra_segment": round(marginal, 3)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--zk", help="HOST:PORT of a ZooKeeper to use (default: start one)")
    ap.add_argument("--entries", type=int, default=2000)
    args = ap.parse_args()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    server = None
    tmp = tempfile.TemporaryDirectory(prefix="offloadd-zkw-server-")
    try:
        if args.zk:
            hosts = args.zk
        else:
            server = ZooKeeperServer(Path(tmp.name))
            server.start()
            server.wait_serving()
            hosts = server.address
        port = int(hosts.rsplit(":", 1)[1])
        import uvloop

        results = uvloop.run(run(hosts, port, args.entries))
    finally:
        if server is not None:
            server.stop()
        tmp.cleanup()
    print(json.dumps({"benchmark": "zk_writes_per_segment", "started": started,
                      "results": results}, indent=2))


if __name__ == "__main__":
    main()
