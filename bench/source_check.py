"""The CPU cost of checking the embedded store's checksums on read (``[source] verify_crc``).

Writes ``--mib`` MiB of history per entry size with the embedded writer, then reads all of it
back the way the offloader does (runs of up to one 16 MiB block, into a recycled buffer),
alternating reads with and without the check, ``--repeats`` times each. User CPU seconds per GiB
of each kind (the median) and their difference are the check's cost, as ratios taken in one run;
the whole offload path's P1 figures, with and without the check, come from
``bench/offload_throughput.py``. Prints one JSON document.

    .venv/bin/python bench/source_check.py [--mib 256] [--repeats 7]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

from offloadd.ledger.local import LocalLedgerSource, LocalLedgerWriter, RolloverPolicy
from offloadd.metadata.memory import MemoryMetadataStore
from offloadd.model import TopicName

GiB = 1024**3
TOPIC = TopicName.parse("persistent://public/default/bench")
BLOCK = 16 * 1024 * 1024


def _user_s() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_utime


async def _read_all(source: LocalLedgerSource, buf: bytearray) -> int:
    total = 0
    for d in await source.ledgers(TOPIC):
        pos = 0
        while pos <= d.last_entry_id:
            run = await source.read(TOPIC, d.ledger_id, pos, d.last_entry_id, max_bytes=BLOCK,
                                    into=buf)
            total += len(run.data)
            pos = run.last_entry_id + 1
    return total


async def bench_one(entry_size: int, mib: int, repeats: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="offloadd-srccheck-") as d:
        path = Path(d)
        md = MemoryMetadataStore()
        writer = LocalLedgerWriter(path, md, RolloverPolicy(max_entries=10**9,
                                                            max_bytes=48 * 1024 * 1024))
        pool = os.urandom(8 * 1024 * 1024)
        n = mib * 1024 * 1024 // entry_size
        per = max(1, 256 * 1024 // entry_size)
        for i in range(0, n, per):
            await writer.append(TOPIC, [pool[(j * 8191) % (len(pool) - entry_size):][:entry_size]
                                        for j in range(i, min(n, i + per))])
        await writer.close()
        buf = bytearray(BLOCK + 1024 * 1024)
        per_gib: dict[bool, list[float]] = {False: [], True: []}
        nbytes = 0
        for _ in range(repeats):
            for verify in (False, True):
                source = LocalLedgerSource(path, md, verify_crc=verify)
                t0 = _user_s()
                nbytes = await _read_all(source, buf)
                per_gib[verify].append((_user_s() - t0) / (nbytes / GiB))
        without = statistics.median(per_gib[False])
        with_check = statistics.median(per_gib[True])
        return {
            "entry_size": entry_size,
            "bytes": nbytes,
            "read_user_s_per_gib_without_check": round(without, 3),
            "read_user_s_per_gib_with_check": round(with_check, 3),
            "check_user_s_per_gib": round(with_check - without, 3),
            "samples": {"without": [round(x, 3) for x in per_gib[False]],
                        "with": [round(x, 3) for x in per_gib[True]]},
        }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--sizes", default="1024,65536")
    args = ap.parse_args()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    results = [asyncio.run(bench_one(int(s), args.mib, args.repeats))
               for s in args.sizes.split(",")]
    print(json.dumps({"benchmark": "source_check", "started": started, "mib": args.mib,
                      "repeats": args.repeats, "results": results}, indent=2))


if __name__ == "__main__":
    main()
