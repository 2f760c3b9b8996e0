"""Store faults: ``offloadd standalone`` uploads to moto through the fault-injecting proxy at
request error rates of 1, 10 and 50 % (500 InternalError, 503 SlowDown, connection resets before
and after the server acted, responses stalled past the read timeout, bodies cut in half). What
``offloadd read`` returns equals what the writer wrote, entry for entry (read through the same
faults; at 50 % straight from the server in the CI portion, through the faults in the long mode);
``verify`` straight against the server finds every entry once with the source's CRC32C; no
multipart upload is left behind, and no orphan is left (gc removes what an abandoned attempt
could not).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.faultproxy import FaultPlan, FaultProxy
from tests.fixtures.s3 import MotoBucket
from tests.reliability.conftest import Figures
from tests.reliability.support import Proc, counts, drained, wait_until
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



PART = 8192  # a full 16 KiB block alone, a ledger's short last block with the next one


def policy(root: Path) -> str:
    """Small blocks and parts: many parts, so many requests to fail. Absolute paths: the test
    reads the metadata in-process."""
    return f"""
[offload]
max_size_per_segment_mbytes = 0.25
max_segment_rollover_time_minutes = 0.02
max_block_size_bytes = 16384
min_block_size_bytes = 0
blocks_in_flight = 4
retry_base_s = 0.1
retry_max_s = 1
[source]
rollover_bytes = 400000
path = "{root}/data/ledgers"
[metadata]
url = "embedded:{root}/data/metadata"
[daemon]
pid_file = "{root}/data/offloadd.pid"
log_format = "text"
"""


# A stall outlasts the read timeout.
BLOBSTORE = "read_timeout_s = 1.0\nconnect_timeout_s = 2.0\nhealth_window_s = 3"


def faults(rate: float) -> FaultPlan:
    """``rate`` of all requests fail, spread over every kind the proxy knows."""
    return FaultPlan(error_500=0.3 * rate, slowdown_503=0.2 * rate, reset=0.2 * rate,
                     truncate=0.2 * rate, stall=0.1 * rate, stall_s=1.5)


@pytest.fixture
def proxy(moto_server: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_server, seed=7) as p:
        yield p


def survive(tmp_path: Path, bucket: MotoBucket, proxy: FaultProxy, figures: Figures, *,
            rate: float, seconds: float, bytes_per_s: int, read_through: bool = True,
            section: str | None = None, history: int | None = None,
            drain_s: float = 600, blobstore: str = "") -> None:
    """``standalone`` writes ``seconds`` at ``bytes_per_s`` through the faults; or, given
    ``history`` bytes, ``produce`` writes them first and ``run`` offloads them (its drain is
    not bounded by standalone's two minutes: at 50 % the store circuit keeps pausing uploads)."""
    cfg = s3_config(tmp_path, proxy.url, bucket.name, policy(tmp_path),
                    blobstore=BLOBSTORE + "\n" + blobstore + f"\npart_size_bytes = {PART}")
    direct = s3_config(tmp_path, bucket.endpoint, bucket.name, policy(tmp_path),
                       name="direct.toml")
    proxy.plan = faults(rate)
    if history is None:
        out = run(["standalone", "--json", "--config", str(cfg), "--duration", str(seconds),
                   "--rate",
                   str(bytes_per_s), "--topics", "1", "--entry-size", "1024"], tmp_path,
                  timeout=240)
        (name,) = summary_of(out)["topics"]
        daemon_log = out.stderr
    else:
        name = "persistent://public/default/faulty"
        run(["produce", "--json", "--config", str(cfg), "--topic", name, "--bytes", str(history),
             "--entry-size", "1024"], tmp_path)
        d = Proc(["run", "--config", str(cfg)], tmp_path, tmp_path / "run.log")
        try:
            wait_until(lambda: drained(cfg), drain_s, "the daemon to offload everything")
        finally:
            assert d.stop() == 0, d.text()[-4000:]
        daemon_log = d.text()
    writing = dict(proxy.injected)
    seen = len(proxy.log)
    # every entry written was committed
    assert drained(cfg), counts(cfg)
    source = source_crcs(tmp_path, name)
    # read back (through the same faults unless told otherwise): byte-identical payloads, in
    # order, none missing
    if not read_through:
        proxy.plan = FaultPlan()
    got = read_crcs(tmp_path, cfg if read_through else direct, name, timeout=240)
    differences = sum(1 for a, b in zip(got, source, strict=False) if a != b) + abs(
        len(got) - len(source))
    proxy.plan = FaultPlan()
    after = verify_json(tmp_path, direct)
    removed = 0
    # an abandoned attempt whose clean-up failed (its objects, or its multipart upload when
    # the abort itself failed at this fault rate): gc's to remove
    if after["orphans"] or incomplete_uploads(bucket):
        gc = run(["gc", "--config", str(direct), "--grace", "0", "--json"], tmp_path)
        removed = len(json.loads(gc.stdout)["orphans_removed"])
        after = verify_json(tmp_path, direct)
    injected = sum(proxy.injected.values())
    (vt,) = after["topics"]
    figures.set(section or f"store_faults_{round(rate * 100)}pct", requests=len(proxy.log),
                faults_injected=injected, faults_survived=injected if after["ok"] else 0,
                faults_by_kind=dict(sorted(proxy.injected.items())),
                requests_while_writing=seen, faults_while_writing=sum(writing.values()),
                read_through_faults=read_through,
                entries_written=len(source), entries_checked=len(got),
                read_differences=differences, entries_lost=len(vt["gaps"]) + max(
                    len(source) - vt["entries"], 0),
                entries_duplicated=vt["duplicates"],
                checksum_mismatches=vt["checksum_mismatches"],
                orphans_removed_by_gc=removed,
                orphans_left=len(after["orphans"]))

    assert got == source and differences == 0
    assert after["ok"], after
    assert vt["source_checked"] == vt["entries"] == len(source)
    try:
        check_objects(bucket, tmp_path, part_size=PART)  # only committed objects
    except AssertionError as exc:
        lines = [x for x in daemon_log.splitlines() if "WARNING" in x or "ERROR" in x]
        raise AssertionError(f"{exc}\nthe daemon's warnings:\n" + "\n".join(lines[-40:])) from exc
    assert incomplete_uploads(bucket) == []
    if rate >= 0.1:
        assert injected / max(len(proxy.log), 1) >= rate / 3, (injected, len(proxy.log))
        assert {"500", "503", "reset", "truncate"} <= set(proxy.injected), proxy.injected


@pytest.mark.timeout(240)
@pytest.mark.parametrize("rate", [pytest.param(0.01, id="1pct"), pytest.param(0.10, id="10pct"),
                                  pytest.param(0.50, id="50pct")])
def test_reads_back_identical_data_through_failing_store_requests(
        tmp_path: Path, s3_bucket: MotoBucket, proxy: FaultProxy, figures: Figures,
        rate: float) -> None:
    # At 50 % a request takes two tries on average, with backoff, and reads retry on without
    # counting attempts while the store circuit is open: less data, and the read back goes
    # straight to the server here (through the faults in the long mode).
    half = rate >= 0.5
    survive(tmp_path, s3_bucket, proxy, figures, rate=rate, seconds=1 if half else 3,
            bytes_per_s=200_000 if half else 300_000, read_through=not half)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_half_of_all_requests_failing_over_more_data_loses_nothing(
        tmp_path: Path, s3_bucket: MotoBucket, proxy: FaultProxy, figures: Figures) -> None:
    # 8 attempts (the default) all fail one request in 256 at this rate: a store this bad is
    # what max_attempts is for
    survive(tmp_path, s3_bucket, proxy, figures, rate=0.5, seconds=0, bytes_per_s=0,
            history=1_500_000, section="store_faults_50pct_long", blobstore="max_attempts = 24")
