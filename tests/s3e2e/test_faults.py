"""A fault-injecting HTTP proxy between offloadd and the S3 server fails well over 10 % of the
requests (500 InternalError, 503 SlowDown, connection resets before and after the server acted,
stalled and truncated responses): every segment still completes, what reads back is
byte-identical to what was written (``offloadd read`` goes through the same faulty proxy), and
no multipart upload is left behind."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.faultproxy import FaultPlan, FaultProxy
from tests.fixtures.s3 import MotoBucket
from tests.s3e2e.helpers import (
    check_objects,
    incomplete_uploads,
    read_crcs,
    run,
    s3_config,
    source_crcs,
    summary_of,
    verify_json,
)

pytestmark = pytest.mark.integration

FAULTS = FaultPlan(error_500=0.04, slowdown_503=0.04, reset=0.05, stall=0.02, truncate=0.03,
                   stall_s=2.0)
PART = 8192
# Small blocks and parts: many parts, so many requests to fail. A stall outlasts the read timeout.
POLICY = """
[offload]
max_size_per_segment_mbytes = 1
max_segment_rollover_time_minutes = 0.05
max_block_size_bytes = 16384
min_block_size_bytes = 0
blocks_in_flight = 4
retry_base_s = 0.2
retry_max_s = 2
[source]
rollover_bytes = 700000
"""


@pytest.fixture
def proxy(s3_server: str) -> Iterator[FaultProxy]:
    with FaultProxy(s3_server, seed=4) as p:
        yield p


@pytest.mark.timeout(240)
def test_every_segment_completes_and_reads_back_through_a_proxy_failing_requests(
        tmp_path: Path, s3_bucket: MotoBucket, proxy: FaultProxy) -> None:
    # parts of 8 KiB: a full 16 KiB block alone, a ledger's short last block with the next
    # one; many parts, so many requests
    cfg = s3_config(tmp_path, proxy.url, s3_bucket.name, POLICY,
                    blobstore="read_timeout_s = 1.0\nconnect_timeout_s = 2.0\n"
                    f"part_size_bytes = {PART}")
    proxy.plan = FAULTS
    out = run(["standalone", "--json", "--config", str(cfg), "--duration", "6", "--rate", "600000",
               "--topics", "2"], tmp_path, timeout=180)

    seen = len(proxy.log)
    injected = sum(proxy.injected.values())
    assert seen >= 200, f"only {seen} requests: too few to judge"
    assert injected / seen >= 0.10, (injected, seen, proxy.injected)
    assert set(proxy.injected) == {"500", "503", "reset", "stall", "truncate"}

    summary = summary_of(out)
    for name, t in summary["topics"].items():
        # every entry written was committed: the last offloaded position is the source's end
        assert t["segments"] >= 2, (name, t)
        assert t["last_offloaded"] == source_crcs(tmp_path, name)[-1][0]
    # verify straight against the server: every payload against the source
    direct = s3_config(tmp_path, s3_bucket.endpoint, s3_bucket.name, POLICY, name="direct.toml")
    rep = verify_json(tmp_path, direct)
    assert rep["ok"], rep
    assert all(t["source_checked"] == t["entries"] > 0 for t in rep["topics"])
    # and a read through the same faults
    topic = rep["topics"][0]["topic"]
    assert read_crcs(tmp_path, cfg, topic, timeout=180) == source_crcs(tmp_path, topic)
    assert sum(proxy.injected.values()) > injected  # the read met faults as well

    proxy.plan = FaultPlan()
    check_objects(s3_bucket, tmp_path, part_size=PART)
    assert incomplete_uploads(s3_bucket) == []
