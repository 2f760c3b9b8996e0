"""Reading entries from bookies: MiB/s, CPU-s/GiB and µs per entry of the BookKeeper source's
read path, against three fake bookies that are not the bottleneck.

For each entry size (1 KiB, 64 KiB) and each added latency (0.2 ms, 2 ms): three bookies
(``bench/bookie_server.py``), each in its own process, hold ``--mib`` MiB of one closed CRC32C
ledger striped as BookKeeper stripes it over an ensemble of 3 with write quorum 2 (entry ``e``
on positions ``e``, ``e + 1`` mod 3), serving answers encoded before they start and answering
``--latency`` ms after each read of their socket (``--layouts 2:2`` adds Pulsar's default
layout, two bookies holding every entry, where batched reads have runs to batch). This process
reads the whole ledger the way the offloader does — the source's pipelined read stream
(``reads_in_flight`` entries in flight, 8 MiB read-ahead), every entry's digest checked, runs of
``--block-mib`` framed into one recycled buffer — in three modes, alternating, ``--repeats``
times each after one warm-up read of each (not counted):

- ``v2``: protocol v2, one request per entry (any bookie);
- ``v2_batch``: v2 with batched reads (BookKeeper 4.17+): one request per run of consecutive
  entries a bookie holds (two on this striped ledger);
- ``v3``: protocol v3 (protobuf) for everything, what offloadd spoke before.

CPU is this process's own (``time.process_time``: user + system; the bookies are other
processes), pinned with the bookies to separate cores when there are two (``--no-pin`` not to):
"on one core". ``cpu_share`` is that CPU over wall time: near 1 the read was CPU-bound, below it
the reader waited (for the bookies, or for a core shared with other work), so on a shared
machine CPU-s/GiB is the robust figure and MiB/s is not. ``bookies_cpu_s_per_gib``: the three
fake bookies' CPU over the same read (from ``/proc``; a little more than the timed part: the
first few entries read before the clock starts are in it). Also: the raw socket floor (a
blocking ``recv_into`` of the very v2 answer bytes) and 200 single-entry reads one after another
(the live tail's pattern: none may wait a whole read timeout, issue 13). Medians of the
repeats; one JSON document; the machine's load average before and after.

    .venv/bin/python bench/bookkeeper_read.py [--mib 128 | --mib 256,1024] [--repeats 3]
        [--sizes 1024,65536] [--latencies 0.2,2] [--modes v2,v2_batch,v3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from offloadd.ledger.bookkeeper import codec  # noqa: E402
from offloadd.ledger.bookkeeper.client import BookieClient, ClientOptions  # noqa: E402
from offloadd.ledger.bookkeeper.layout import LedgerMetadata, LedgerStateBK  # noqa: E402
from offloadd.ledger.bookkeeper.source import BookKeeperOptions  # noqa: E402
from offloadd.ledger.bookkeeper.stream import ReadStream, frame_run  # noqa: E402

GiB = 1024**3
MiB = 1024**2
LEDGER = 7
MODES = {"v2": dict(batch_reads=False), "v2_batch": dict(batch_reads=True),
         "v3": dict(protocol="v3")}


class _Ledger:
    """What the read stream needs of the source's ledger state: a closed ledger."""

    def __init__(self, meta: LedgerMetadata) -> None:
        self.ledger_id = meta.ledger_id
        self.meta = meta
        self.digest = codec.digest_for(meta.digest_type, b"")
        self.known = (meta.last_entry_id, meta.length)
        self.readable_last = self.lac = meta.last_entry_id

    def learn(self, lac: int) -> None:
        pass

    def note(self, entry_id: int, lac: int, length: int) -> None:
        pass

    async def refresh(self) -> bool:
        return False


