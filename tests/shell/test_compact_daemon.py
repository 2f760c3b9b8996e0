"""The daemon's background merger (``[compact] enabled``) on a real ``offloadd standalone``: a
topic rolled every fraction of a second is merged while it is written, under the topic task's own
fence; everything written reads back, ``verify`` passes, gc deletes the merged-away objects and
finds no orphan; ``status`` says the store's create-only writes are on (the filesystem's link)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import crc32c
import pytest

from tests.test_e2e_standalone import run, source_crcs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

CONFIG = """
[offload]
max_segment_rollover_time_minutes = 0.004
deletion_lag_ms = 0
[compact]
enabled = true
interval_s = 1.0
target_mbytes = 0.1
[retention]
orphan_grace_s = 36000
[metrics]
bind = "127.0.0.1:0"
"""


def test_the_daemon_merges_small_segments_while_the_topic_is_written(tmp_path: Path) -> None:
    (tmp_path / "c.toml").write_text(CONFIG)
    out = run(["standalone", "--json", "--config", "c.toml", "--duration", "8", "--rate", "40000",
               "--entry-size", "400", "--topics", "1"], tmp_path, timeout=150)
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["drained"] is not False, summary
    st = json.loads(run(["status", "--config", "c.toml", "--json"], tmp_path).stdout)
    assert st["conditional_writes"]["on"] and "link(2)" in st["conditional_writes"]["how"]
    text = run(["status", "--config", "c.toml"], tmp_path).stdout
    assert "conditional writes on: objects are published with link(2)" in text, text
    topic = st["topics"][0]["topic"]
    rep = json.loads(run(["verify", "--config", "c.toml", "--json"], tmp_path).stdout)
    assert rep["ok"], rep
    lines = run(["read", "--config", "c.toml", "--topic", topic], tmp_path).stdout.splitlines()
    got = [(p, crc32c.crc32c(base64.b64decode(b))) for p, b in (ln.split("\t") for ln in lines)]
    assert got == source_crcs(tmp_path, topic)  # every entry once, in order
    gc = json.loads(run(["gc", "--config", "c.toml", "--json", "--grace", "0"],
                        tmp_path).stdout)
    merged_away = [d for d in gc["deleted_segments"] if d["state"] == "deleted"]
    assert gc["ok"] and merged_away, gc  # only merges delete segments here (no retention)
    assert gc["orphans_removed"] == [], gc
    rep = json.loads(run(["verify", "--config", "c.toml", "--json"], tmp_path).stdout)
    assert rep["ok"] and rep["orphans"] == [], rep
