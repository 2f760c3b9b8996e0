"""Signals on a real ``offloadd run`` process, with a separate ``offloadd produce`` writing:
SIGUSR1 and ``offloadd offload-now`` close the open segment now, SIGHUP applies a new throttle
to running work, SIGTERM in the middle of an upload exits 0 in time and a restart finishes the
job so that ``offloadd verify`` is clean."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.ops.support import DaemonProcess, committed_entries, ml, offloadd, wait_for

pytestmark = pytest.mark.integration

# Only a signal closes a segment here: every size and time limit is far away.
BASE = """
[source]
rollover_minutes = 600
rollover_bytes = 1073741824
rollover_entries = 10000000
[offload]
max_segment_rollover_time_minutes = 600
max_size_per_segment_mbytes = 1024
{offload}
[retention]
orphan_grace_s = 200000
[metrics]
enabled = false
[daemon]
shutdown_deadline_s = {deadline}
{daemon}
"""


def make_config(tmp_path: Path, *, offload: str = "", daemon: str = "",
                deadline: float = 5) -> Path:
    p = tmp_path / "offloadd.toml"
    p.write_text(BASE.format(offload=offload, daemon=daemon, deadline=deadline))
    return p


def produce(tmp_path: Path, cfg: Path, topic: str, nbytes: int, entry_size: int = 1024) -> int:
    out = offloadd(["produce", "--json", "--config", str(cfg), "--topic", topic, "--bytes",
                    str(nbytes),
                    "--entry-size", str(entry_size)], tmp_path)
    return int(json.loads(out.stdout)["entries"])


@pytest.mark.timeout(90)
def test_sigusr1_makes_the_open_segment_readable_within_two_seconds(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    topic = "persistent://public/default/usr1"
    d = DaemonProcess(tmp_path, cfg)
    try:
        d.wait_logged("ready")
        n = produce(tmp_path, cfg, topic, 200_000)
        d.wait_logged(f"offloading topic {topic}")
        time.sleep(1.5)  # the daemon has read the entries into a segment it keeps open
        assert committed_entries(tmp_path).get(ml(topic), 0) == 0
        d.signal(signal.SIGUSR1)
        wait_for(lambda: committed_entries(tmp_path).get(ml(topic)) == n, 2.0,
                 "the segment closed by SIGUSR1 to be committed")
        lines = offloadd(["read", "--config", str(cfg), "--topic", topic], tmp_path
                         ).stdout.splitlines()
        assert len(lines) == n and lines[0].startswith("0:0\t")
        assert d.stop() == 0
    finally:
        d.close()


@pytest.mark.timeout(90)
def test_offload_now_finds_the_daemon_and_closes_the_topics_asked_for(tmp_path: Path) -> None:
    """Without --topic, SIGUSR1 closes the topics [daemon] offload_now_topics names; with
    --topic, exactly those."""
    cfg = make_config(tmp_path, daemon='offload_now_topics = ["persistent://public/default/a*"]')
    a, b = "persistent://public/default/a1", "persistent://public/default/b1"
    d = DaemonProcess(tmp_path, cfg)
    try:
        d.wait_logged("ready")
        na = produce(tmp_path, cfg, a, 50_000)
        nb = produce(tmp_path, cfg, b, 50_000)
        d.wait_logged(f"offloading topic {a}")
        d.wait_logged(f"offloading topic {b}")
        out = offloadd(["offload-now", "--config", str(cfg)], tmp_path)
        assert str(d.pid) in out.stdout
        second = offloadd(["run", "--config", str(cfg)], tmp_path, check=False)
        assert second.returncode == 1
        assert f"another offloadd (pid {d.pid}) is running" in second.stderr
        wait_for(lambda: committed_entries(tmp_path).get(ml(a)) == na, 10, "topic a committed")
        time.sleep(1.0)  # give a wrong trigger of b the time to show
        assert committed_entries(tmp_path).get(ml(b), 0) == 0
        offloadd(["offload-now", "--config", str(cfg), "--topic", b], tmp_path)
        wait_for(lambda: committed_entries(tmp_path).get(ml(b)) == nb, 10, "topic b committed")
        assert d.stop() == 0
        assert not (tmp_path / "data" / "offloadd.pid").exists()
    finally:
        d.close()


def test_offload_now_without_a_daemon_says_so(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    out = offloadd(["offload-now", "--config", str(cfg)], tmp_path, check=False)
    assert out.returncode == 1
    assert "no daemon pid file" in out.stderr


def _rate(tmp_path: Path, topic: str, seconds: float) -> float:
    """Entries per second committed over a window of about ``seconds``."""
    t0, c0 = time.monotonic(), committed_entries(tmp_path).get(ml(topic), 0)
    time.sleep(seconds)
    t1, c1 = time.monotonic(), committed_entries(tmp_path).get(ml(topic), 0)
    return (c1 - c0) / (t1 - t0)


@pytest.mark.timeout(120)
def test_sighup_with_a_lower_throttle_slows_the_measured_offload_rate(tmp_path: Path) -> None:
    # small segments and blocks: the committed count moves in small steps
    offload = ("max_block_size_bytes = 16384\nflow_permits_per_second = {rate}\n"
               "[topics.\"persistent://public/default/hup\"]\n"
               "max_size_per_segment_mbytes = 0.0625\n")
    cfg = make_config(tmp_path, offload=offload.format(rate=400_000))
    topic = "persistent://public/default/hup"
    n = produce(tmp_path, cfg, topic, 12_000_000)  # a backlog: the throttle is the limit
    d = DaemonProcess(tmp_path, cfg)
    try:
        d.wait_logged(f"offloading topic {topic}")
        wait_for(lambda: committed_entries(tmp_path).get(ml(topic), 0) > 0, 20,
                 "the first segment")
        before = _rate(tmp_path, topic, 4.0)
        cfg.write_text(cfg.read_text().replace("400000", "100000"))
        d.signal(signal.SIGHUP)
        d.wait_logged("configuration reloaded: flow_permits_per_second=100000")
        time.sleep(1.0)  # parts granted at the old rate drain first
        after = _rate(tmp_path, topic, 4.0)
        assert committed_entries(tmp_path)[ml(topic)] < n  # still throttled, not done
        assert before > 0 and after < 0.5 * before, (before, after)
        assert after > 0  # the reload slowed the work down; it did not drop it
        assert d.proc.poll() is None  # SIGHUP reloads, it does not stop
        assert d.stop() == 0
    finally:
        d.close()


@pytest.mark.timeout(150)
def test_sigterm_during_an_upload_exits_0_in_time_and_a_restart_leaves_verify_clean(
        tmp_path: Path) -> None:
    deadline = 2.0
    # parts of one 64 KiB block (the default 8 MiB part would still be filling at the signal)
    cfg = make_config(tmp_path, deadline=deadline,
                      offload="max_block_size_bytes = 65536\nflow_permits_per_second = 100000\n"
                      "[blobstore]\npart_size_bytes = 65536\n")
    topic = "persistent://public/default/term"
    n = produce(tmp_path, cfg, topic, 2_000_000)
    d = DaemonProcess(tmp_path, cfg)
    try:
        d.wait_logged(f"offloading topic {topic}")
        time.sleep(1.5)  # parts are uploading, 100 kB/s against 2 MB held
        t0 = time.monotonic()
        d.signal(signal.SIGTERM)
        rc = d.proc.wait(deadline + 15)
        took = time.monotonic() - t0
        assert rc == 0
        assert took < deadline + 15
        assert d.logged("shutdown deadline")  # it really was in the middle of an upload
    finally:
        d.close()
    assert committed_entries(tmp_path).get(ml(topic), 0) < n
    # restart without the throttle (an environment override): the rest is offloaded
    env = dict(os.environ, OFFLOADD_OFFLOAD__FLOW_PERMITS_PER_SECOND="0")
    d2 = DaemonProcess(tmp_path, cfg, env=env, name="restart")
    try:
        def all_committed() -> bool:
            if committed_entries(tmp_path).get(ml(topic), 0) == n:
                return True
            d2.signal(signal.SIGUSR1)  # close whatever segment is open
            return False

        d2.wait_logged(f"offloading topic {topic}")
        wait_for(all_committed, 60, "every entry to be committed after the restart", every=1.0)
        assert d2.stop() == 0
    finally:
        d2.close()
    rep = json.loads(offloadd(["verify", "--config", str(cfg), "--json", "--orphan-grace", "0"],
                              tmp_path).stdout)
    assert rep["ok"], rep
    t = rep["topics"][0]
    assert t["entries"] == n and t["gaps"] == [] and t["duplicates"] == 0
    assert rep["orphans"] == []


@pytest.mark.timeout(60)
def test_sighup_with_a_broken_config_keeps_the_running_one(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    d = DaemonProcess(tmp_path, cfg)
    try:
        d.wait_logged("ready")
        cfg.write_text(cfg.read_text() + "\n[offload]\nmode = \"tiered\"\n")
        d.signal(signal.SIGHUP)
        d.wait_logged("configuration not reloaded, keeping the old one")
        assert d.proc.poll() is None
        assert d.stop() == 0
    finally:
        d.close()
