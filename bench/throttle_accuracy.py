"""Throttle accuracy on the real clock, per limit.

For each limit (1, 10, 50, 100, 200 MB/s; MB = 10^6 bytes) a few concurrent "topics" acquire
block-sized chunks from one shared :class:`~offloadd.offload.throttle.Throttle` for a few seconds:

* ``mib-a``  two requests in flight of ``min(1 MiB, limit / 8)`` bytes,
* ``mib-b``  one request in flight of the same size,
* ``scaled`` two requests in flight of ``limit / 40`` bytes (at least 4 KiB): 25 kB at 1 MB/s,
  5 MB at 200 MB/s.

Chunks are capped at an eighth of the limit so a single grant cannot by itself make a one-second
window look hot (a window holds at most ``limit + largest chunk`` under sustained demand).

A second set, ``daemon``, goes through the daemon's own path, :meth:`PolicySource.acquire` of a real
:class:`~offloadd.shell.daemon.Daemon` (in-memory stores, nothing uploaded): three topics with
``blocks_in_flight`` (4) block uploads each in flight, for block sizes of 1 MiB and 4 MiB. Its
samples are the moments ``acquire`` returns, i.e. when a whole block may go to the store, so its
windows are those of the bytes an upload sends. A block is sent whole, so when it is larger than
a quarter of the limit a one-second window holding it exceeds 1.25 x the limit by construction.

Printed JSON, one entry per limit (and per limit and block size under ``daemon``):

``achieved``
    bytes of every grant after the first divided by the time from the first to the last grant
    (the first grant's tokens were saved before the clock started);
``ratio``
    ``achieved / limit``;
``max_1s_window_ratio``
    the most bytes granted in any one-second window starting at a grant, over the limit;
``topic_shares``
    each topic's fraction of the bytes (all three want more than the budget).

Usage: ``python bench/throttle_accuracy.py [--seconds S] [--out FILE]`` (about 90 s by default).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from offloadd import config
from offloadd.blobstore.base import StoreView
from offloadd.blobstore.memory import MemoryBlobStore
from offloadd.ledger.base import SourceView
from offloadd.ledger.memory import MemoryLedgerSource
from offloadd.metadata.memory import MemoryMetadataStore
from offloadd.metrics import Metrics
from offloadd.offload.throttle import Throttle
from offloadd.shell.daemon import Daemon

MB = 1_000_000
MIB = 1 << 20
LIMITS_MB = (1, 10, 50, 100, 200)
DAEMON_TOPICS = 3
DAEMON_BLOCKS = (MIB, 4 * MIB)


def _streams(limit: int) -> list[tuple[str, int]]:
    block = min(MIB, limit // 8)
    scaled = max(4096, limit // 40)
    return [
        ("mib-a", block),
        ("mib-a", block),
        ("mib-b", block),
        ("scaled", scaled),
        ("scaled", scaled),
    ]


def _max_window(grants: list[tuple[float, str, int]], width: float = 1.0) -> int:
    best = total = lo = 0
    for hi in range(len(grants)):
        total += grants[hi][2]
        while grants[hi][0] >= grants[lo][0] + width:
            total -= grants[lo][2]
            lo += 1
        best = max(best, total)
    return best


async def _run_one(limit: int, seconds: float) -> dict[str, Any]:
    throttle = Throttle(limit)
    grants: list[tuple[float, str, int]] = []

    async def topic(name: str, nbytes: int) -> None:
        while True:
            await throttle.acquire(nbytes, name)
            grants.append((time.monotonic(), name, nbytes))

    tasks = [asyncio.create_task(topic(name, n)) for name, n in _streams(limit)]
    await asyncio.sleep(seconds)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)

    return {
        "limit": limit,
        **_figures(grants, limit),
        "chunk_sizes": sorted({n for _, n in _streams(limit)}),
    }


def _figures(grants: list[tuple[float, str, int]], limit: int) -> dict[str, Any]:
    if len(grants) < 2:  # nothing to time: say so rather than divide by zero
        return {"achieved": 0.0, "ratio": 0.0, "max_1s_window_ratio": 0.0,
                "grants": len(grants), "topic_shares": {}}
    grants.sort()
    span = grants[-1][0] - grants[0][0]
    achieved = sum(n for _, _, n in grants[1:]) / span
    per_topic: dict[str, int] = defaultdict(int)
    for _, name, n in grants:
        per_topic[name] += n
    total = sum(per_topic.values())
    return {
        "achieved": round(achieved, 1),
        "ratio": round(achieved / limit, 4),
        "max_1s_window_ratio": round(_max_window(grants) / limit, 4),
        "grants": len(grants),
        "topic_shares": {k: round(v / total, 4) for k, v in sorted(per_topic.items())},
    }


def _daemon(limit: int) -> Daemon:
    """A real daemon whose throttle path is measured; its stores are never touched."""
    settings = config.load(None, offload__flow_permits_per_second=limit)
    return Daemon(settings, source=SourceView(MemoryLedgerSource()), metadata=MemoryMetadataStore(),
                  tier=StoreView(MemoryBlobStore()), metrics=Metrics())


async def _run_daemon(limit: int, block: int, seconds: float) -> dict[str, Any]:
    daemon = _daemon(limit)
    issued: list[tuple[float, str, int]] = []

    async def upload_slot(topic: str) -> None:
        while True:
            await daemon.policies.acquire(block, topic)
            issued.append((time.monotonic(), topic, block))

    in_flight = daemon.settings.offload.blocks_in_flight
    tasks = [asyncio.create_task(upload_slot(f"topic-{i}"))
             for i in range(DAEMON_TOPICS) for _ in range(in_flight)]
    await asyncio.sleep(seconds)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {"limit": limit, "block": block, "blocks_in_flight": in_flight,
            **_figures(issued, limit)}


async def _run(seconds: float) -> dict[str, Any]:
    results = [await _run_one(mb * MB, seconds) for mb in LIMITS_MB]
    worst = max(abs(r["ratio"] - 1) for r in results)
    # at 1 MB/s a 4 MiB block takes 4 s: slow limits run long enough for a score of blocks
    daemon = [await _run_daemon(mb * MB, block,
                                min(30.0, max(seconds, 20 * block / (mb * MB))))
              for mb in LIMITS_MB for block in DAEMON_BLOCKS]
    return {
        "limits": results,
        "daemon": daemon,
        "daemon_worst_rate_error": round(max(abs(r["ratio"] - 1) for r in daemon), 4),
        "seconds_per_limit": seconds,
        "worst_rate_error": round(worst, 4),
        "worst_1s_window_ratio": max(r["max_1s_window_ratio"] for r in results),
        "python": platform.python_version(),
        "loop": type(asyncio.get_running_loop()).__module__,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=2.5, help="run time per limit")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    try:
        import uvloop
    except ImportError:  # the daemon runs on uvloop; fall back so the bench still runs
        report = asyncio.run(_run(args.seconds))
    else:
        report = uvloop.run(_run(args.seconds))
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
