"""P7 peak RSS under a slow store, as a ratio of the bound (buffer cap + 128 MiB).

``offloadd standalone`` writes 3 topics at ``--rate`` while the tier is held to
``--store-rate`` bytes/s by the broker-wide throttle (the store "is slow"), for ``--seconds``.
The process's RSS is sampled every 100 ms from /proc; prints JSON with the peak and the ratio
(goal ≤ 1).

    .venv/bin/python bench/memory_bound.py [--cap-mib 64] [--rate 40000000] [--seconds 30]
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.procstat import rss_bytes  # noqa: E402

MiB = 1024 * 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cap-mib", type=int, default=64)
    ap.add_argument("--rate", type=float, default=40_000_000)
    ap.add_argument("--store-rate", type=float, default=2_000_000)
    ap.add_argument("--seconds", type=float, default=30)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="offloadd-rss-") as d:
        cwd = Path(d)
        (cwd / "slow.toml").write_text(f"""
[offload]
buffer_max_bytes = {a.cap_mib * MiB}
max_block_size_bytes = {8 * MiB}
max_size_per_segment_mbytes = 256
flow_permits_per_second = {a.store_rate}
[metrics]
enabled = false
[daemon]
log_level = "WARNING"
""")
        proc = subprocess.Popen(
            [sys.executable, "-m", "offloadd", "standalone", "--json", "--config", "slow.toml",
             "--rate", str(a.rate), "--topics", "3", "--duration", str(a.seconds)],
            cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        peak = 0
        t0 = time.monotonic()
        while time.monotonic() - t0 < a.seconds and proc.poll() is None:
            peak = max(peak, rss_bytes(proc.pid))
            time.sleep(0.1)
        written = sum(f.stat().st_size for f in (cwd / "data" / "ledgers").glob("*.log"))
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    bound = a.cap_mib * MiB + 128 * MiB
    print(json.dumps({
        "benchmark": "memory_bound",
        "buffer_cap_bytes": a.cap_mib * MiB,
        "written_bytes": written,
        "store_rate_bytes_per_s": a.store_rate,
        "peak_rss_bytes": peak,
        "bound_bytes": bound,
        "peak_over_bound": round(peak / bound, 3),
    }, indent=2))


if __name__ == "__main__":
    main()
