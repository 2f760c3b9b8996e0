"""Parallel ranged reads vs one sequential stream of ranged reads, through the S3 driver, over a
store that serves byte ranges cheaply with a fixed latency added to every request.

The store: a small aiohttp server (this file, ``--serve``, run as a separate process so that it
does not share the reader's event loop or interpreter lock) that answers S3's ``HeadObject`` and
``GetObject`` with ``Range`` from files in a local directory (page cache), waiting ``--latency-ms``
before it answers each request, as a latency-injecting proxy in front of it would. moto is not
used: it copies the whole object on every ranged GET, so it would measure moto.

The object: one streaming data object (PIP-76) of ``--mib`` MiB built with the pipeline's own
builder (``--block-mib`` blocks, ``--entry-kib`` entries, per-block CRC32C stamped) and its index.
The reader: :class:`~offloadd.read.reader.TierReader` on :class:`~offloadd.blobstore.s3.S3BlobStore`
(aiobotocore over HTTP), reading the whole segment; every block is checked (header, index, CRC32C)
and every entry handed to a consumer that counts bytes. ``prefetch = 0`` is one request after
another (the sequential stream); ``prefetch = N`` keeps N blocks in flight ahead of the consumer.
For reference, one GET of the whole object (a single HTTP stream, no block checks) is timed too.

With ``--store rgw`` (Ceph's RADOS Gateway, ``tests/fixtures/rgw.py``, one BlueStore OSD on a
sparse file) or ``--store moto`` the object and its index are uploaded to that server instead
and read from it at its own latency (nothing added): a real server's ranged GETs, and moto's for
comparison.

Each mode runs ``--repeat`` times, interleaved; the best time counts. Prints one JSON document;
``ratio`` is sequential time over parallel time (goal >= 4 at 20 ms).

    .venv/bin/python bench/s3_read_parallel.py [--store range|rgw|moto] [--mib 256]
        [--block-mib 1] [--latency-ms 20] [--prefetch 4,8,16] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import email.utils
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MiB = 1024 * 1024
BUCKET = "bench"


# ---- the store: ranges from local files, after a fixed latency --------------------------------
def serve(directory: Path, port: int, latency_s: float) -> None:
    import uvloop
    from aiohttp import web

    async def handle(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(latency_s)
        key = request.match_info["key"]
        path = directory / key
        if request.match_info["bucket"] != BUCKET or "/" in key or not path.is_file():
            body = b"<Error><Code>NoSuchKey</Code><Message>no such key</Message></Error>"
            return web.Response(status=404, body=body, content_type="application/xml")
        st = path.stat()
        size = st.st_size
        headers = {
            "ETag": f'"{st.st_mtime_ns:032x}"',
            "Last-Modified": email.utils.formatdate(st.st_mtime, usegmt=True),
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        if request.method == "HEAD":
            headers["Content-Length"] = str(size)
            return web.Response(status=200, headers=headers)
        start, end, status = 0, size, 200
        rng = request.headers.get("Range")
        if rng:
            first, _, last = rng.removeprefix("bytes=").partition("-")
            start, end, status = int(first), min(int(last) + 1, size), 206
            if start >= size:
                return web.Response(status=416, body=b"<Error><Code>InvalidRange</Code></Error>",
                                    content_type="application/xml")
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        fd = os.open(path, os.O_RDONLY)
        try:
            data = os.pread(fd, end - start, start)  # page cache: cheap, as promised
        finally:
            os.close(fd)
        return web.Response(status=status, body=data, headers=headers)

    async def main() -> None:
        app = web.Application()
        app.router.add_route("*", "/{bucket}/{key}", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    uvloop.run(main())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_server(directory: Path, latency_ms: float) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(directory), "--port",
                             str(port), "--latency-ms", str(latency_ms)])
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{url}/{BUCKET}/none", timeout=1)
        except urllib.error.HTTPError:
            return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("range server did not start")


# ---- the object -------------------------------------------------------------------------------
def build_object(directory: Path, mib: int, block_mib: float, entry_kib: int
                 ) -> tuple[uuid.UUID, int, int]:
    """Write ``<uuid>`` and ``<uuid>-index``; returns (uid, ledger id, entry count)."""
    from offloadd.format import StreamingObjectBuilder
    from offloadd.format.block import frame_entries
    from offloadd.format.checksum import stamp_blocks
    from offloadd.model import EntryRun

    uid, ledger_id = uuid.uuid4(), 7
    entry = entry_kib * 1024
    count = mib * MiB // entry
    payload = os.urandom(entry)
    data, offsets = frame_entries(0, [payload] * count)
    block = int(block_mib * MiB)
    builder = StreamingObjectBuilder(max_block_size=block, min_block_size=0)
    blocks = stamp_blocks(builder.add_run(EntryRun(ledger_id, 0, memoryview(data), offsets)))
    with open(directory / str(uid), "wb") as fh:
        for p in blocks:
            for b in p.buffers:
                fh.write(b)
    (directory / f"{uid}-index").write_bytes(builder.finish({ledger_id: 0}))
    return uid, ledger_id, count


# ---- the reads --------------------------------------------------------------------------------
@contextmanager
def s3_server(kind: str, directory: Path, uid: uuid.UUID) -> Iterator[str]:
    """moto or RGW, started here, holding the object and its index."""
    import boto3  # type: ignore[import-untyped]

    if kind == "rgw":
        from tests.fixtures.rgw import running_rgw

        ctx: Any = running_rgw(store="bluestore")
    else:
        from bench.s3_upload import moto

        ctx = moto()
    with ctx as started:
        url = started if isinstance(started, str) else started.endpoint
        s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
        s3.create_bucket(Bucket=BUCKET)
        for name in (str(uid), f"{uid}-index"):
            s3.upload_file(str(directory / name), BUCKET, name)
        yield url


async def measure(url: str, uid: uuid.UUID, ledger_id: int, count: int, prefetches: list[int],
                  repeat: int) -> dict[str, Any]:
    from offloadd.blobstore.s3 import S3BlobStore, S3Options
    from offloadd.metadata.memory import MemoryMetadataStore
    from offloadd.model.catalog import LedgerRange, Segment, SegmentKind
    from offloadd.read.reader import TierReader

    store = await S3BlobStore.open(S3Options(
        bucket=BUCKET, endpoint=url, access_key_id="testing", secret_access_key="testing",
        max_pool_connections=64))
    md = MemoryMetadataStore()
    seg = Segment(uid, SegmentKind.STREAMING, (LedgerRange(ledger_id, 0, count - 1),), True)
    size = (await store.head(str(uid))).size

    async def read(prefetch: int) -> float:
        reader = TierReader(md, store, prefetch=prefetch)
        t0 = time.perf_counter()
        n = nbytes = 0
        async for e in reader.read_segment(seg):
            n += 1
            nbytes += len(e.payload)
        dt = time.perf_counter() - t0
        assert n == count, (n, count)
        return dt

    async def whole() -> float:
        t0 = time.perf_counter()
        data = await store.get_range(str(uid), 0, size)
        dt = time.perf_counter() - t0
        assert len(data) == size
        return dt

    try:
        await read(4)  # warm: connections, page cache, imports
        best: dict[str, float] = {}
        for _ in range(repeat):
            runs: list[tuple[str, Awaitable[float]]] = [("sequential", read(0))]
            runs += [(f"prefetch_{p}", read(p)) for p in prefetches]
            runs.append(("one_get_whole_object", whole()))
            for name, job in runs:  # coroutines: each starts only when awaited, in turn
                dt = await job
                best[name] = min(best.get(name, float("inf")), dt)
    finally:
        await store.close()
    mib = size / MiB
    seq = best["sequential"]
    return {
        "seconds": {k: round(v, 3) for k, v in best.items()},
        "mib_per_s": {k: round(mib / v, 1) for k, v in best.items()},
        "ratio_vs_sequential": {f"prefetch_{p}": round(seq / best[f"prefetch_{p}"], 2)
                                for p in prefetches},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--block-mib", type=float, default=1.0)
    ap.add_argument("--entry-kib", type=int, default=4)
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--prefetch", default="4,8,16")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--store", choices=["range", "rgw", "moto"], default="range")
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(Path(args.serve), args.port, args.latency_ms / 1000)
        return
    import uvloop

    prefetches = [int(p) for p in args.prefetch.split(",")]
    with tempfile.TemporaryDirectory(prefix="offloadd-bench-") as d:
        directory = Path(d)
        uid, ledger_id, count = build_object(directory, args.mib, args.block_mib, args.entry_kib)
        if args.store != "range":
            with s3_server(args.store, directory, uid) as url:
                res = uvloop.run(measure(url, uid, ledger_id, count, prefetches, args.repeat))
        else:
            proc, url = start_server(directory, args.latency_ms)
            try:
                res = uvloop.run(measure(url, uid, ledger_id, count, prefetches, args.repeat))
            finally:
                proc.terminate()
                proc.wait(10)
    stores = {"range": f"aiohttp range server on loopback (local files, page cache) answering "
                       f"each request after {args.latency_ms:g} ms",
              "rgw": "Ceph RADOS Gateway 16.2 (beast, one BlueStore OSD on a sparse file) on "
                     "loopback, nothing added",
              "moto": "moto_server on loopback, nothing added"}
    print(json.dumps({
        "benchmark": "s3_read_parallel",
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus, Python "
                   f"{platform.python_version()}",
        "store": f"{stores[args.store]}; reader: TierReader on S3BlobStore",
        "loadavg": os.getloadavg(),
        "object_mib": args.mib, "block_mib": args.block_mib, "entry_kib": args.entry_kib,
        "entries": count, "goal_ratio": 4.0, **res,
    }, indent=2))


if __name__ == "__main__":
    main()
