"""The conditional-write fence after a failed probe (issue 23 item 9): a daemon started before
its bucket exists probes again until the store answers, and says so — in ``/status``, in the
record ``offloadd status`` reads, and in ``offloadd_conditional_writes`` (the series the
OffloaddConditionalWritesOff alert watches). It used to stay "off (the probe failed:
NoSuchBucket)" until a restart. Real S3 (moto_server), a real Runtime and Daemon."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import boto3
import pytest

from offloadd import config as config_mod
from offloadd.commit.ownership import Ownership
from offloadd.shell.runtime import Runtime
from offloadd.shell.status import collect
from tests.fixtures.s3 import moto_server

__all__ = ["moto_server"]


def _gauge(rt: Runtime) -> float | None:
    return rt.metrics.registry.get_sample_value("offloadd_conditional_writes",
                                             {"store": "blobstore"})


@pytest.mark.integration
@pytest.mark.timeout(120)
async def test_the_fence_is_probed_again_once_the_bucket_exists(
        moto_server: str, tmp_path: Path) -> None:
    bucket = f"late-{uuid.uuid4().hex[:12]}"
    cfg = tmp_path / "offloadd.toml"
    cfg.write_text(f"""
[metadata]
url = "embedded:{tmp_path}/metadata"
[source]
path = "{tmp_path}/ledgers"
[blobstore]
driver = "aws-s3"
endpoint = "{moto_server}"
bucket = "{bucket}"
region = "us-east-1"
access_key_id = "testing"
secret_access_key = "testing"
request_timeout_s = 2.0
[metrics]
enabled = false
""")
    settings = config_mod.load(str(cfg))
    rt = await Runtime.open(settings, ownership=Ownership())
    try:
        assert rt.tier is not None and rt.tier.fence is not None
        before = rt.tier.fence.conditional
        assert not before.on and "NoSuchBucket" in before.how, before
        assert _gauge(rt) == 0
        st = await collect(settings)
        assert st["conditional_writes"]["on"] is False

        boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1",
                     aws_access_key_id="testing", aws_secret_access_key="testing"
                     ).create_bucket(Bucket=bucket)
        rt.daemon.fence_probe_interval_s = 0.2
        running = asyncio.create_task(rt.daemon.run(install_signals=False))
        try:
            async with asyncio.timeout(60):
                while not (rt.tier.fence.conditional.on and _gauge(rt) == 1):
                    assert not running.done(), running
                    await asyncio.sleep(0.1)
            assert rt.daemon.status()["conditional_writes"]["on"] is True
            async with asyncio.timeout(30):  # the record is written after the probe returns
                while not (await collect(settings))["conditional_writes"]["on"]:
                    await asyncio.sleep(0.1)
        finally:
            rt.daemon.request_stop()
            await asyncio.wait_for(running, 30)
    finally:
        await rt.close()


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_the_fence_off_alert_fires_on_zero_only(tmp_path: Path) -> None:
    """OffloaddConditionalWritesOff (promtool test rules): fires for the instance whose fence
    stayed off 15 minutes, not for one whose fence came on after a re-probe."""
    import shutil
    import subprocess

    import yaml  # type: ignore[import-untyped]  # PyYAML arrives with moto[server]

    tool = shutil.which("promtool")
    if tool is None:
        pytest.skip("promtool not installed (Debian package prometheus; scripts/setup --servers)")
    rules = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "offloadd-rules.yml"
    case = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                {"series": 'offloadd_conditional_writes{instance="off",store="blobstore"}',
                 "values": "0x30"},
                {"series": 'offloadd_conditional_writes{instance="late",store="blobstore"}',
                 "values": "0x5 1x25"},
                {"series": 'offloadd_conditional_writes{instance="on",store="blobstore"}',
                 "values": "1x30"},
            ],
            "alert_rule_test": [{
                "eval_time": "25m",
                "alertname": "OffloaddConditionalWritesOff",
                "exp_alerts": [{
                    "exp_labels": {"instance": "off", "store": "blobstore",
                                   "severity": "warning"},
                    "exp_annotations": {
                        "runbook_url": "docs/runbook.md#offloaddconditionalwritesoff",
                        "summary": "Conditional-write fence off on off",
                        "description": "The blobstore does not refuse overwrites (or its probe "
                        "has not been answered): a stale writer could replace committed "
                        "objects. offloadd status shows why; set [blobstore] "
                        'conditional_writes = "off" if the store cannot do it.'},
                }],
            }],
        }],
    }
    test_file = tmp_path / "fence-test.yml"
    test_file.write_text(yaml.safe_dump(case))
    p = subprocess.run([tool, "test", "rules", str(test_file)], capture_output=True, text=True,
                       timeout=60, check=False)
    assert p.returncode == 0, p.stdout + p.stderr
