"""Production shape, end to end (issue 23, acceptance): ``offloadd run`` with every ``[offload]``
size at its default (64 MiB blocks, 64 MiB segments, 10-minute rollover), metadata on a real
ZooKeeper, the tier on an S3 server (moto_server), the read-back check on, a live writer on a
few topics and a 70 s daemon life. Segments close by ``offload-now --wait`` (as an operator
would), not by demo-sized roll settings, so the blocks are as long as the data written between
two closes — far over the 64 KiB the read-back check fetches. The bar: zero read errors, zero
offload errors, zero ERROR lines, a clean SIGTERM, ``verify`` OK and every entry offloaded."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.s3 import MotoBucket, moto_server, s3_bucket
from tests.fixtures.zookeeper import zk_server
from tests.ops.support import OFFLOADD, DaemonProcess, offloadd, wait_for, zk_chroot
from tests.ops.test_offload_now import free_port

__all__ = ["moto_server", "s3_bucket", "zk_server"]  # fixtures used below

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

LIFE_S = 70.0  # the daemon's life, from "ready" to SIGTERM
WRITE_S = 40  # the live writer's run, inside that life
TOPICS = 3

# No [offload] size, no [source] roll setting: the defaults. Only the read-back check's
# interval is short, so that it runs many times within the daemon's life.
CONFIG = """
[metadata]
url = "zk://{zk}{chroot}"
[blobstore]
driver = "aws-s3"
endpoint = "{endpoint}"
bucket = "{bucket}"
region = "us-east-1"
access_key_id = "testing"
secret_access_key = "testing"
[offload]
read_check_interval_s = 2
[metrics]
bind = "127.0.0.1:{port}"
[daemon]
log_format = "json"
"""


def metric(url: str, name: str) -> float:
    """The sum of a series over all its labels (0 if absent)."""
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name == name)


def offload_now(cfg: Path, cwd: Path) -> None:
    p = offloadd(["offload-now", "--config", str(cfg), "--wait", "--timeout", "60", "--json"],
                 cwd, timeout=90)
    assert p.returncode == 0, p


def test_a_70s_daemon_life_in_production_shape(zk_server: str, s3_bucket: MotoBucket,
                                                tmp_path: Path) -> None:
    chroot = zk_chroot(zk_server, "production-shape")
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    cfg = tmp_path / "offloadd.toml"
    cfg.write_text(CONFIG.format(zk=zk_server, chroot=chroot, endpoint=s3_bucket.endpoint,
                                 bucket=s3_bucket.name, port=port))

    d = DaemonProcess(tmp_path, cfg)
    try:
        d.wait_logged("ready", timeout=60)
        born = time.monotonic()
        # the live writer: a few topics at a steady rate, ~0.4 MB per topic between two closes
        writer = subprocess.Popen(
            [*OFFLOADD, "produce", "--json", "--config", str(cfg), "--topics", str(TOPICS),
             "--duration", str(WRITE_S), "--rate", "120000", "--entry-size", "2000"],
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            for _ in range(3):  # close segments while the writer writes
                time.sleep(WRITE_S / 4)
                offload_now(cfg, tmp_path)
            out, err = writer.communicate(timeout=WRITE_S + 60)
        finally:
            if writer.poll() is None:
                writer.kill()
                writer.wait(10)
        assert writer.returncode == 0, err
        produced = json.loads(out)
        n = int(produced["entries"])
        assert n > 0 and len(produced["topics"]) == TOPICS
        offload_now(cfg, tmp_path)  # the rest of what was written
        wait_for(lambda: metric(url, "offloadd_offloaded_entries_total") >= n, 60,
                 "every entry committed")
        # the check reads the index and the head of each topic's newest segment's last block
        wait_for(lambda: metric(url, "brk_ledgeroffloader_read_offload_data_latency_count")
                 >= TOPICS, 30, "read-back checks reached the data")
        time.sleep(max(0.0, LIFE_S - (time.monotonic() - born)))
        checks = metric(url, "brk_ledgeroffloader_read_offload_index_latency_count")
        read_errors = metric(url, "brk_ledgeroffloader_read_offload_error_total")
        offload_errors = metric(url, "brk_ledgeroffloader_offload_error_total")
        write_errors = metric(url, "brk_ledgeroffloader_write_storage_error_total")
        offloaded = metric(url, "offloadd_offloaded_entries_total")
    finally:
        code = d.stop()
    log = d.log_path.read_text()
    records = d.logs()
    errors = [r for r in records if str(r.get("level", "")).lower() in ("error", "critical")]
    assert code == 0, log[-3000:]
    assert checks >= TOPICS
    assert read_errors == 0, [r.get("msg") for r in records if "tier" in str(r.get("msg"))]
    assert offload_errors == 0 and write_errors == 0
    assert offloaded == n
    assert errors == [], errors
    assert "passwd" not in log, "kazoo's Connect request (the session password) in the log"

    v = offloadd(["verify", "--config", str(cfg), "--json"], tmp_path, timeout=120,
                 check=False)
    assert v.returncode == 0, v.stdout + v.stderr
    report = json.loads(v.stdout)
    assert report["ok"] and report["orphans"] == []
    by_topic = {t["topic"]: t for t in report["topics"]}
    assert sorted(by_topic) == sorted(produced["topics"])
    assert sum(t["entries"] for t in by_topic.values()) == n  # every entry written, offloaded
    for t in by_topic.values():
        assert t["gaps"] == [] and t["duplicates"] == 0 and t["assigned"] == 0, t
        assert t["source_checked"] == t["entries"] and t["source_mismatches"] == 0, t
        # still production shape: several segments a topic, each (one block) over 64 KiB
        assert t["segments"] >= 3, t
        assert t["bytes"] / t["segments"] > 64 * 1024, t
