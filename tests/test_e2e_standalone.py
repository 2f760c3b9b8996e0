"""The spine's acceptance scenarios on real processes: ``offloadd standalone``, ``verify``,
``read``, a kill -9 in the middle of an upload, and the memory bound under a slow tier."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import crc32c
import pytest

pytestmark = pytest.mark.integration

OFFLOADD = [sys.executable, "-m", "offloadd"]
# no daemon here is scraped: a free port each, not the default one another test's daemon
# (on the other suite worker) may hold
ENV = {**os.environ, "OFFLOADD_METRICS__BIND": "127.0.0.1:0"}


def run(args: list[str], cwd: Path, timeout: float = 120, check: bool = True
        ) -> subprocess.CompletedProcess[str]:
    p = subprocess.run([*OFFLOADD, *args], cwd=cwd, capture_output=True, text=True,
                       timeout=timeout, env=ENV)
    if check and p.returncode != 0:
        raise AssertionError(f"offloadd {' '.join(args)} exited {p.returncode}:\n{p.stderr}")
    return p


def source_crcs(cwd: Path, topic: str) -> list[tuple[str, int]]:
    """(position, CRC32C) of every entry the writer stored, read straight from the ledger files."""
    code = f"""
import asyncio, json
from offloadd.ledger.local import LocalLedgerSource
from offloadd.metadata.embedded import EmbeddedMetadataStore
from offloadd.model import TopicName
async def main():
    md = await EmbeddedMetadataStore.open("data/metadata")
    src = LocalLedgerSource("data/ledgers", md)
    t = TopicName.parse({topic!r})
    out = []
    for d in await src.ledgers(t):
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


