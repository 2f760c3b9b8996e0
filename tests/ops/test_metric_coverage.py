"""Every metric name the shipped dashboard, alert rules and docs/metrics.md mention appears in a
live scrape.

A real ``offloadd run`` (S3 on moto_server behind a fault proxy) offloads a topic through a few
failed part uploads, reads its segments back (the read-back check), then fails those reads (the
proxy answers every GET with 500) so read errors are counted; an ``offloadd backfill`` on Spark
uploads another topic's history and is scraped while it runs. Each name is then looked up in
what the two endpoints served: a family must have at least one sample, a sample name must be
there. The BookKeeper source's own series (their section in docs/metrics.md) need a sidecar
set-up and are left out here.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterable
from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped]  # PyYAML arrives with moto[server]
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.faultproxy import FaultPlan, FaultProxy
from tests.fixtures.s3 import MotoBucket, moto_server, s3_bucket
from tests.ops.support import OFFLOADD, DaemonProcess, offloadd, wait_for

__all__ = ["moto_server", "s3_bucket"]

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "offloadd-rules.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "offloadd-dashboard.json"
METRICS_MD = ROOT / "docs" / "metrics.md"

# a name, where "_{a,b}" stands for two (a brace group needs a comma, so a PromQL label matcher
# such as {namespace=~"..."} ends the name)
NAME = re.compile(r"(?<![A-Za-z0-9_:])(?:brk_ledgeroffloader|offloadd)_"
                  r"(?:[A-Za-z0-9_:]|\{[A-Za-z0-9_]+(?:,[A-Za-z0-9_]+)+\})*")
LIVE = "persistent://public/default/live-0"
HISTORY = "persistent://public/default/history"


# ---- where names are mentioned -----------------------------------------------------------------
def _expand(name: str) -> list[str]:
    """``a_{b,c}_d`` → ``a_b_d``, ``a_c_d`` (docs write summaries' series that way)."""
    m = re.search(r"\{([^{}]*)\}", name)
    if m is None:
        return [name]
    return [x for alt in m.group(1).split(",")
            for x in _expand(name[:m.start()] + alt + name[m.end():])]


def _names(text: str) -> set[str]:
    out = set()
    for raw in NAME.findall(text):
        for name in _expand(raw):
            # "offloadd_*", "X_" prefixes in prose are not names
            if not name.endswith("_") and "{" not in name and "}" not in name:
                out.add(name)
    return out


def rule_names() -> set[str]:
    doc = yaml.safe_load(RULES.read_text())
    return _names(" ".join(r["expr"] for g in doc["groups"] for r in g["rules"]))


def dashboard_names() -> set[str]:
    d = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
    exprs += [v.get("definition", "") for v in d["templating"]["list"]]
    return _names(" ".join(exprs))


def docs_names() -> set[str]:
    text = METRICS_MD.read_text()
    # the BookKeeper source's series need a sidecar set-up (see the module docstring)
    text = text.split("## BookKeeper source", 1)[0]
    return _names(text)


def test_names_are_found_where_they_are_written() -> None:
    """The extraction itself: the dashboard's summaries and the docs' brace forms expand."""
    assert "brk_ledgeroffloader_read_offload_index_latency_count" in docs_names()
    assert "offloadd_source_read_duration_seconds_bucket" in dashboard_names()
    assert "offloadd_ledgers_lost_to_retention_total" in rule_names()
    assert _expand("x_{a,b}_y_{1,2}") == ["x_a_y_1", "x_a_y_2", "x_b_y_1", "x_b_y_2"]


# ---- the live scrape ---------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


def present(text: str) -> set[str]:
    """Family names with at least one sample, and every sample name."""
    out = set()
    for fam in text_string_to_metric_families(text):
        if fam.samples:
            out.add(fam.name)
            out.update(s.name for s in fam.samples)
    return out


def value(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


CONFIG = """
[metadata]
url = "embedded:{root}/data/metadata"
[source]
path = "{root}/data/ledgers"
topics = {topics}
rollover_bytes = 131072
[blobstore]
driver = "aws-s3"
bucket = "{bucket}"
endpoint = "{endpoint}"
access_key_id = "testing"
secret_access_key = "testing"
max_attempts = 1
read_timeout_s = 5
min_part_size_bytes = 4
part_size_bytes = 32768
[offload]
max_size_per_segment_mbytes = 0.1
max_segment_rollover_time_minutes = 0.01
max_block_size_bytes = 32768
min_block_size_bytes = 0
retry_base_s = 0.2
retry_max_s = 1.0
read_check_interval_s = 0.3
[metrics]
bind = "127.0.0.1:{port}"
topic_level = {topic_level}
[daemon]
pid_file = "{root}/data/{name}.pid"
shutdown_deadline_s = 5
"""


def write_config(root: Path, name: str, bucket: MotoBucket, endpoint: str, port: int,
                 topics: Iterable[str], topic_level: str = '"auto"') -> Path:
    p = root / f"{name}.toml"
    p.write_text(CONFIG.format(root=root, bucket=bucket.name, endpoint=endpoint, port=port,
                               name=name, topics=json.dumps(list(topics)),
                               topic_level=topic_level))
    return p


def produce(root: Path, cfg: Path, topic: str, nbytes: int) -> int:
    out = offloadd(["produce", "--json", "--config", str(cfg), "--topic", topic, "--bytes",
                    str(nbytes),
                    "--entry-size", "1000"], root)
    return int(json.loads(out.stdout)["entries"])


@pytest.mark.timeout(240)
@pytest.mark.parametrize("topic_level", ["true", "false"])
def test_every_metric_the_deploy_files_and_docs_name_appears_in_a_live_scrape(
        tmp_path: Path, s3_bucket: MotoBucket, topic_level: str) -> None:
    """Both ``[metrics] topic_level`` modes serve every name; off, no series has a topic label.
    The backfill's endpoint does not depend on the switch: it is scraped in the first run."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    with FaultProxy(s3_bucket.endpoint, seed=3) as proxy:
        # the first two part uploads fail: offload errors, retried
        proxy.plan = FaultPlan(error_500=1.0, target="PUT ", limit=2)
        cfg = write_config(tmp_path, "run", s3_bucket, proxy.url, port, [LIVE], topic_level)
        d = DaemonProcess(tmp_path, cfg)
        try:
            d.wait_logged("ready", timeout=60)
            n = produce(tmp_path, cfg, LIVE, 300_000)
            wait_for(lambda: value(scrape(url), "offloadd_offloaded_entries_total") >= n, 60,
                     "the live topic committed")
            # the read-back check read the newest segment
            wait_for(lambda: value(scrape(url), "brk_ledgeroffloader_read_offload_index_latency"
                                   "_count") >= 1, 30, "a read-back check")
            # from now on no GET succeeds: the next check fails and is counted
            proxy.plan = FaultPlan(error_500=1.0, target="GET ")
            m = produce(tmp_path, cfg, LIVE, 50_000)
            wait_for(lambda: value(scrape(url), "offloadd_offloaded_entries_total") >= n + m, 60,
                     "the second batch committed")
            wait_for(lambda: value(scrape(url), "brk_ledgeroffloader_read_offload_error_total")
                     >= 1, 30, "a failed read-back counted")
            proxy.plan = FaultPlan()

            backfill_text = run_backfill(tmp_path, s3_bucket) if topic_level == "true" else ""
            daemon_text = scrape(url)
        finally:
            assert d.stop() == 0
    assert value(daemon_text, "brk_ledgeroffloader_offload_error_total") >= 1
    assert value(daemon_text, "brk_ledgeroffloader_write_storage_error_total") >= 1
    if topic_level == "false":
        assert "topic=" not in daemon_text
    seen = present(daemon_text) | present(backfill_text)
    wanted = {"rules": rule_names(), "dashboard": dashboard_names(), "docs": docs_names()}
    if not backfill_text:
        wanted = {where: {n for n in names if not n.startswith("offloadd_backfill_")}
                  for where, names in wanted.items()}
    # the lakehouse's series need [lakehouse] on: tests/lakehouse/test_clients.py scrapes them
    wanted = {where: {n for n in names if not n.startswith("offloadd_lakehouse_")}
              for where, names in wanted.items()}
    missing = {where: sorted(names - seen) for where, names in wanted.items() if names - seen}
    assert not missing, f"named but never scraped: {missing}"


def run_backfill(root: Path, bucket: MotoBucket) -> str:
    """``offloadd backfill`` of a second topic's history, straight to moto; its own endpoint
    scraped while it runs (the last answer that shows the plan)."""
    port = _free_port()
    cfg = write_config(root, "backfill", bucket, bucket.endpoint, port, [HISTORY])
    produce(root, cfg, HISTORY, 400_000)
    url = f"http://127.0.0.1:{port}/metrics"
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": OFFLOADD[0], "PYSPARK_DRIVER_PYTHON": OFFLOADD[0]}
    proc = subprocess.Popen([*OFFLOADD, "backfill", "--json", "--config", str(cfg), "--topic",
                             HISTORY,
                             "--master", "local[1]", "--metrics-bind", f"127.0.0.1:{port}"],
                            cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    last = ""
    try:
        deadline = time.monotonic() + 180
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                text = scrape(url)
            except OSError:
                time.sleep(0.05)
                continue
            if value(text, "offloadd_backfill_segments", state="planned") > 0:
                last = text
            time.sleep(0.05)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, err[-3000:]
    assert json.loads(out)["offloaded_segments"] >= 2, out
    assert last, "the backfill's endpoint never answered with its plan"
    return last
