"""The offload threshold on a real daemon: the newest ``threshold_bytes`` of a topic stay only in
the source, everything older is offloaded, and ``offload-now --wait`` knows the difference."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tests.ops.support import DaemonProcess, committed_entries, ml, offloadd

pytestmark = pytest.mark.integration

TOPIC = "persistent://public/default/held"
ENTRY = 1000
THRESHOLD = 100_000  # 100 entries
LEDGER = 50_000  # about 50 entries per ledger

CONFIG = """
[source]
rollover_bytes = {ledger}
rollover_minutes = 600
[offload]
managedLedgerOffloadThresholdInBytes = {threshold}
max_segment_rollover_time_minutes = 0.01
[metrics]
bind = "127.0.0.1:{port}"
[daemon]
shutdown_deadline_s = 5
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(120)
def test_the_newest_threshold_bytes_stay_in_the_source(tmp_path: Path) -> None:
    cfg = tmp_path / "offloadd.toml"
    cfg.write_text(CONFIG.format(ledger=LEDGER, threshold=THRESHOLD, port=free_port()))
    out = offloadd(["produce", "--json", "--config", str(cfg), "--topic", TOPIC, "--bytes",
                    "300000",
                    "--entry-size", str(ENTRY)], tmp_path)
    n = int(json.loads(out.stdout)["entries"])
    d = DaemonProcess(tmp_path, cfg)
    try:
        d.wait_logged("ready")
        d.wait_logged(f"offloading topic {TOPIC}")
        res = offloadd(["offload-now", "--config", str(cfg), "--wait", "--timeout", "60"],
                       tmp_path)
        # committed now, or already before the command asked ("nothing" left to close)
        assert res.stdout.startswith((f"{TOPIC}: committed up to ", f"{TOPIC}: nothing")), \
            res.stdout
        done = committed_entries(tmp_path)[ml(TOPIC)]
        # never early: at least THRESHOLD bytes follow the last offloaded entry; at most one
        # ledger more than that stays behind (ledger boundaries are exact marks)
        assert (n - done) * ENTRY >= THRESHOLD
        assert (n - done) * ENTRY <= THRESHOLD + LEDGER + 2 * ENTRY, (n, done)
        assert d.stop() == 0
    finally:
        d.close()
