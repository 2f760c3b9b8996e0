"""Shared pieces of the S3 end-to-end tests: configs, subprocess runs, and looking at what the
S3 server holds (objects, parts, indexes, incomplete uploads) through an independent boto3 client.

Every run is ``[sys.executable, "-m", "offloadd", ...]`` with ``cwd`` a test's directory, so
the embedded metadata and ledgers live under ``<cwd>/data``.
"""

from __future__ import annotations

import itertools
import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from offloadd.format import StreamingIndex, decode_index
from tests.fixtures.s3 import MIN_PART_SIZE, MotoBucket

OFFLOADD = [sys.executable, "-m", "offloadd"]
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
FORMAT_VERSION_KEY = "s3managedledgeroffloaderformatversion"

# The spine's demo policy (offloadd/standalone.py DEMO_OVERRIDES), which a --config run does not
# get: small segments that cross ledgers and ledgers that cross segments.
DEMO_POLICY = """
[offload]
max_size_per_segment_mbytes = 4
max_segment_rollover_time_minutes = 0.1
max_block_size_bytes = 1048576
[source]
rollover_bytes = 1572864
rollover_minutes = 0.25
"""

# The damage tests' policy: one ledger, segments of many small blocks, so damage can hit a block
# in the middle of a committed segment.
BLOCKS_POLICY = """
[offload]
max_size_per_segment_mbytes = 1
max_segment_rollover_time_minutes = 0.05
max_block_size_bytes = 65536
min_block_size_bytes = 0
[source]
rollover_bytes = 3000000
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def s3_config(cwd: Path, endpoint: str, bucket: str, body: str = "", *, prefix: str = "",
              name: str = "offloadd.toml", metrics_port: int | None = None,
              blobstore: str = "") -> Path:
    """A config file for the aws-s3 driver at ``endpoint``; ``body`` adds other sections,
    ``blobstore`` more ``[blobstore]`` keys."""
    metrics = (f'enabled = true\nbind = "127.0.0.1:{metrics_port}"' if metrics_port
               else "enabled = false")
    text = f"""
[blobstore]
driver = "aws-s3"
endpoint = "{endpoint}"
bucket = "{bucket}"
region = "us-east-1"
prefix = "{prefix}"
access_key_id = "testing"
secret_access_key = "testing"
min_part_size_bytes = {MIN_PART_SIZE}
{blobstore}
[metrics]
{metrics}
{body}
"""
    path = cwd / name
    path.write_text(text)
    return path


def run(args: list[str], cwd: Path, timeout: float = 120, check: bool = True
        ) -> subprocess.CompletedProcess[str]:
    p = subprocess.run([*OFFLOADD, *args], cwd=cwd, capture_output=True, text=True,
                       timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"offloadd {' '.join(args)} exited {p.returncode}:\n"
                             f"{p.stderr[-4000:]}")
    return p


def summary_of(p: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """``offloadd standalone``'s closing JSON line."""
    out: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return out


def verify_json(cwd: Path, cfg: Path, timeout: float = 120) -> dict[str, Any]:
    p = run(["verify", "--config", str(cfg), "--json", "--orphan-grace", "0"], cwd,
            timeout=timeout, check=False)
    if p.returncode not in (0, 1):
        raise AssertionError(f"offloadd verify exited {p.returncode}:\n{p.stderr[-4000:]}")
    rep: dict[str, Any] = json.loads(p.stdout)
    assert rep["ok"] == (p.returncode == 0)
    return rep


def read_crcs(cwd: Path, cfg: Path, topic: str, timeout: float = 120) -> list[tuple[str, int]]:
    """(position, CRC32C) of every entry ``offloadd read`` returns for ``topic``."""
    import base64

    import crc32c

    lines = run(["read", "--config", str(cfg), "--topic", topic], cwd,
                timeout=timeout).stdout.splitlines()
    return [(pos, crc32c.crc32c(base64.b64decode(b)))
            for pos, b in (ln.split("\t") for ln in lines)]


def source_crcs(cwd: Path, topic: str) -> list[tuple[str, int]]:
    """(position, CRC32C) of every entry the writer stored, read straight from the ledgers."""
    code = f"""
import asyncio, json
from offloadd.ledger.local import LocalLedgerSource
from offloadd.metadata.embedded import EmbeddedMetadataStore
from offloadd.model import TopicName
async def main():
    md = await EmbeddedMetadataStore.open("data/metadata")
    src = LocalLedgerSource("data/ledgers", md)
    out = []
    for d in await src.ledgers(TopicName.parse({topic!r})):
        if d.last_entry_id >= 0:
            crcs = await src.read_crcs(d.ledger_id, 0, d.last_entry_id)
            out += [(f"{{d.ledger_id}}:{{i}}", c) for i, c in enumerate(crcs)]
    await md.close()
    print(json.dumps(out))
asyncio.run(main())
"""
    p = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                       timeout=60, check=True)
    return [(a, b) for a, b in json.loads(p.stdout)]


