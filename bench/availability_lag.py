"""P4 availability lag: how long after an entry is appended it is readable from the tier.

An in-process writer appends at ``--rate`` bytes/s (one topic) and records each batch's append
time; the daemon (filesystem tier, ``--roll-s`` time rolling, segments large enough that only
time rolls them) offloads it. A watcher polls the managed-ledger metadata every 20 ms: an entry
becomes readable from the tier when the segment holding it is committed. Lag = commit time −
append time; the benchmark prints p50/p99/max and p99 ÷ (roll time + 1 s) as JSON.

    .venv/bin/python bench/availability_lag.py [--rate 10000000] [--roll-s 10] [--seconds 40]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import tempfile
import time
from pathlib import Path

import uvloop

from offloadd import config
from offloadd.metadata import managed_ledger
from offloadd.model import Position, TopicName, catalog
from offloadd.shell.produce import PayloadPool
from offloadd.shell.runtime import Runtime

TOPIC = TopicName.parse("persistent://public/default/lag")


async def run(rate: float, roll_s: float, seconds: float, entry_size: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="offloadd-lag-") as d:
        root = Path(d)
        settings = config.load(None, **{
            "metadata__url": f"embedded:{root / 'metadata'}",
            "source__path": str(root / "ledgers"),
            "source__rollover_bytes": 16 * 1024 * 1024,
            "blobstore__path": str(root / "tier"),
            "offload__max_segment_rollover_time_minutes": roll_s / 60,
            "offload__max_size_per_segment_mbytes": 4096,
            "offload__max_block_size_bytes": 4 * 1024 * 1024,
            "metrics__enabled": False,
            "daemon__pid_file": str(root / "offloadd.pid"),
            "daemon__log_level": "WARNING",
        })
        rt = await Runtime.open(settings, with_writer=True)
        assert rt.local is not None
        writer = rt.local.writer
        appended: list[tuple[Position, float]] = []  # last position of each batch, its time
        committed_at: list[tuple[Position, float]] = []  # segment end, commit time
        stop = asyncio.Event()
        daemon = asyncio.create_task(rt.daemon.run(install_signals=False))

        async def write() -> None:
            pool = PayloadPool(entry_size)
            per_batch = max(1, int(rate * 0.01) // entry_size)  # ~100 batches/s
            t0 = time.monotonic()
            sent = 0
            while time.monotonic() - t0 < seconds:
                due = t0 + sent / rate
                now = time.monotonic()
                if due > now:
                    await asyncio.sleep(due - now)
                pos = await writer.append(TOPIC, pool.take(per_batch))  # type: ignore[arg-type]
                appended.append((pos, time.monotonic()))
                sent += per_batch * entry_size
            stop.set()

        async def watch() -> None:
            seen = 0
            while not (stop.is_set() and committed_at and appended
                       and committed_at[-1][0] >= appended[-1][0]):
                try:
                    info, _ = await managed_ledger.load(rt.metadata, TOPIC.managed_ledger)
                except Exception:
                    await asyncio.sleep(0.02)
                    continue
                done = [s for s in catalog.segments(info) if s.complete]
                now = time.monotonic()
                for s in done[seen:]:
                    committed_at.append((s.end, now))
                seen = len(done)
                if stop.is_set():
                    rt.daemon.trigger()
                await asyncio.sleep(0.02)

        await asyncio.gather(write(), asyncio.wait_for(watch(), seconds + 120))
        rt.daemon.request_stop()
        await daemon
        await rt.close()

    ends = [p for p, _ in committed_at]
    lags = []
    for pos, t in appended[: int(len(appended) * 0.95)]:  # the tail is closed by a trigger
        i = bisect.bisect_left(ends, pos)
        if i < len(committed_at):
            lags.append(committed_at[i][1] - t)
    lags.sort()

    def pct(p: float) -> float:
        return round(lags[min(len(lags) - 1, int(p * len(lags)))], 3)

    return {
        "benchmark": "availability_lag",
        "rate_bytes_per_s": rate,
        "roll_s": roll_s,
        "seconds": seconds,
        "segments": len(committed_at),
        "samples": len(lags),
        "lag_p50_s": pct(0.50),
        "lag_p99_s": pct(0.99),
        "lag_max_s": round(lags[-1], 3),
        "goal_s": roll_s + 1,
        "p99_over_goal": round(pct(0.99) / (roll_s + 1), 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=10_000_000)
    ap.add_argument("--roll-s", type=float, default=10.0)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--entry-size", type=int, default=1024)
    a = ap.parse_args()
    print(json.dumps(uvloop.run(run(a.rate, a.roll_s, a.seconds, a.entry_size)), indent=2))


if __name__ == "__main__":
    main()
