"""Bad input at the cluster's edges: no ZooKeeper to talk to, and one topic whose managed-ledger
node holds junk while the others keep offloading."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster._procs import DOMAIN, Rig

pytestmark = pytest.mark.integration

OFFLOADD = [sys.executable, "-m", "offloadd"]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once the socket is closed


@pytest.mark.timeout(60)
def test_run_exits_with_a_clear_error_when_zookeeper_is_unreachable(tmp_path: Path) -> None:
    cfg = tmp_path / "down.toml"
    cfg.write_text(f"""
[metadata]
url = "zk://127.0.0.1:{closed_port()}/offloadd"
connect_timeout_s = 2
[metrics]
enabled = false
[daemon]
pid_file = "{tmp_path}/d.pid"
""")
    p = subprocess.run([*OFFLOADD, "run", "--config", str(cfg)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=40)
    assert p.returncode != 0
    assert "could not connect to ZooKeeper" in p.stderr
    assert "127.0.0.1" in p.stderr
    assert not (tmp_path / "d.pid").exists()


@pytest.mark.timeout(120)
def test_a_corrupt_managed_ledger_is_named_while_the_other_topics_keep_offloading(
        tmp_path: Path, zk_server: str) -> None:
    rig = Rig(tmp_path, zk_server)
    bad = f"{DOMAIN}/bad"
    try:
        first = rig.produce("history", "--topic", "persistent://public/default/bad",
                            "--bytes", "200000")
        assert first.wait(60) == 0, rig.tail("history")
        rig.zk.set(f"{rig.chroot}/managed-ledgers/{bad}", b"\xff\xffnot a protobuf\xff")
        rig.produce("producer", "--topics", "2", "--duration", "6", "--rate", "300000")
        rig.start_daemon("d1")
        rig.wait(lambda: len(rig.topics()) == 3, 30, "the two good topics to appear")

        def good_committed() -> bool:
            c = rig.committed_or_error()
            return all(c[t] > 0 for t in ("topic-0", "topic-1"))

        rig.wait(good_committed, 40, "segments on the good topics")
        rig.wait(lambda: f"/managed-ledgers/{bad}" in rig.log("d1").read_text(), 20,
                 "the daemon to name the corrupt znode")
        assert rig.procs["d1"].poll() is None  # still running
        st = rig.run("d1", ["status", "--json"])
        # a topic whose metadata cannot be read is not offloading: status says so in its code
        assert st.returncode == 1, st.stderr
        doc = json.loads(st.stdout)
        topics = {t["topic"]: t for t in doc["topics"]}
        assert f"/managed-ledgers/{bad}" in topics["persistent://public/default/bad"]["error"]
        good = topics["persistent://public/default/topic-0"]
        assert good["segments"]["offloaded"] > 0
        assert (good["owner"], good["epoch"]) == ("d1", 1)
        assert [m["owner"] for m in doc["members"]] == ["d1"]
        text = rig.run("d1", ["status"]).stdout
        assert "members d1" in text and "owner d1 epoch 1" in text
        assert rig.wait_exit("producer", 30) == 0
        assert rig.stop("d1") == 0, rig.tail("d1")
        for t in ("topic-0", "topic-1"):
            v = rig.run("verifier", ["verify", "--json", "--topic",
                                     f"persistent://public/default/{t}"])
            rep = json.loads(v.stdout)
            assert rep["topics"][0]["ok"], rep
    finally:
        rig.close()
