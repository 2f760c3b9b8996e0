"""An S3 outage under a running daemon: the proxy between offloadd and the S3 server refuses every
request (connection reset) for a while, then recovers.

While it lasts, uploads pause (the store's circuit opens and only probes reach the store), the
process's memory stays bounded by the offload buffer although the writer keeps writing, and the
process says so; once the store answers again the circuit closes by itself and the backlog
completes without help: every written entry is committed and verifies.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.faultproxy import FaultProxy
from tests.fixtures.s3 import MotoBucket
from tests.s3e2e.helpers import (
    OFFLOADD,
    free_port,
    log_records,
    rss_kib,
    s3_config,
    source_crcs,
    stored_objects,
    summary_of,
    verify_json,
    wait_for,
)

pytestmark = pytest.mark.integration

MiB = 1024 * 1024
BUFFER_CAP = 8 * MiB
POLICY = f"""
[offload]
max_size_per_segment_mbytes = 2
max_segment_rollover_time_minutes = 0.05
max_block_size_bytes = 262144
min_block_size_bytes = 0
buffer_max_bytes = {BUFFER_CAP}
retry_base_s = 0.2
retry_max_s = 2
[source]
rollover_bytes = 3000000
"""
RATE = 3_000_000  # bytes/s the writer keeps writing, outage or not


@pytest.fixture
def proxy(s3_server: str) -> Iterator[FaultProxy]:
    with FaultProxy(s3_server, seed=7) as p:
        yield p


def health_transitions(records: list[dict[str, Any]]) -> list[str]:
    """The store-health states entered, in order, from the circuit's log lines
    ("store health healthy -> degraded-paused: s3://bucket failed ..."); the trip is a warning."""
    out = []
    for r in records:
        msg = str(r.get("msg", ""))
        if r.get("logger") == "offloadd.blobstore.health" and msg.startswith("store health"):
            state = msg.split("->", 1)[1].split()[0].rstrip(":")
            assert state != "degraded-paused" or r["level"] == "warning", r
            out.append(state)
    return out


def get(port: int, path: str) -> tuple[int, str]:
    """(HTTP status, body) of the daemon's endpoint; (0, error) while nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


def circuit_gauge(metrics_text: str) -> dict[str, float]:
    """``offloadd_store_circuit_state`` of the blob store, by state label."""
    out = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == "offloadd_store_circuit_state" and \
                    sample.labels.get("store") == "blobstore":
                out[sample.labels["state"]] = sample.value
    return out


@dataclass
class Observed:
    """What the daemon's own endpoints said while the circuit was in one state."""

    status: dict[str, Any]
    circuit: dict[str, float]
    ready: tuple[int, str]


def observe(port: int) -> Observed | None:
    code, body = get(port, "/status")
    if code != 200:
        return None
    return Observed(json.loads(body), circuit_gauge(get(port, "/metrics")[1]),
                    get(port, "/readyz"))


@pytest.mark.parametrize("outage_s", [
    pytest.param(8.0, id="8s"),
    pytest.param(30.0, id="30s", marks=pytest.mark.slow),
])
@pytest.mark.timeout(300)
def test_an_outage_pauses_uploads_within_bounded_memory_and_the_backlog_completes_after(
        tmp_path: Path, s3_bucket: MotoBucket, proxy: FaultProxy, outage_s: float) -> None:
    metrics_port = free_port()
    cfg = s3_config(tmp_path, proxy.url, s3_bucket.name, POLICY, metrics_port=metrics_port,
                    blobstore="read_timeout_s = 5.0\nconnect_timeout_s = 2.0")
    warm_s, after_s = 4.0, 6.0
    stderr = tmp_path / "standalone.log"
    with stderr.open("w") as err:
        proc = subprocess.Popen(
            [*OFFLOADD, "standalone", "--json", "--config", str(cfg), "--topics", "2", "--rate",
             str(RATE), "--duration", str(warm_s + outage_s + after_s)],
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=err, text=True)
    paused: Observed | None = None
    recovered: Observed | None = None
    buffer_used: list[int] = []
    try:
        wait_for(lambda: any(k.endswith("-index") for k in stored_objects(s3_bucket)), 60,
                 "the first committed segment")
        written_before = _ledger_bytes(tmp_path)
        proxy.set_outage(True)
        t_out = time.monotonic()
        peak = 0
        while time.monotonic() - t_out < outage_s and proc.poll() is None:
            peak = max(peak, rss_kib(proc.pid))
            seen = observe(metrics_port)
            if seen is not None:
                buffer_used.append(seen.status["buffer"]["used"])
                if seen.status["store_circuit"] == "degraded-paused":
                    paused = seen
            time.sleep(0.25)
        written_during = _ledger_bytes(tmp_path) - written_before
        requests_during = [e for e in proxy.log if e[0] >= t_out]
        proxy.set_outage(False)
        deadline = time.monotonic() + 30
        while recovered is None and time.monotonic() < deadline and proc.poll() is None:
            seen = observe(metrics_port)
            if seen is not None and seen.status["store_circuit"] == "healthy":
                recovered = seen
            time.sleep(0.25)
        out, _ = proc.communicate(timeout=200)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, stderr.read_text()[-4000:]

    # the writer kept writing far past the buffer cap, while memory stayed bounded by it
    assert written_during > 2 * BUFFER_CAP
    assert 0 < peak * 1024 < BUFFER_CAP + 128 * MiB, f"peak RSS {peak} KiB"
    assert buffer_used and max(buffer_used) <= BUFFER_CAP

    # the process said so, in its status, metrics, readiness and log
    assert paused is not None, "/status never showed the store circuit open"
    assert paused.circuit.get("open") == 1.0 and paused.circuit.get("closed") == 0.0, paused
    assert paused.ready[0] == 503 and "degraded-paused" in paused.ready[1], paused.ready
    assert recovered is not None, "/status never showed the store healthy again"
    assert recovered.circuit.get("closed") == 1.0 and recovered.circuit.get("open") == 0.0
    assert recovered.ready[0] == 200, recovered.ready
    states = health_transitions(log_records(stderr))
    assert "degraded-paused" in states, states
    assert states[-1] == "healthy", states
    assert states.index("degraded-paused") < len(states) - 1

    # uploads paused: once the circuit was open only the prober's HeadBucket calls went out
    late = [e for e in requests_during if e[0] >= t_out + outage_s / 2]
    probes = [e for e in late if e[1] == "HEAD" and e[2].rstrip("/") == f"/{s3_bucket.name}"]
    assert len(late) - len(probes) <= 2, late

    # the backlog completed on its own: every written entry is committed and verifies
    summary = summary_of(subprocess.CompletedProcess([], 0, out, ""))
    for name, t in summary["topics"].items():
        assert t["last_offloaded"] == source_crcs(tmp_path, name)[-1][0], (name, t)
    direct = s3_config(tmp_path, s3_bucket.endpoint, s3_bucket.name, POLICY, name="direct.toml")
    rep = verify_json(tmp_path, direct)
    assert rep["ok"], rep


def _ledger_bytes(cwd: Path) -> int:
    return sum(f.stat().st_size for f in (cwd / "data" / "ledgers").glob("*.log"))