def wait_for(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.timeout(240)
def test_standalone_streams_three_topics_that_verify_and_read_back(tmp_path: Path) -> None:
    """The README's scenario: 30 s at 2 MB/s over 3 topics, then verify and read."""
    out = run(["standalone", "--json", "--duration", "30", "--rate", "2000000", "--topics", "3"],
              tmp_path, timeout=180)
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["bytes_written"] >= 50_000_000
    # issue 23 item 12: the summary is printed once (stdout), not repeated in the log
    assert "bytes_written" not in out.stderr, out.stderr
    rep = json.loads(run(["verify", "--json"], tmp_path).stdout)
    assert rep["ok"], rep
    assert len(rep["topics"]) == 3 and rep["orphans"] == []
    for t in rep["topics"]:
        assert t["gaps"] == [] and t["duplicates"] == 0 and t["checksum_mismatches"] == 0
        assert t["first"].endswith(":0") and t["segments"] >= 3
        assert t["source_checked"] == t["entries"] > 0
    # read returns exactly what the writer produced: compare per-entry CRC32C
    topic = rep["topics"][0]["topic"]
    lines = run(["read", "--topic", topic], tmp_path).stdout.splitlines()
    got = [(p, crc32c.crc32c(base64.b64decode(b))) for p, b in (ln.split("\t") for ln in lines)]
    assert got == source_crcs(tmp_path, topic)
    # the segments cross ledgers and the ledgers cross segments
    st = json.loads(run(["status", "--json"], tmp_path).stdout)
    for t in st["topics"]:
        assert t["segments"]["assigned"] == 0 and t["lag"]["entries"] == 0
    # what the tier costs, from what each segment recorded, equals what the tier holds
    tier = [t["tier"] for t in st["topics"]]
    files = [f for f in (tmp_path / "data" / "tier").rglob("*")  # objects, not their .meta
             if f.is_file() and not {".uploads", ".meta"} & set(f.parts)]
    assert sum(t["objects"] for t in tier) == len(files) == \
        2 * sum(t["segments"]["offloaded"] for t in st["topics"])
    assert sum(t["stored_bytes"] for t in tier) == sum(f.stat().st_size for f in files)
    assert all(t["stored_bytes"] <= 1.02 * t["payload_bytes"] for t in tier), tier
    assert all(t["monthly_cost"] > 0 and t["put_requests_per_gib"] for t in tier), tier
    assert "tier: " in run(["status"], tmp_path).stdout


def _assigned_segments(cwd: Path) -> list[dict[str, object]]:
    st = run(["status", "--json"], cwd, check=False)
    if st.returncode != 0:
        return []
    return [t for t in json.loads(st.stdout)["topics"] if t["segments"]["assigned"] > 0]


SegRow = tuple[str, str, bool, tuple[tuple[int, int, int], ...]]


def _segments(cwd: Path) -> dict[str, list[SegRow]]:
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
        out[name] = [(str(s.uid), str(s.end), s.complete,
                      [(r.ledger_id, r.first, r.last) for r in s.ranges])
                     for s in catalog.segments(info)]
    await md.close()
    print(json.dumps(out))
asyncio.run(main())
"""
    p = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                       timeout=60, check=True)
    raw = json.loads(p.stdout)
    return {k: [(a, b, c, tuple(tuple(r) for r in d)) for a, b, c, d in v]
            for k, v in raw.items()}


@pytest.mark.timeout(240)
def test_kill_9_mid_upload_redoes_the_assigned_segment(tmp_path: Path) -> None:
    """kill -9 while a segment is ASSIGNED and uploading: the restart redoes exactly its
    positions under a new uuid; verify passes; nothing lost or duplicated."""
    cfg = tmp_path / "slow.toml"
    # a slow tier (100 kB/s throttle) keeps every 1 MB segment's upload in flight ~10 s: far
    # longer than one poll of the catalog takes on a loaded machine
    cfg.write_text("""
[offload]
max_size_per_segment_mbytes = 1
max_segment_rollover_time_minutes = 0.05
max_block_size_bytes = 262144
flow_permits_per_second = 100000
[source]
rollover_bytes = 700000
""")
    for attempt in range(3):
        # the kill must land while a segment is still assigned; on a loaded machine the poll
        # that saw one can take longer than the segment's upload (the throttle grants a first
        # block on credit): then the scenario starts again from nothing
        if attempt:
            shutil.rmtree(tmp_path / "data")
        proc = subprocess.Popen([*OFFLOADD, "standalone", "--json", "--config", str(cfg),
                                 "--rate", "600000", "--topics", "1"], cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
        try:
            wait_for(lambda: bool(_assigned_segments(tmp_path)), 90, "an assigned segment")
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        before = _segments(tmp_path)
        (name,) = before
        dead = [s for s in before[name] if not s[2]]
        if dead:
            break
    assert len(dead) == 1
    dead_uid, _, _, dead_ranges = dead[0]

    # restart (a short run, fast tier): recovery redoes the assigned segment first
    run(["standalone", "--json", "--duration", "3", "--rate", "200000", "--topics", "1"], tmp_path,
        timeout=150)
    after = _segments(tmp_path)[name]
    assert all(s[2] for s in after)
    assert dead_uid not in {s[0] for s in after}
    assert dead_ranges in {s[3] for s in after}  # the same positions, committed once
    committed_before = [s for s in before[name] if s[2]]
    assert [s for s in after if s[0] in {c[0] for c in committed_before}] == committed_before
    rep = json.loads(run(["verify", "--json", "--orphan-grace", "0"], tmp_path).stdout)
    assert rep["ok"], rep


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


@pytest.mark.timeout(240)
def test_memory_stays_bounded_while_the_tier_is_slow(tmp_path: Path) -> None:
    """Writer at 20 MB/s, tier throttled to 1 MB/s: RSS stays under buffer cap + 128 MiB."""
    cap = 32 * 1024 * 1024
    cfg = tmp_path / "slow.toml"
    cfg.write_text(f"""
[offload]
buffer_max_bytes = {cap}
max_block_size_bytes = 4194304
max_size_per_segment_mbytes = 64
flow_permits_per_second = 1000000
""")
    proc = subprocess.Popen([*OFFLOADD, "standalone", "--json", "--config", str(cfg), "--rate",
                             "20000000",
                             "--topics", "3", "--duration", "25"], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    peak = 0
    try:
        deadline = time.monotonic() + 25
        while time.monotonic() < deadline and proc.poll() is None:
            peak = max(peak, _rss_kib(proc.pid))
            time.sleep(0.2)
        written = sum(f.stat().st_size for f in (tmp_path / "data" / "ledgers").glob("*.log"))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert written > 200 * 1024 * 1024  # the writer kept writing far past the buffer
    assert 0 < peak * 1024 < cap + 128 * 1024 * 1024, f"peak RSS {peak} KiB"