def committed_uids(cwd: Path) -> dict[str, list[str]]:
    """Committed segment uuids per managed ledger, from the embedded metadata store."""
    code = """
import asyncio, json
from offloadd.model import catalog
from offloadd.metadata import managed_ledger
from offloadd.metadata.embedded import EmbeddedMetadataStore
async def main():
    md = await EmbeddedMetadataStore.open("data/metadata")
    out = {}
    for name in await managed_ledger.list_names(md):
        info, _ = await managed_ledger.load(md, name)
        out[name] = [str(s.uid) for s in catalog.segments(info) if s.complete]
    await md.close()
    print(json.dumps(out))
asyncio.run(main())
"""
    p = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                       timeout=60, check=True)
    out: dict[str, list[str]] = json.loads(p.stdout)
    return out


# ---- what the server holds ---------------------------------------------------------------------
@dataclass(frozen=True)
class Stored:
    key: str
    size: int
    etag: str
    metadata: dict[str, str]

    @property
    def parts(self) -> int:
        """Parts of a multipart object (its ETag's ``-N``); 0 for a single PUT."""
        m = re.fullmatch(r'"?[0-9a-f]{32}-(\d+)"?', self.etag)
        return int(m.group(1)) if m else 0


def stored_objects(bucket: MotoBucket) -> dict[str, Stored]:
    client = bucket.boto3()
    out: dict[str, Stored] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket.name):
        for obj in page.get("Contents", []):
            head = client.head_object(Bucket=bucket.name, Key=obj["Key"])
            out[obj["Key"]] = Stored(obj["Key"], int(head["ContentLength"]), str(head["ETag"]),
                                     dict(head.get("Metadata") or {}))
    return out


def part_sizes(bucket: MotoBucket, key: str, parts: int) -> list[int] | None:
    """The size of each part of a completed multipart object; None when the server does not
    answer HEAD ?partNumber (RGW 16.2 ignores it and describes the whole object)."""
    client = bucket.boto3()
    heads = [client.head_object(Bucket=bucket.name, Key=key, PartNumber=n)
             for n in range(1, parts + 1)]
    if any("PartsCount" not in h for h in heads):
        return None
    return [int(h["ContentLength"]) for h in heads]


def get_bytes(bucket: MotoBucket, key: str) -> tuple[bytes, dict[str, str]]:
    obj = bucket.boto3().get_object(Bucket=bucket.name, Key=key)
    return obj["Body"].read(), dict(obj.get("Metadata") or {})


def put_bytes(bucket: MotoBucket, key: str, data: bytes, metadata: dict[str, str]) -> None:
    bucket.boto3().put_object(Bucket=bucket.name, Key=key, Body=data, Metadata=metadata)


def streaming_index(bucket: MotoBucket, key: str) -> StreamingIndex:
    raw, _ = get_bytes(bucket, key)
    idx = decode_index(raw, key)
    assert isinstance(idx, StreamingIndex), f"{key} is not a streaming index"
    return idx


def block_count(idx: StreamingIndex) -> int:
    return sum(len(s.blocks) for s in idx.sections)


def incomplete_uploads(bucket: MotoBucket) -> list[str]:
    resp = bucket.boto3().list_multipart_uploads(Bucket=bucket.name)
    return [str(u["Key"]) for u in resp.get("Uploads", [])]


def check_objects(bucket: MotoBucket, cwd: Path, prefix: str = "",
                  part_size: int = 8 * 1024 * 1024) -> dict[str, int]:
    """Every object is a committed segment's data or index object under ``prefix``, carries
    the format version, and every data object's parts are runs of whole blocks (each part
    starts at a block header), each at least ``part_size`` but the last. Returns the part count
    of each data object."""
    objects = stored_objects(bucket)
    uids = {u for segs in committed_uids(cwd).values() for u in segs}
    assert uids, "nothing was committed"
    expected = {f"{prefix}{u}" for u in uids} | {f"{prefix}{u}-index" for u in uids}
    assert set(objects) == expected
    for obj in objects.values():
        assert re.fullmatch(re.escape(prefix) + UUID + "(-index)?", obj.key)
        assert obj.metadata.get(FORMAT_VERSION_KEY) == "1", obj
        assert obj.metadata.get("role") == ("index" if obj.key.endswith("-index") else "data")
    parts = {}
    for u in uids:
        data = objects[f"{prefix}{u}"]
        idx = streaming_index(bucket, f"{prefix}{u}-index")
        assert idx.data_object_length == data.size
        if data.parts == 0:  # a single PUT: the segment closed before it filled one part
            assert data.size < part_size, (data.key, data.size)  # else a part would be cut
            parts[data.key] = 1
            continue
        assert data.parts <= block_count(idx), f"{data.key}: {data.parts} parts"
        sizes = part_sizes(bucket, data.key, data.parts) if data.parts > 1 else [data.size]
        if sizes is not None:  # where the server tells part sizes (moto does, RGW 16.2 not)
            assert sum(sizes) == data.size
            assert all(s >= part_size for s in sizes[:-1]), (data.key, sizes)
            starts = {b.offset for s in idx.sections for b in s.blocks}
            assert set(itertools.accumulate(sizes[:-1], initial=0)) <= starts, (data.key, sizes)
        parts[data.key] = data.parts
    assert incomplete_uploads(bucket) == []
    return parts


# ---- processes --------------------------------------------------------------------------------
def rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except FileNotFoundError:
        pass
    return 0


def log_records(path: Path) -> list[dict[str, Any]]:
    """The JSON log lines of a daemon's stderr file (other lines are skipped)."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def wait_for(pred: Callable[[], bool], timeout: float, what: str, every: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
