"""Upload throughput of offloadd's S3 path vs a plain aiobotocore multipart upload of the same
bytes at the same concurrency, against moto_server or Ceph's RADOS Gateway on loopback.

The bytes: one streaming data object (PIP-76) of ``--mib`` MiB built by the pipeline's builder
(``--block-mib`` blocks, per-block CRC32C stamped), so both sides send identical parts.

``offloadd``
    :class:`~offloadd.offload.upload.SegmentUpload` (the pipeline's uploader: ``--in-flight``
    parts at once, a running CRC32C of the object) on :class:`~offloadd.blobstore.s3.S3BlobStore`
    (CRC32C header per part, retries, store-health bookkeeping), then ``complete()``.
``plain``
    aiobotocore as a user would write it: ``create_multipart_upload``, ``upload_part`` under an
    ``asyncio.Semaphore(--in-flight)``, ``complete_multipart_upload``; client defaults otherwise
    (so botocore adds its default CRC32 per part).

Both use their own client with the same connection pool size, in this process, against one
server started here: ``--store moto`` (moto_server, its S3 in memory) or ``--store rgw`` (a
single-node Ceph cluster, ``tests/fixtures/rgw.py``, its OSD on BlueStore over a sparse file, as
``../shared/RGW.md`` suggests for benchmarks). The two alternate ``--repeat`` times; objects are
deleted between runs; the best time of each counts. Prints one JSON document; ``ratio`` is plain
time over offloadd time (goal >= 0.9).

    .venv/bin/python bench/s3_upload.py [--store moto|rgw] [--mib 256] [--block-mib 8]
        [--in-flight 4] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MiB = 1024 * 1024
BUCKET = "bench-upload"
CREDS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


@contextmanager
def moto(tls: bool = False) -> Iterator[str]:
    """A moto_server on a free loopback port; ``tls``: over HTTPS (a self-signed certificate
    made on the spot: clients must not verify it), as S3 is reached in production, where
    bodies go unsigned."""
    exe = os.path.join(os.path.dirname(sys.executable), "moto_server")
    if not os.path.exists(exe):
        exe = shutil.which("moto_server") or "moto_server"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "MOTO_S3_DEFAULT_KEY_BUFFER_SIZE": str(1024 * MiB)}
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port),
                                 *(["-s"] if tls else [])], env=env,
                                stdout=log, stderr=subprocess.STDOUT)
        url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
        unverified = ssl._create_unverified_context() if tls else None
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    urllib.request.urlopen(url, timeout=1, context=unverified)
                    break
                except urllib.error.HTTPError:
                    break
                except OSError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise SystemExit("moto_server did not start") from None
                    time.sleep(0.1)
            yield url
        finally:
            proc.terminate()
            proc.wait(10)


@contextmanager
def store(kind: str) -> Iterator[str]:
    """The endpoint of the server ``kind`` names, started for the run."""
    if kind == "rgw":
        from tests.fixtures.rgw import running_rgw

        with running_rgw(store="bluestore") as cluster:
            yield cluster.endpoint
        return
    with moto() as url:
        yield url


STORES = {"moto": "moto_server (in-memory S3) on loopback, plain HTTP",
          "rgw": "Ceph RADOS Gateway 16.2 (beast, one BlueStore OSD on a sparse file) on "
                 "loopback, plain HTTP"}


def build_parts(mib: int, block_mib: float) -> list[Any]:
    from offloadd.format import StreamingObjectBuilder
    from offloadd.format.block import frame_entries
    from offloadd.format.checksum import stamp_blocks
    from offloadd.model import EntryRun
    from offloadd.offload.parts import UploadPart

    entry = 64 * 1024
    payload = os.urandom(entry)
    data, offsets = frame_entries(0, [payload] * (mib * MiB // entry))
    builder = StreamingObjectBuilder(max_block_size=int(block_mib * MiB), min_block_size=0)
    blocks = stamp_blocks(builder.add_run(EntryRun(3, 0, memoryview(data), offsets)))
    # one block per part on both sides (blocks of --block-mib are part-sized already)
    return [UploadPart(b.number, b.offset, b.length, (b,)) for b in blocks]


async def run(url: str, parts: list[Any], in_flight: int, repeat: int) -> dict[str, Any]:
    from aiobotocore.config import AioConfig
    from aiobotocore.session import get_session

    from offloadd.blobstore.s3 import S3BlobStore, S3Options
    from offloadd.offload.upload import SegmentUpload

    pool = max(10, 2 * in_flight)
    store = await S3BlobStore.open(S3Options(
        bucket=BUCKET, endpoint=url, access_key_id="testing", secret_access_key="testing",
        max_pool_connections=pool))
    bodies = [b"".join(p.buffers) for p in parts]  # the plain side gets ready-made bytes
    size = sum(len(b) for b in bodies)
    meta = {"s3managedledgeroffloaderformatversion": "1", "role": "data"}

    async def ours(key: str) -> float:
        t0 = time.perf_counter()
        up = SegmentUpload(store, key, meta, in_flight=in_flight)
        await up.start()
        up.submit(parts, lambda _part: None)
        info = await up.complete()
        dt = time.perf_counter() - t0
        assert info.size == size
        return dt

    session = get_session()
    async with session.create_client("s3", endpoint_url=url, region_name="us-east-1",
                                     config=AioConfig(max_pool_connections=pool),
                                     **CREDS) as client:
        await client.create_bucket(Bucket=BUCKET)

        async def plain(key: str) -> float:
            t0 = time.perf_counter()
            upload_id = (await client.create_multipart_upload(
                Bucket=BUCKET, Key=key, Metadata=meta))["UploadId"]
            sem = asyncio.Semaphore(in_flight)

            async def put(n: int, body: bytes) -> dict[str, Any]:
                async with sem:
                    resp = await client.upload_part(Bucket=BUCKET, Key=key, UploadId=upload_id,
                                                    PartNumber=n, Body=body)
                    return {"PartNumber": n, "ETag": resp["ETag"]}

            done = await asyncio.gather(*(put(n, b) for n, b in enumerate(bodies, start=1)))
            await client.complete_multipart_upload(Bucket=BUCKET, Key=key, UploadId=upload_id,
                                                   MultipartUpload={"Parts": list(done)})
            dt = time.perf_counter() - t0
            head = await client.head_object(Bucket=BUCKET, Key=key)
            assert int(head["ContentLength"]) == size
            return dt

        times: dict[str, list[float]] = {"offloadd": [], "plain": []}
        try:
            await plain("warm")  # connections, moto's first-request set-up
            await client.delete_object(Bucket=BUCKET, Key="warm")
            for i in range(repeat):
                order = [("offloadd", ours), ("plain", plain)]
                for name, job in order if i % 2 == 0 else order[::-1]:
                    key = f"{name}-{i}"
                    times[name].append(await job(key))
                    await client.delete_object(Bucket=BUCKET, Key=key)
        finally:
            await store.close()
    best = {k: min(v) for k, v in times.items()}
    mib = size / MiB
    return {
        "object_mib": round(mib, 1), "parts": len(parts),
        "seconds": {k: [round(x, 3) for x in v] for k, v in times.items()},
        "best_mib_per_s": {k: round(mib / v, 1) for k, v in best.items()},
        "ratio": round(best["plain"] / best["offloadd"], 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--block-mib", type=float, default=8.0)
    ap.add_argument("--in-flight", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--store", choices=sorted(STORES), default="moto")
    args = ap.parse_args()
    import uvloop

    parts = build_parts(args.mib, args.block_mib)
    with store(args.store) as url:
        res = uvloop.run(run(url, parts, args.in_flight, args.repeat))
    print(json.dumps({
        "benchmark": "s3_upload",
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus, Python "
                   f"{platform.python_version()}",
        "store": STORES[args.store],
        "loadavg": os.getloadavg(),
        "block_mib": args.block_mib, "in_flight": args.in_flight, "goal_ratio": 0.9, **res,
    }, indent=2))


if __name__ == "__main__":
    main()
