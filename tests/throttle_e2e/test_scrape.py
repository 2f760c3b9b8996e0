"""Issue 5: a scrape of ``/metrics`` taken during a real run is valid for Prometheus, and the
shipped alert rules load.

``promtool`` comes with the Debian package ``prometheus`` (``scripts/setup --servers``). Without
it these tests skip, except under ``CI=true`` where a missing promtool is a set-up error.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "offloadd-rules.yml"

CONFIG = """\
[source]
rollover_bytes = 1500000
rollover_minutes = 0.1

[blobstore]
part_size_bytes = 262144

[offload]
flow_permits_per_second = 4000000
max_block_size_bytes = 262144
max_size_per_segment_mbytes = 1
max_segment_rollover_time_minutes = 0.05

[metrics]
bind = "127.0.0.1:{port}"
"""


def promtool() -> str:
    path = shutil.which("promtool")
    if path is not None:
        return path
    if os.environ.get("CI") == "true":
        pytest.fail("promtool is not installed: run scripts/setup --servers (Debian package "
                    "prometheus); CI must check the metrics and the alert rules")
    pytest.skip("promtool not installed (Debian package prometheus; scripts/setup --servers)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


def sample(text: str, name: str) -> float:
    """Sum of a series' samples over all label sets, from the text exposition."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith((f"{name}{{", f"{name} ")):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.timeout(60)
def test_alert_rules_pass_promtool_check_rules() -> None:
    p = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SUCCESS" in p.stdout + p.stderr


@pytest.mark.timeout(120)
def test_a_scrape_taken_during_a_standalone_run_passes_promtool_check_metrics(
        tmp_path: Path) -> None:
    tool = promtool()
    port = free_port()
    (tmp_path / "offloadd.toml").write_text(CONFIG.format(port=port))
    with (tmp_path / "standalone.log").open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "offloadd", "standalone", "--json", "--duration", "15",
             "--config", "offloadd.toml", "--topics", "3", "--rate", "3000000"],
            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=log)
    base = f"http://127.0.0.1:{port}"
    scrape = ""
    try:
        # mid-run: ready, and blocks of every topic already in the tier
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and proc.poll() is None:
            status, body = get(f"{base}/metrics")
            if (status == 200 and body.count("offloadd_offloaded_bytes_total{") >= 3
                    and sample(body, "offloadd_offloaded_bytes_total") > 0
                    and get(f"{base}/readyz")[0] == 200):
                scrape = body
                break
            time.sleep(0.5)
        assert scrape, ("no scrape with 3 topics' offloaded bytes before the run ended:\n"
                        + (tmp_path / "standalone.log").read_text()[-3000:])
        assert proc.poll() is None, "the scrape must be taken while the daemon runs"
    finally:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 0, (tmp_path / "standalone.log").read_text()[-3000:]

    (tmp_path / "scrape.txt").write_text(scrape)
    with (tmp_path / "scrape.txt").open("rb") as f:
        p = subprocess.run([tool, "check", "metrics"], stdin=f, capture_output=True, text=True,
                           timeout=30)
    assert p.returncode == 0, p.stdout + p.stderr
    # what the run itself should show: the limit, Pulsar's names, waits for the budget
    assert sample(scrape, "offloadd_throttle_limit_bytes_per_second") == 4_000_000
    assert "brk_ledgeroffloader_ledger_offload_limited_total{" in scrape
    assert "brk_ledgeroffloader_offload_rate{" in scrape
