"""Reading entries from bookies: MiB/s and CPU-s/GiB of the BookKeeper source's read path,
beside a raw socket read of the same bytes.

For each entry size (1 KiB, 64 KiB): ``--bookies`` fake bookies (3 by default) run in their own
processes (``tests/fixtures/fake_bookie.py --generate --stripe``) holding ``--mib`` MiB of one
closed CRC32C ledger striped as BookKeeper stripes it: an ensemble of all of them, write quorum
``--wq`` (2), so each entry is on two bookies and every read chooses between them. This process
reads the whole ledger the way the offloader does — the source's pipelined read stream
(``reads_in_flight`` entries in flight, read-ahead) in block-sized runs, each entry's digest
checked, framed into a recycled buffer as an ``EntryRun`` — and reports wall time and its own
CPU seconds (user + system, ``time.process_time``), and the bookies quarantined on the way (a
healthy cluster quarantines none). Then the live tail's read pattern: ``--tail`` single-entry
reads one after another (what the source sends to learn an open ledger's newest confirmed entry,
and what a reader following a slow topic sends), counting the reads that waited a whole read
timeout (``stalls``): on a write-quorum-2 ledger a single entry has two equally good bookies.
Beside the bulk read, a plain blocking socket reads the very bytes the bookies send for those
reads (every response frame, pre-encoded by a server process) with ``recv_into``: the floor for
moving them through the kernel in Python. The source reuses private pieces of
``offloadd.ledger.bookkeeper.source`` (the read stream and the framing) so that no ZooKeeper is
needed. Prints one JSON document.

    .venv/bin/python bench/bookkeeper_read.py [--mib 128] [--block-mib 16] [--in-flight 256]
        [--bookies 3] [--wq 2] [--read-timeout 10] [--tail 200] [--tail-timeout 1]
"""

from __future__ import annotations

import argparse
import json
import socket
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
from offloadd.ledger.bookkeeper.source import _frame_run, _ReadStream  # noqa: E402

GiB = 1024**3
MiB = 1024**2
LEDGER = 7

RAW_SERVER = """
import socket, sys
sys.path.insert(0, {root!r})
from offloadd.ledger.bookkeeper import codec
from offloadd.ledger.bookkeeper.codec import ReadResponse
from tests.fixtures.fake_bookie import FakeBookie, generate
b = FakeBookie()
generate(b, {ledger}, {n}, {size})
parts = []
for e in range({n}):
    parts += codec.read_response_parts(ReadResponse(e + 1, 0, 0, {ledger}, e,
                                                    b.entries[{ledger}][e], {n} - 1))
stream = b"".join(parts)
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
print("ready", srv.getsockname()[1], len(stream), flush=True)
conn, _ = srv.accept()
conn.sendall(stream)
conn.close()
"""


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

    def note(self, entry: codec.Entry) -> None:
        pass

    async def refresh(self) -> bool:
        return False