def _proc_cpu(pids: list[int]) -> float:
    """User + system CPU seconds the processes ``pids`` have used (Linux ``/proc``)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of stat)
    return total / os.sysconf("SC_CLK_TCK")


def _cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def _start_bookies(n: int, size: int, latency_ms: float, pin: int | None,
                   ensemble: int = 3, wq: int = 2) -> list[tuple[subprocess.Popen[str], str]]:
    procs = []
    for pos in range(ensemble):
        cmd = [sys.executable, str(ROOT / "bench" / "bookie_server.py"), "--ledger",
               str(LEDGER), "--entries", str(n), "--size", str(size), "--stripe",
               f"{pos}:{ensemble}:{wq}", "--latency-ms", str(latency_ms)]
        if pin is not None:
            cmd += ["--cpu", str(pin)]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True))
    out = []
    for p in procs:
        assert p.stdout is not None
        line = p.stdout.readline().split()
        if not line or line[0] != "ready":
            for q in procs:
                q.kill()
            raise SystemExit("bookie server did not start")
        out.append((p, line[1]))
    return out


def _meta(addrs: list[str], n: int, size: int, wq: int = 2) -> LedgerMetadata:
    return LedgerMetadata(LEDGER, len(addrs), wq, wq, LedgerStateBK.CLOSED, n - 1, n * size, 3,
                          None, 0, ((0, tuple(addrs)),))


async def _read_all(addrs: list[str], n: int, size: int, block: int, mode: str,
                    window: int, wq: int) -> dict[str, Any]:
    client = BookieClient(ClientOptions(**MODES[mode]))  # type: ignore[arg-type]
    led = _Ledger(_meta(addrs, n, size, wq))
    # connections open and batched-read support known before the clock starts
    await client.read_entries(led, 0, 5)
    # (a striped ledger's runs of two never probe: nothing to wait for then)
    for addr in addrs:
        while mode == "v2_batch" and wq >= len(addrs) and client.protocol(addr).batch is None:
            await asyncio.sleep(0.01)
    stream = ReadStream(client, led, window, 8 * MiB)
    cpu0, t0 = time.process_time(), time.perf_counter()
    pos = payload = 0
    into = bytearray(block)  # the offloader leases recycled buffers the same way
    while pos < n:
        payloads = await stream.take(pos, n - 1, block)
        run = frame_run(LEDGER, pos, payloads, into)
        payload += run.payload_bytes
        pos = run.last_entry_id + 1
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    errors = sum(client.metrics.errors.values())
    status = client.status()
    await client.close()
    assert payload == n * size
    return {"seconds": wall, "mib_s": payload / MiB / wall, "cpu_s_per_gib": cpu / (payload / GiB),
            "us_per_entry": cpu / n * 1e6, "cpu_share": cpu / wall, "errors": errors,
            "bookies": sorted({f"{v['reads']} batched={v['batched_reads']}"
                               for v in status.values()})}


async def _tail(addrs: list[str], n: int, size: int, reads: int, wq: int) -> dict[str, Any]:
    client = BookieClient(ClientOptions(read_timeout_s=1.0))
    led = _Ledger(_meta(addrs, n, size, wq))
    stalls = 0
    t0 = time.perf_counter()
    for e in range(min(reads, n)):
        r0 = time.perf_counter()
        got = await client.read_entries(led, e, e)
        assert len(got.payloads) == 1
        if time.perf_counter() - r0 >= 0.9:
            stalls += 1
    wall = time.perf_counter() - t0
    await client.close()
    return {"reads": min(reads, n), "reads_per_s": min(reads, n) / wall, "stalls": stalls}


RAW_SERVER = """
import socket, sys
sys.path.insert(0, {root!r})
from bench.bookie_server import Ledger
led = Ledger({ledger}, {n}, {size}, None)
stream = b"".join(led.v2_answer({ledger}, e) for e in range({n}))
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
print("ready", srv.getsockname()[1], len(stream), flush=True)
conn, _ = srv.accept()
conn.sendall(stream)
conn.close()
"""


def _raw(n: int, size: int) -> dict[str, Any]:
    code = RAW_SERVER.format(root=str(ROOT), ledger=LEDGER, n=n, size=size)
    p = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout is not None
    _, port, total = p.stdout.readline().split()
    buf = bytearray(4 * MiB)
    view = memoryview(buf)
    got = 0
    with socket.create_connection(("127.0.0.1", int(port))) as s:
        cpu0, t0 = time.process_time(), time.perf_counter()
        while True:
            k = s.recv_into(view)
            if not k:
                break
            got += k
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    p.wait(timeout=60)
    assert got == int(total)
    payload = n * size
    return {"mib_s": payload / MiB / wall, "cpu_s_per_gib": cpu / (payload / GiB)}


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {k: statistics.median(r[k] for r in runs)
                           for k in ("seconds", "mib_s", "cpu_s_per_gib", "us_per_entry",
                                     "cpu_share", "bookies_cpu_s_per_gib")}
    out["runs"] = [{k: round(r[k], 3) for k in ("mib_s", "cpu_s_per_gib", "cpu_share",
                                                 "bookies_cpu_s_per_gib")} for r in runs]
    out["errors"] = sum(r["errors"] for r in runs)
    out["bookies"] = runs[-1]["bookies"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", default="128",
                    help="MiB of ledger per entry size: one figure, or one per --sizes entry")
    ap.add_argument("--block-mib", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sizes", default="1024,65536")
    ap.add_argument("--latencies", default="0.2,2", help="added bookie latency, ms")
    ap.add_argument("--modes", default="v2,v2_batch,v3")
    ap.add_argument("--layouts", default="3:2",
                    help="ENSEMBLE:WRITE_QUORUM, comma-separated (one bookie per position)")
    ap.add_argument("--window", type=int, default=BookKeeperOptions("").reads_in_flight,
                    help="entry reads in flight (the source's reads_in_flight)")
    ap.add_argument("--tail", type=int, default=200)
    ap.add_argument("--no-pin", action="store_true")
    args = ap.parse_args()
    import uvloop

    cpus = _cpus()
    pin = not args.no_pin and len(cpus) >= 2
    if pin:
        os.sched_setaffinity(0, {cpus[0]})
    load0 = os.getloadavg()
    modes = args.modes.split(",")
    results = []
    sizes = [int(x) for x in args.sizes.split(",")]
    mibs = [int(x) for x in args.mib.split(",")]
    if len(mibs) == 1:
        mibs *= len(sizes)
    if len(mibs) != len(sizes):
        raise SystemExit(f"--mib {args.mib}: give one figure, or one per size ({args.sizes})")
    for size, mib in zip(sizes, mibs, strict=True):
        n = mib * MiB // size
        raw = _raw(n, size)
        for layout in args.layouts.split(","):
            ens, wq = (int(x) for x in layout.split(":"))
            for latency in (float(x) for x in args.latencies.split(",")):
                bookies = _start_bookies(n, size, latency, cpus[1] if pin else None, ens, wq)
                addrs = [a for _, a in bookies]
                try:
                    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
                    for k in range(args.repeats + 1):
                        for m in modes:  # alternating, so that load changes hit every mode
                            b0 = _proc_cpu([p.pid for p, _ in bookies])
                            got = uvloop.run(_read_all(addrs, n, size, args.block_mib * MiB, m,
                                                       args.window, wq))
                            # the bookies' CPU for the whole read, warm-up reads included
                            got["bookies_cpu_s_per_gib"] = \
                                (_proc_cpu([p.pid for p, _ in bookies]) - b0) / (n * size / GiB)
                            if k:  # the first of each is a warm-up
                                runs[m].append(got)
                    tail = uvloop.run(_tail(addrs, n, size, args.tail, wq)) \
                        if args.tail else None
                finally:
                    for proc, _ in bookies:
                        proc.kill()
                        proc.wait()
                results.append({"entry_bytes": size, "ensemble": ens, "wq": wq,
                                "latency_ms": latency, "mib": mib,
                                "modes": {m: _median(r) for m, r in runs.items()},
                                "single_entry_reads": tail, "raw_socket": raw})
    print(json.dumps({"benchmark": "bookkeeper_read", "window": args.window,
                      "block_mib": args.block_mib, "repeats": args.repeats, "pinned": pin,
                      "loadavg_before": load0, "loadavg_after": os.getloadavg(),
                      "results": results}, indent=2))


if __name__ == "__main__":
    main()
