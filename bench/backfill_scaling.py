"""Backfill throughput on Spark ``local[1]`` vs ``local[2]`` over the same history.

Writes ``--mib`` MiB of history once with ``offloadd produce`` (several runs with different entry
sizes and ledger rollover sizes, so ledgers vary), and keeps a pristine copy of the metadata
store. Each measured run gets a fresh copy of that metadata (no segments yet) and an empty
filesystem tier, and runs ``offloadd backfill --master local[N]`` in a fresh process (its own
JVM). Throughput is the backfill's own ``upload_seconds``: from the first segment task submitted
to the last commit, after the executors' Python workers are started — JVM start-up and planning
are reported apart (``seconds``). The tier goes to ``--tier-root`` (tmpfs by default: on a
shared virtual disk, fsync bandwidth — not the Spark job — would set the pace). Runs alternate
between the masters ``--repeat`` times; the speed-up compares the best run of each. Before each
round a control measures the parallelism the (shared) machine offers at that moment: two
CPU-bound processes against one (``control_speedup`` per round, 2.0 on two idle cores); read a
round's speed-up against its control. Prints one JSON document.

    .venv/bin/python bench/backfill_scaling.py [--mib 2048] [--segment-mib 64] [--repeat 4]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MiB = 1024 * 1024
TOPIC = "persistent://public/default/backfill-bench"
# (share of the history, entry size, ledger rollover MiB)
MIX = ((0.25, 1024, 7), (0.25, 4096, 9), (0.25, 700, 11), (0.25, 16_384, 13))

CONFIG = """
[metadata]
url = "embedded:{metadata}"
[source]
path = "{ledgers}"
rollover_bytes = {rollover}
rollover_entries = 100000000
[blobstore]
driver = "filesystem"
path = "{tier}"
[offload]
max_size_per_segment_mbytes = {seg_mib}
max_block_size_bytes = {block}
blocks_in_flight = 4
[metrics]
enabled = false
[daemon]
log_level = "WARNING"
"""


def offloadd(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    p = subprocess.run([sys.executable, "-m", "offloadd", *args], cwd=cwd,
                       capture_output=True, text=True, timeout=3600,
                       env={**os.environ, **(env or {})})
    if p.returncode != 0:
        raise SystemExit(f"offloadd {' '.join(args)} failed:\n{p.stderr[-4000:]}")
    return p.stdout


CONTROL = """
import hashlib, time
buf = bytes(range(256)) * (4 << 20)  # 1 GiB of hashing in 1 MiB steps: CPU only
t0 = time.perf_counter()
for _ in range(2):
    for i in range(0, len(buf), 1 << 20):
        hashlib.blake2b(buf[i:i + (1 << 20)]).digest()
print(time.perf_counter() - t0)
"""


def control_speedup() -> float:
    """How much faster two CPU-bound processes finish two units of work than one process
    finishes one, right now: the parallelism this shared machine actually offers (2.0 when
    both cores are free)."""
    def run(n: int) -> float:
        t0 = time.monotonic()
        procs = [subprocess.Popen([sys.executable, "-c", CONTROL], stdout=subprocess.DEVNULL)
                 for _ in range(n)]
        for p in procs:
            p.wait(timeout=600)
        return time.monotonic() - t0

    one = run(1)
    two = run(2)
    return round(2 * one / two, 2)


def write_config(path: Path, **fields: Any) -> Path:
    path.write_text(CONFIG.format(**fields))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mib", type=int, default=2048)
    ap.add_argument("--segment-mib", type=int, default=64)
    ap.add_argument("--block-mib", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--masters", default="local[1],local[2]")
    ap.add_argument("--tier-root", default="/dev/shm" if Path("/dev/shm").is_dir() else None,
                    help="where each run's filesystem tier goes (default: /dev/shm, so the "
                    "disk's fsync bandwidth is not what is measured)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="offloadd-backfill-bench-"))
    try:
        hist = work / "history"
        common = {"ledgers": hist / "ledgers", "seg_mib": args.segment_mib,
                  "block": args.block_mib * MiB}
        for share, entry, rollover in MIX:
            cfg = write_config(work / "produce.toml", metadata=hist / "metadata",
                               tier=work / "unused", rollover=rollover * MiB, **common)
            offloadd(["produce", "--json", "--config", str(cfg), "--topic", TOPIC, "--bytes",
                      str(int(args.mib * MiB * share)), "--entry-size", str(entry)], work)
        ledgers = len(list((hist / "ledgers").glob("*.off")))
        pristine = work / "pristine-metadata"
        shutil.copytree(hist / "metadata", pristine)

        runs: list[dict[str, Any]] = []
        masters = args.masters.split(",")
        controls: list[float] = []
        for i in range(args.repeat):
            controls.append(control_speedup())
            for j, master in enumerate(masters):
                run_dir = work / f"run-{i}-{j}"
                shutil.copytree(pristine, run_dir / "metadata")
                tier = Path(tempfile.mkdtemp(prefix="offloadd-bench-tier-",
                                             dir=args.tier_root))
                cfg = write_config(run_dir / "offloadd.toml", metadata=run_dir / "metadata",
                                   tier=tier, rollover=64 * MiB, **common)
                t0 = time.monotonic()
                out = offloadd(["backfill", "--json", "--config", str(cfg), "--topic", TOPIC,
                                "--master", master, "--spark-conf", "spark.ui.enabled=false"],
                               run_dir)
                rep = json.loads(out.strip().splitlines()[-1])
                runs.append({"master": master, "process_seconds": round(time.monotonic() - t0, 2),
                             **{k: rep[k] for k in ("new_segments",
                                                    "bytes", "upload_seconds", "task_seconds",
                                                    "seconds",
                                                    "throughput_mib_s", "size_lookups")}})
                shutil.rmtree(run_dir)
                shutil.rmtree(tier)
                print(json.dumps(runs[-1]), file=sys.stderr)
        best = {m: max(r["throughput_mib_s"] for r in runs if r["master"] == m) for m in masters}
        rounds = []
        for i, control in enumerate(controls):
            mine = runs[i * len(masters):(i + 1) * len(masters)]
            rounds.append({"control_speedup": control,
                           **{r["master"]: r["throughput_mib_s"] for r in mine},
                           "speedup": round(mine[-1]["throughput_mib_s"]
                                            / mine[0]["throughput_mib_s"], 2)})
        result = {
            "mib": args.mib, "ledgers": ledgers, "segment_mib": args.segment_mib,
            "block_mib": args.block_mib, "cpus": os.cpu_count(),
            "tier_root": args.tier_root or str(work), "load_before": os.getloadavg()[0],
            "runs": runs, "rounds": rounds,
            "best_mib_s": best,
            "speedup": round(best[masters[-1]] / best[masters[0]], 2) if len(masters) > 1
            else None,
        }
        print(json.dumps(result, indent=2))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
