"""P3 write isolation: the embedded writer's append latency with offload running at full speed,
divided by the same without offload.

Two phases on the same store, each ``--seconds`` long: a writer process appends batches of
``--batch`` 1 KiB entries at ``--rate`` bytes/s to a topic and records each append's latency;
in the second phase an ``offloadd run`` daemon (no throttle) offloads ``--history-mib`` of
pre-written history plus the live topic at the same time. Prints p50/p99 of both phases and
their ratios as JSON (goal: p99 ratio ≤ 1.10).

    .venv/bin/python bench/write_isolation.py [--seconds 15] [--history-mib 768]
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WRITER = """
import asyncio, json, sys, time
from offloadd import config, wiring
from offloadd.ledger.local import LocalLedgerWriter
from offloadd.model import TopicName
from offloadd.shell.produce import PayloadPool

async def main(seconds, rate, batch):
    settings = config.load("bench.toml")
    md = await wiring.open_metadata(settings)
    w = LocalLedgerWriter(settings.source.path, md, wiring.rollover_policy(settings))
    topic = TopicName.parse(sys.argv[4])
    pool = PayloadPool(1024)
    lat = []
    t0 = time.monotonic(); sent = 0
    while time.monotonic() - t0 < seconds:
        due = t0 + sent / rate
        now = time.monotonic()
        if due > now:
            await asyncio.sleep(due - now)
        a = time.perf_counter()
        await w.append(topic, pool.take(batch))
        lat.append(time.perf_counter() - a)
        sent += batch * 1024
    await w.close(); await md.close()
    print(json.dumps(lat))

import uvloop
uvloop.run(main(float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])))
"""


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p * len(s)))]


def writer(cwd: Path, seconds: float, rate: float, batch: int, topic: str) -> list[float]:
    p = subprocess.run([sys.executable, "-c", WRITER, str(seconds), str(rate), str(batch),
                        topic], cwd=cwd, capture_output=True, text=True, timeout=seconds + 120)
    if p.returncode != 0:
        raise SystemExit(p.stderr[-3000:])
    out: list[float] = json.loads(p.stdout.strip().splitlines()[-1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--rate", type=float, default=5_000_000)
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--history-mib", type=int, default=768)
    ap.add_argument("--prefix", default="",
                    help='command prefix for the daemon, e.g. "nice -n 10"')
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="offloadd-iso-") as d:
        cwd = Path(d)
        (cwd / "bench.toml").write_text("""
[offload]
max_size_per_segment_mbytes = 128
max_block_size_bytes = 16777216
[source]
rollover_bytes = 67108864
[metrics]
enabled = false
[daemon]
log_level = "WARNING"
""")
        subprocess.run([sys.executable, "-m", "offloadd", "produce", "--json", "--config",
                        "bench.toml",
                        "--topics", "2", "--bytes", str(a.history_mib * 1024 * 1024)],
                       cwd=cwd, check=True, capture_output=True, timeout=900)
        alone = writer(cwd, a.seconds, a.rate, a.batch, "persistent://public/default/live-a")
        daemon = subprocess.Popen([*a.prefix.split(), sys.executable, "-m", "offloadd",
                                   "run", "--config",
                                   "bench.toml"], cwd=cwd, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            time.sleep(1.0)  # the daemon is offloading the history at full speed
            busy = writer(cwd, a.seconds, a.rate, a.batch, "persistent://public/default/live-b")
        finally:
            daemon.send_signal(signal.SIGKILL)
            daemon.wait(30)
    res = {
        "benchmark": "write_isolation",
        "rate_bytes_per_s": a.rate,
        "batch_entries": a.batch,
        "appends": [len(alone), len(busy)],
        "alone_ms": {"p50": round(pct(alone, 0.5) * 1e3, 3),
                     "p99": round(pct(alone, 0.99) * 1e3, 3)},
        "with_offload_ms": {"p50": round(pct(busy, 0.5) * 1e3, 3),
                            "p99": round(pct(busy, 0.99) * 1e3, 3)},
    }
    res["p50_ratio"] = round(pct(busy, 0.5) / pct(alone, 0.5), 3)
    res["p99_ratio"] = round(pct(busy, 0.99) / pct(alone, 0.99), 3)
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
