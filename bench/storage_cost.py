"""What the tier costs: stored bytes per payload byte, PUT-class requests per GiB written and
GET-class requests per GiB read, for segments of several sizes over ledgers of several sizes.

On ``moto_server`` (its real 5 MiB part minimum: no ``S3_UPLOAD_PART_MIN_SIZE``), through the
pipeline's own path: entries of ``--entry-kib`` KiB in ledgers of ``--ledger-mib`` MiB (a
:class:`~offloadd.ledger.memory.MemoryLedgerSource`), cut into segments of ``--segment-mib`` MiB
of payload (a segment crosses ledgers, a ledger crosses segments), each uploaded by a
:class:`~offloadd.offload.attempt.SegmentAttempt` (blocks sized by content, multipart parts of
``--part-mib`` MiB, the index last) to :class:`~offloadd.blobstore.s3.S3BlobStore`; then every
segment read back by :class:`~offloadd.read.reader.TierReader` (ranged GETs of ``--part-mib``
MiB, index read once per segment). Requests are the driver's own counters
(``offloadd_blobstore_requests_total``), which equal what the server saw
(``tests/blobstore/test_requests.py``); stored bytes are the objects' sizes as the server lists
them.

Per case, about ``--total-mib`` MiB of payload (at least one segment). Printed per case::

    stored_per_payload        stored bytes ÷ payload bytes (goal <= 1.02)
    put_per_gib               PUT-class requests per GiB of payload
    put_expected_per_gib      the issue's figure: GiB ÷ part size + 3 per segment
    put_whole_parts_per_gib   the same with whole parts: ceil(segment ÷ part size) + 3 per segment,
                              or 2 for a segment within one part (one PUT, then the index)
    get_per_gib               GET-class requests per GiB read (index HEAD + GET included)
    get_expected_per_gib      the issue's figure: GiB ÷ read range size
    get_whole_ranges_per_gib  with whole ranges and the index: ceil(segment ÷ range) + 2 per segment
    get_data_per_gib          data GETs only (the index's HEAD and GET left out), per GiB read

``--padded`` writes as offloadd did before parts were cut apart from blocks (and as Pulsar's
PIP-76 writer does): every block a part of its own, padded to 5 MiB — the "before" figures.

    .venv/bin/python bench/storage_cost.py [--total-mib 64] [--segment-mib 1,8,64]
        [--ledger-mib 1.5,64] [--entry-kib 1,64] [--part-mib 8] [--padded]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.s3_upload import moto  # noqa: E402
from offloadd.blobstore.requests import RequestCounts  # noqa: E402
from offloadd.blobstore.s3 import S3BlobStore, S3Options  # noqa: E402
from offloadd.ledger.memory import MemoryLedgerSource  # noqa: E402
from offloadd.metadata.memory import MemoryMetadataStore  # noqa: E402
from offloadd.model import TopicName  # noqa: E402
from offloadd.model.catalog import LedgerRange, Segment, SegmentKind  # noqa: E402
from offloadd.offload.attempt import Uploads, open_streaming  # noqa: E402
from offloadd.offload.buffer import OffloadBuffer  # noqa: E402
from offloadd.offload.roller import RollPolicy  # noqa: E402
from offloadd.offload.runs import RunReader  # noqa: E402
from offloadd.read.reader import TierReader  # noqa: E402

MiB = 1024 * 1024
GiB = 1024 * MiB
TOPIC = TopicName.parse("persistent://public/default/cost")
MAX_BLOCK = 64 * MiB  # [offload] max_block_size_bytes' default


def plan(total: int, seg_bytes: int, ledger_bytes: int, entry: int
         ) -> tuple[MemoryLedgerSource, list[list[LedgerRange]]]:
    """The source (ledgers of ``ledger_bytes`` payload) and the segments' ranges."""
    per_ledger = max(ledger_bytes // entry, 1)
    per_segment = max(seg_bytes // entry, 1)
    n_segments = max(round(total / seg_bytes), 1)
    n_entries = n_segments * per_segment
    src = MemoryLedgerSource()
    payload = bytes(range(256)) * (entry // 256 + 1)
    written = 0
    while written < n_entries:
        n = min(per_ledger, n_entries - written)
        src.append(TOPIC, [payload[i % 256:i % 256 + entry] for i in range(n)])
        src.close_ledger(TOPIC)
        written += n
    segments: list[list[LedgerRange]] = []
    for s in range(n_segments):
        first, last = s * per_segment, (s + 1) * per_segment - 1
        ranges = []
        for lid in range(first // per_ledger, last // per_ledger + 1):
            lo, hi = lid * per_ledger, (lid + 1) * per_ledger - 1
            ranges.append(LedgerRange(lid, max(first, lo) - lo, min(last, hi) - lo))
        segments.append(ranges)
    return src, segments


def delta(counts: RequestCounts, before: dict[str, int]) -> dict[str, int]:
    now = counts.by_class()
    return {k: now[k] - before.get(k, 0) for k in now}


async def one_case(endpoint: str, *, total: int, seg_bytes: int, ledger_bytes: int, entry: int,
                   part: int, padded: bool = False) -> dict[str, Any]:
    bucket = f"cost-{uuid.uuid4().hex[:12]}"
    counts = RequestCounts("aws-s3")
    store = await S3BlobStore.open(S3Options(bucket=bucket, endpoint=endpoint,
                                             access_key_id="testing",
                                             secret_access_key="testing"), requests=counts)
    try:
        import boto3  # type: ignore[import-untyped]

        boto3.client("s3", region_name="us-east-1", endpoint_url=endpoint,
                     aws_access_key_id="testing",
                     aws_secret_access_key="testing").create_bucket(Bucket=bucket)
        src, segments = plan(total, seg_bytes, ledger_bytes, entry)
        budget = RollPolicy(1 << 62, float("inf"), MAX_BLOCK).block_budget
        reader = RunReader(src, OffloadBuffer(256 * MiB), TOPIC)
        # padded: a part per block, each block padded to S3's minimum (the old layout)
        uploads = Uploads(store, TOPIC.managed_ledger, 4, part_size=1 if padded else part)
        min_block = 5 * MiB if padded else 0
        before = counts.by_class()
        t0 = time.perf_counter()
        payload, done = 0, []
        for ranges in segments:
            att = await open_streaming(uploads, max_block_size=MAX_BLOCK,
                                       min_block_size=min_block, opened_at=0.0)
            for r in ranges:
                async for run in reader.runs(r, budget, att.wait_for_room):
                    att.feed(run)
            await att.seal()
            payload += att.payload_bytes
            done.append(Segment(att.uid, SegmentKind.STREAMING, tuple(ranges), True))
        upload_s = time.perf_counter() - t0
        puts = delta(counts, before)
        stored = sum([o.size async for o in store.list()])
        before = counts.by_class()
        data_gets = counts.snapshot().get(("GetObject", "ok"), 0)
        tier = TierReader(MemoryMetadataStore(), store, prefetch=4, range_bytes=part)
        read = 0
        for seg in done:
            async for e in tier.read_segment(seg):
                read += len(e.payload)
        gets = delta(counts, before)
        data_gets = counts.snapshot().get(("GetObject", "ok"), 0) - data_gets - len(done)
        assert read == payload, (read, payload)
    finally:
        await store.close()
    n, gib = len(done), payload / GiB
    per_seg = payload / n
    return {
        "segment_mib": seg_bytes / MiB, "ledger_mib": ledger_bytes / MiB,
        "entry_kib": entry / 1024, "segments": n, "payload_bytes": payload,
        "stored_bytes": stored, "stored_per_payload": round(stored / payload, 4),
        "put_requests": puts["put"], "put_per_gib": round(puts["put"] / gib, 1),
        "put_expected_per_gib": round((gib * GiB / part + 3 * n) / gib, 1),
        "put_whole_parts_per_gib": round(  # one PUT when the data object fits in a part
            n * (2 if stored / n <= part else math.ceil(per_seg / part) + 3) / gib, 1),
        "get_requests": gets["get"], "get_per_gib": round(gets["get"] / gib, 1),
        "get_expected_per_gib": round(GiB / part, 1),
        "get_whole_ranges_per_gib": round(n * (math.ceil(per_seg / part) + 2) / gib, 1),
        "get_data_per_gib": round(data_gets / gib, 1),
        "upload_s": round(upload_s, 2),
    }


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    cases = []
    with moto() as endpoint:
        for seg in floats(args.segment_mib):
            for ledger in floats(args.ledger_mib):
                for entry in floats(args.entry_kib):
                    cases.append(await one_case(
                        endpoint, total=int(args.total_mib * MiB), seg_bytes=int(seg * MiB),
                        ledger_bytes=int(ledger * MiB), entry=int(entry * 1024),
                        part=int(args.part_mib * MiB), padded=args.padded))
                    print(json.dumps(cases[-1]), file=sys.stderr, flush=True)
    worst = max(c["stored_per_payload"] for c in cases)
    return {
        "benchmark": "storage_cost", "store": "moto_server (5 MiB part minimum)",
        "layout": "padded: a part per block, blocks padded to 5 MiB" if args.padded else
                  "parts of whole content-sized blocks",
        "part_mib": args.part_mib, "total_mib_per_case": args.total_mib,
        "machine": platform.platform(), "cases": cases,
        "worst_stored_per_payload": worst,
        "stored_goal_met": worst <= 1.02,
        "put_within_1_1_of_whole_parts": all(
            c["put_per_gib"] <= 1.1 * c["put_whole_parts_per_gib"] for c in cases),
        "put_within_1_1_of_issue_formula": all(
            c["put_per_gib"] <= 1.1 * c["put_expected_per_gib"] for c in cases),
        "get_within_1_1_of_whole_ranges": all(
            c["get_per_gib"] <= 1.1 * c["get_whole_ranges_per_gib"] for c in cases),
        "get_within_1_1_of_issue_formula": all(
            c["get_per_gib"] <= 1.1 * c["get_expected_per_gib"] for c in cases),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--total-mib", type=float, default=64.0)
    ap.add_argument("--segment-mib", default="1,8,64")
    ap.add_argument("--ledger-mib", default="1.5,64")
    ap.add_argument("--entry-kib", default="1,64")
    ap.add_argument("--part-mib", type=float, default=8.0)
    ap.add_argument("--padded", action="store_true", help="the old layout, for comparison")
    args = ap.parse_args()
    import uvloop

    print(json.dumps(uvloop.run(main_async(args)), indent=2))


if __name__ == "__main__":
    main()
