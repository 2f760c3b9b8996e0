"""What one idle topic holds on the daemon's heap, by type and by allocation site (issue 22).

For ``--topics N`` (default 1,000) and a tenth of it, each in a child process of its own: the
history (``--entries`` 1 KiB entries per topic, written by ``bench/topic_scaling.py``'s writer,
another process, as ``offloadd produce`` would), then ``offloadd run``'s runtime in-process
under ``tracemalloc`` on the embedded store and filesystem tier, until every topic has read its
history (an open segment each, waiting for news), ``--settle`` seconds, a collection. The
difference between the two runs over the difference in topics is what an idle topic with an
open segment costs: traced heap bytes, live objects by type (``sys.getsizeof``) and the top
allocation sites. Prints one JSON document (also written to ``--out``).

    .venv/bin/python bench/topic_memory.py [--topics 1000] [--out bench/results/topic_memory.json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def by_type() -> tuple[Counter[str], Counter[str]]:
    counts: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    for o in gc.get_objects():
        name = type(o).__qualname__
        counts[name] += 1
        sizes[name] += sys.getsizeof(o)
    return counts, sizes


async def measure(topics: int, entries: int, settle: float, snap: Path) -> dict[str, Any]:
    import topic_scaling as ts

    from offloadd import config
    from offloadd.shell.runtime import Runtime

    work = Path(tempfile.mkdtemp(prefix="topic-memory-"))
    cfg = work / "offloadd.toml"
    cfg.write_text(ts.config_text(work, ts.embedded(work), ts.free_port(), None, None))
    ends, _ = ts.write(cfg, topics, entries, 1024, 600)
    settings = config.load(cfg)
    tracemalloc.start(8)
    rt = await Runtime.open(settings)
    running = asyncio.create_task(rt.daemon.run(install_signals=False))
    try:
        deadline = time.monotonic() + 600
        while True:
            pos = {str(t): str(r.offloader.position) for t, r in rt.daemon.topics.items()}
            if all(pos.get(t) == e for t, e in ends.items()):
                break
            if time.monotonic() > deadline or running.done():
                raise RuntimeError("the daemon did not read every topic's history")
            await asyncio.sleep(0.5)
        await asyncio.sleep(settle)
        gc.collect()
        traced, _ = tracemalloc.get_traced_memory()
        tracemalloc.take_snapshot().dump(str(snap))
        counts, sizes = by_type()
        return {"topics": topics, "traced": traced, "counts": dict(counts),
                "sizes": dict(sizes)}
    finally:
        rt.daemon.request_stop()
        await asyncio.gather(running, return_exceptions=True)
        await rt.close()


def child(a: argparse.Namespace) -> None:
    out = asyncio.run(measure(a.topics, a.entries, a.settle, Path(a.snapshot)))
    Path(a.result).write_text(json.dumps(out))


def run_child(topics: int, a: argparse.Namespace, tmp: Path) -> tuple[dict[str, Any], Path]:
    snap, result = tmp / f"{topics}.snap", tmp / f"{topics}.json"
    subprocess.run([sys.executable, __file__, "child", "--topics", str(topics), "--entries",
                    str(a.entries), "--settle", str(a.settle), "--snapshot", str(snap),
                    "--result", str(result)], check=True, timeout=1800)
    return json.loads(result.read_text()), snap


def main() -> None:
    if sys.argv[1:2] == ["child"]:
        cp = argparse.ArgumentParser(prog="topic_memory.py child")
        for name in ("--topics", "--entries"):
            cp.add_argument(name, type=int, required=True)
        cp.add_argument("--settle", type=float, required=True)
        cp.add_argument("--snapshot", required=True)
        cp.add_argument("--result", required=True)
        child(cp.parse_args(sys.argv[2:]))
        return
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topics", type=int, default=1000)
    ap.add_argument("--entries", type=int, default=2)
    ap.add_argument("--settle", type=float, default=3.0)
    ap.add_argument("--top", type=int, default=15, help="types and allocation sites shown")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        small, small_snap = run_child(max(1, a.topics // 10), a, tmp)
        big, big_snap = run_child(a.topics, a, tmp)
        n = big["topics"] - small["topics"]
        sites = tracemalloc.Snapshot.load(str(big_snap)).compare_to(
            tracemalloc.Snapshot.load(str(small_snap)), "lineno")
    types = sorted(((name, (size - small["sizes"].get(name, 0)) / n,
                     (big["counts"][name] - small["counts"].get(name, 0)) / n)
                    for name, size in big["sizes"].items()), key=lambda r: -r[1])
    doc = {
        "benchmark": "topic_memory",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "loadavg_before": load,
        "topics": [small["topics"], big["topics"]],
        "heap_bytes_per_topic": round((big["traced"] - small["traced"]) / n),
        "by_type": [{"type": t, "bytes_per_topic": round(b), "objects_per_topic": round(c, 2)}
                    for t, b, c in types[:a.top]],
        "by_site": [{"site": str(s.traceback[0]), "bytes_per_topic": round(s.size_diff / n),
                     "blocks_per_topic": round(s.count_diff / n, 2)} for s in sites[:a.top]],
        "loadavg_after": os.getloadavg(),
    }
    text = json.dumps(doc, indent=1)
    print(text)
    if a.out is not None:
        a.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
