"""The source check's one CRC32C pass, alone: over a whole run read first (the pass then reads
it from memory) against a piece at a time right after each piece's read (``read_summed``,
cache-hot), and the read alone beside them (issue 22, "one pass per byte").

Reads ``--mib`` MiB of files in the page cache in runs of ``--run-mib`` into one reused
anonymous mapping (a warm pool array), alternating the three ways ``--repeats`` times; the
reading thread's own CPU time per GiB (``time.thread_time``: exact, user and system together;
and its user time, sampled at each tick), medians and least. Prints one JSON document.

    .venv/bin/python bench/read_summed.py [--mib 512] [--run-mib 64] [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from offloadd.ledger.local.check import PIECE, read_summed
from offloadd.ledger.local.files import pread_into
from offloadd.ledger.local.records import CHUNK, chunk_crcs

GiB = 1024**3


def whole_then_sum(fd: int, buf: mmap.mmap, n: int, offset: int, path: Path) -> None:
    """The check before: the run read in one call, then its chunks' CRC32Cs."""
    view = pread_into(fd, buf, n, offset, path)
    chunk_crcs(b"", view, b"", CHUNK)


def summed(fd: int, buf: mmap.mmap, n: int, offset: int, path: Path) -> None:
    read_summed(fd, buf, n, offset, path)


def read_only(fd: int, buf: mmap.mmap, n: int, offset: int, path: Path) -> None:
    pread_into(fd, buf, n, offset, path)


Way = Callable[[int, mmap.mmap, int, int, Path], None]


def measure(way: Way, files: list[Path], buf: mmap.mmap, run: int) -> tuple[float, float]:
    """(thread CPU s, thread user s) for reading every file in runs."""
    t0, r0 = time.thread_time(), resource.getrusage(resource.RUSAGE_THREAD)
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            for offset in range(0, size, run):
                way(fd, buf, min(run, size - offset), offset, path)
        finally:
            os.close(fd)
    t1, r1 = time.thread_time(), resource.getrusage(resource.RUSAGE_THREAD)
    return t1 - t0, r1.ru_utime - r0.ru_utime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--run-mib", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    run = args.run_mib * 2**20
    ways: dict[str, Way] = {"whole_then_sum": whole_then_sum, "read_summed": summed,
                            "read_only": read_only}
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="offloadd-read-summed-") as d:
        files: list[Path] = []
        left = args.mib * 2**20
        while left > 0:  # odd sizes: runs start on and off chunk boundaries
            size = min(left, 48 * 2**20 + 12345)
            path = Path(d) / f"{len(files)}.log"
            path.write_bytes(os.urandom(size))
            files.append(path)
            left -= size
        gib = args.mib * 2**20 / GiB
        buf = mmap.mmap(-1, run)
        measure(read_only, files, buf, run)  # the page cache and the mapping warm
        samples: dict[str, list[tuple[float, float]]] = {k: [] for k in ways}
        for _ in range(args.repeats):
            for name, way in ways.items():
                samples[name].append(measure(way, files, buf, run))
    out = {}
    for name, runs in samples.items():
        cpu = [c / gib for c, _ in runs]
        user = [u / gib for _, u in runs]
        out[name] = {"cpu_s_per_gib_median": round(statistics.median(cpu), 4),
                     "cpu_s_per_gib_min": round(min(cpu), 4),
                     "user_s_per_gib_median": round(statistics.median(user), 4),
                     "cpu_s_per_gib": [round(c, 4) for c in cpu]}
    read = out["read_only"]["cpu_s_per_gib_median"]
    for name in ("whole_then_sum", "read_summed"):
        out[name]["crc_cpu_s_per_gib_median"] = round(
            out[name]["cpu_s_per_gib_median"] - read, 4)
    print(json.dumps({"benchmark": "read_summed", "started": started, "mib": args.mib,
                      "run_mib": args.run_mib, "piece_bytes": PIECE, "repeats": args.repeats,
                      "load_average": os.getloadavg(), "results": out}, indent=2))


if __name__ == "__main__":
    main()
