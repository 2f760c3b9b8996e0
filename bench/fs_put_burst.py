"""A burst of small puts into the filesystem tier, as ``offload-now`` over thousands of topics
makes it: each segment is two objects (data, index), all published into the store's root.

``--objects`` puts of ``--bytes`` each (default 2,000 × 20 KB), all started at once (the store's
16 worker threads take them up), on a tier under ``--dir`` (default: a temporary directory on
the disk of the working directory, not tmpfs: fsyncs must reach a disk). Reports puts per
second, this process's CPU seconds per 1,000 puts (``utime + stime``, all threads), the
directory fsyncs made (counted by wrapping ``os.fsync`` for directory descriptors), and the
puts that failed (a deadline missed: before issue 22's fix, calls queued behind the burst
counted their deadline from the submit). ``--repeats`` bursts, each into a fresh directory.

Run it against another tree with ``PYTHONPATH=/path/to/tree`` (before vs after, side by side).

    .venv/bin/python bench/fs_put_burst.py [--objects 2000] [--bytes 20000] [--repeats 3]
        [--timeout 30] [--dir DIR]

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import offloadd
from offloadd.blobstore.filesystem import FilesystemBlobStore
from offloadd.errors import OffloaddError

_dir_fsyncs = 0
_real_fsync = os.fsync


def _counting_fsync(fd: int) -> None:
    global _dir_fsyncs
    if stat.S_ISDIR(os.fstat(fd).st_mode):
        _dir_fsyncs += 1
    _real_fsync(fd)


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def _burst(root: Path, objects: int, size: int, timeout: float) -> dict[str, Any]:
    global _dir_fsyncs
    store = FilesystemBlobStore(root, request_timeout_s=timeout)
    body = os.urandom(size)
    await store.put("warm-up", [body], {})  # the tree's directories exist
    _dir_fsyncs = 0
    cpu0, t0 = _cpu_s(), time.perf_counter()
    results = await asyncio.gather(
        *(store.put(f"obj-{i:06d}", [body], {"role": "data"}) for i in range(objects)),
        return_exceptions=True)
    wall, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
    failed = [r for r in results if isinstance(r, BaseException)]
    await store.close()
    return {"objects": objects, "bytes": size, "wall_s": round(wall, 3),
            "puts_per_s": round(objects / wall, 1),
            "cpu_s_per_1000_puts": round(cpu / objects * 1000, 3),
            "dir_fsyncs": _dir_fsyncs, "failed": len(failed),
            "failed_examples": [str(f)[:160] for f in failed[:2]],
            "failed_other": sum(not isinstance(f, OffloaddError) for f in failed)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--objects", type=int, default=2000)
    ap.add_argument("--bytes", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=30.0, help="request_timeout_s")
    ap.add_argument("--dir", type=Path, default=Path.cwd())
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    os.fsync = _counting_fsync
    tree = Path(offloadd.__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        commit = ""
    load_before = os.getloadavg()
    runs = []
    for _ in range(a.repeats):
        with tempfile.TemporaryDirectory(prefix="fs-put-burst-", dir=a.dir) as d:
            runs.append(asyncio.run(_burst(Path(d) / "tier", a.objects, a.bytes, a.timeout)))
    doc = {"benchmark": "fs_put_burst", "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                              time.gmtime()),
           "tree": str(tree), "commit": commit, "loadavg_before": load_before,
           "loadavg_after": os.getloadavg(),
           "args": {k: str(v) for k, v in vars(a).items()}, "runs": runs}
    text = json.dumps(doc, indent=2)
    if a.out:
        a.out.write_text(text + "\n")
    sys.stdout.write(text + "\n")


if __name__ == "__main__":
    main()