def _start_bookie(n: int, size: int, stripe: str) -> tuple[subprocess.Popen[str], str]:
    p = subprocess.Popen([sys.executable, "-m", "tests.fixtures.fake_bookie", "--generate",
                          f"{LEDGER}:{n}:{size}", "--stripe", stripe], cwd=ROOT,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    line = p.stdout.readline().split()
    if not line or line[0] != "ready":
        p.kill()
        raise SystemExit("fake bookie did not start")
    return p, line[1]


async def _tail(addrs: list[str], wq: int, n: int, size: int, reads: int,
                read_timeout: float) -> dict[str, Any]:
    meta = LedgerMetadata(LEDGER, len(addrs), wq, wq, LedgerStateBK.CLOSED, n - 1, n * size, 3,
                          None, 0, ((0, tuple(addrs)),))
    client = BookieClient(ClientOptions(read_timeout_s=read_timeout))
    led = _Ledger(meta)
    for addr in addrs:
        await client._connection(addr)
    stalls = 0
    t0 = time.perf_counter()
    for e in range(min(reads, n)):
        r0 = time.perf_counter()
        entries, _ = await client.read_entries(led, e, e)
        assert len(entries) == 1
        if time.perf_counter() - r0 >= 0.9 * read_timeout:
            stalls += 1
    wall = time.perf_counter() - t0
    await client.close()
    done = min(reads, n)
    return {"reads": done, "seconds": wall, "reads_per_s": done / wall, "stalls": stalls,
            "read_timeout_s": read_timeout}


async def _read_all(addrs: list[str], wq: int, n: int, size: int, block: int, in_flight: int,
                    read_timeout: float) -> dict[str, Any]:
    meta = LedgerMetadata(LEDGER, len(addrs), wq, wq, LedgerStateBK.CLOSED, n - 1, n * size, 3,
                          None, 0, ((0, tuple(addrs)),))
    client = BookieClient(ClientOptions(read_timeout_s=read_timeout))
    led = _Ledger(meta)
    stream = _ReadStream(client, led, in_flight, 8 * MiB)  # type: ignore[arg-type]
    for addr in addrs:  # connect before the clock starts (no read: reads are what is timed)
        await client._connection(addr)
    cpu0, t0 = time.process_time(), time.perf_counter()
    pos = payload = frames = 0
    into = bytearray(block)  # the offloader leases recycled buffers the same way
    while pos < n:
        entries = await stream.take(pos, n - 1, block)
        run = _frame_run(LEDGER, pos, entries, into)
        payload += run.payload_bytes
        frames += len(run.data)
        pos = run.last_entry_id + 1
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    quarantines = sum(client.metrics.quarantines.values()) \
        if hasattr(client.metrics, "quarantines") else None
    await client.close()
    assert payload == n * size
    return {"seconds": wall, "mib_s": payload / MiB / wall, "cpu_s_per_gib": cpu / (payload / GiB),
            "entries": n, "quarantines": quarantines,
            "timeouts": sum(v for (_, r), v in client.metrics.errors.items() if r == "timeout")}


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
    return {"seconds": wall, "mib_s": payload / MiB / wall, "cpu_s_per_gib": cpu / (payload / GiB),
            "wire_bytes": got}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=128)
    ap.add_argument("--block-mib", type=int, default=16)
    ap.add_argument("--in-flight", type=int, default=256)
    ap.add_argument("--bookies", type=int, default=3, help="ensemble size (one process each)")
    ap.add_argument("--wq", type=int, default=2, help="write quorum")
    ap.add_argument("--read-timeout", type=float, default=10.0,
                    help="per-read timeout (s); offloadd's default")
    ap.add_argument("--sizes", default="1024,65536", help="entry sizes, comma-separated")
    ap.add_argument("--tail", type=int, default=200, help="single-entry reads after the bulk")
    ap.add_argument("--tail-timeout", type=float, default=1.0,
                    help="read timeout (s) of the single-entry reads")
    args = ap.parse_args()
    import uvloop

    results = []
    for size in (int(x) for x in args.sizes.split(",")):
        n = args.mib * MiB // size
        bookies = [_start_bookie(n, size, f"{i}:{args.bookies}:{args.wq}")
                   for i in range(args.bookies)]
        try:
            ours = uvloop.run(_read_all([a for _, a in bookies], args.wq, n, size,
                                        args.block_mib * MiB, args.in_flight,
                                        args.read_timeout))
            tail = uvloop.run(_tail([a for _, a in bookies], args.wq, n, size, args.tail,
                                    args.tail_timeout)) if args.tail else None
        finally:
            for proc, _ in bookies:
                proc.kill()
                proc.wait()
        raw = _raw(n, size)
        results.append({"entry_bytes": size, "mib": args.mib, "source": ours, "raw_socket": raw,
                        "single_entry_reads": tail,
                        "mib_s_ratio": ours["mib_s"] / raw["mib_s"],
                        "cpu_ratio": ours["cpu_s_per_gib"] / raw["cpu_s_per_gib"]})
    print(json.dumps({"benchmark": "bookkeeper_read", "in_flight": args.in_flight,
                      "block_mib": args.block_mib, "bookies": args.bookies, "wq": args.wq,
                      "read_timeout_s": args.read_timeout, "results": results}, indent=2))


if __name__ == "__main__":
    main()
