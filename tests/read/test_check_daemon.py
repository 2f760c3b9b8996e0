"""Production shape for the daemon's read-back check: ``offloadd run`` with the default
``[offload]`` block sizes (blocks of up to 64 MiB, far longer than the head the check fetches)
and the check on. It must read healthy segments back without a single read error: a false
failure fires ``OffloaddReadErrors`` for ever and counts a Pulsar read error each interval."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.ops.support import DaemonProcess, offloadd, wait_for
from tests.ops.test_offload_now import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOPIC = "persistent://public/default/check"

# every [offload] size at its default; only the rollover time is short, so that segments close
CONFIG = """
[source]
rollover_minutes = 600
[offload]
max_segment_rollover_time_minutes = 0.02
read_check_interval_s = 0.3
[blobstore]
path = "data/tier"
[metrics]
bind = "127.0.0.1:{port}"
[daemon]
shutdown_deadline_s = 5
"""


def value(url: str, name: str) -> float:
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name == name)


def test_the_read_back_check_passes_on_default_sized_blocks(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    cfg = tmp_path / "offloadd.toml"
    cfg.write_text(CONFIG.format(port=port))
    d = DaemonProcess(tmp_path, cfg)
    try:
        d.wait_logged("ready", timeout=60)
        out = offloadd(["produce", "--json", "--config", str(cfg), "--topic", TOPIC, "--bytes",
                        "600000",
                        "--entry-size", "1000"], tmp_path)
        n = int(json.loads(out.stdout)["entries"])
        wait_for(lambda: value(url, "offloadd_offloaded_entries_total") >= n, 60,
                 "the topic committed")
        # a check reads the index, then the head of the last block (a block of ~600 KB)
        wait_for(lambda: value(url, "brk_ledgeroffloader_read_offload_data_latency_count")
                 >= 1, 30, "a read-back check reached the data")
        index_reads = value(url, "brk_ledgeroffloader_read_offload_index_latency_count")
        assert index_reads >= 1
        errors = value(url, "brk_ledgeroffloader_read_offload_error_total")
        warned = [r for r in d.logs() if str(r.get("level")).lower() == "error" or
                  "back from the tier failed" in str(r.get("msg", ""))]
    finally:
        assert d.stop() == 0
    assert errors == 0, [r.get("msg") for r in warned]
    assert not warned, warned
