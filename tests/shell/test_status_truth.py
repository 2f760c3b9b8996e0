"""``offloadd status`` telling the truth (issue 23 item 9): the tier's size after retention
deleted part of a segment, and a daemon killed under its own members record."""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from offloadd._proto import mldataformats_pb2 as pb
from offloadd.model import catalog
from offloadd.model.catalog import LedgerRange, TierUsage
from offloadd.model.cost import Prices, topic_cost
from offloadd.shell.status_view import _tier_text
from tests.ops.support import DaemonProcess, offloadd

DRIVER = catalog.driver_metadata("filesystem", {"managedLedgerOffloadDriver": "filesystem"})


def test_a_segment_keeps_its_usage_when_retention_deletes_its_first_ledger() -> None:
    """A segment over ledgers 3 and 5 committed with its usage; retention then deletes ledger 3
    (its LedgerInfo goes, as ``delete_ledger`` does) while entries of ledger 5 stay readable
    from the same objects: the tier still holds them, and status must say so — it said
    "tier: 0 objects, 0 B"."""
    info = pb.ManagedLedgerInfo()
    for lid, n in ((3, 10), (5, 4)):
        info.ledgerInfo.add(ledgerId=lid, entries=n)
    uid = uuid.uuid4()
    catalog.add_assigned(info, uid, (LedgerRange(3, 0, 9), LedgerRange(5, 0, 3)), 1000, DRIVER)
    usage = TierUsage(objects=2, stored_bytes=70_000, payload_bytes=65_536, put_requests=3)
    catalog.mark_offloaded(info, uid, 2000, ledger_ids=(3, 5), usage=usage)
    del info.ledgerInfo[0]  # retention: ledger 3 deleted
    (seg,) = catalog.segments(info)
    assert seg.complete and seg.ranges == (LedgerRange(5, 0, 3),)
    cost = topic_cost([seg], Prices(), 3000)
    assert cost.usage == usage and cost.unsized_segments == 0
    assert _tier_text(cost.as_dict(), "USD").startswith("tier: 2 objects, 68.4 KiB stored")


def test_a_merged_segment_keeps_its_usage_when_retention_deletes_its_first_ledger() -> None:
    info = pb.ManagedLedgerInfo()
    for lid, n in ((3, 10), (5, 4)):
        info.ledgerInfo.add(ledgerId=lid, entries=n)
    a, b, merged = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    catalog.add_assigned(info, a, (LedgerRange(3, 0, 9),), 1000, DRIVER)
    catalog.add_assigned(info, b, (LedgerRange(5, 0, 3),), 1000, DRIVER)
    catalog.mark_offloaded(info, a, 2000)
    catalog.mark_offloaded(info, b, 2000)
    usage = TierUsage(objects=2, stored_bytes=9_000, payload_bytes=8_000, put_requests=2)
    catalog.merge_segments(info, catalog.segments(info), merged, 3000, usage=usage)
    del info.ledgerInfo[0]
    (seg,) = catalog.segments(info)
    assert seg.uid == merged
    assert topic_cost([seg], Prices(), 4000).usage == usage


TOPIC = "persistent://public/default/killed"
CONFIG = """
[metrics]
bind = "127.0.0.1:{port}"
[daemon]
shutdown_deadline_s = 5
"""


@contextmanager
def producing_daemon(tmp_path: Path, cfg: Path) -> Iterator[DaemonProcess]:
    """``offloadd run`` on ``cfg`` once it is offloading a produced topic; closed on exit."""
    d = DaemonProcess(tmp_path, cfg)
    try:
        d.wait_logged("offloadd ready")
        offloadd(["produce", "--json", "--config", str(cfg), "--topic", TOPIC, "--bytes", "20000"],
                 tmp_path)
        d.wait_logged(f"offloading topic {TOPIC}")
        yield d
    finally:
        d.close()


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_status_of_a_killed_daemon_is_not_ok(tmp_path: Path) -> None:
    """kill -9 leaves the daemon's member and ownership records in the embedded store (only a
    write reaps them; status only reads) and its topic's last record says ok: status named
    the dead pid as a member, said "ok" and exited 0."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = tmp_path / "offloadd.toml"
    cfg.write_text(CONFIG.format(port=port))
    with producing_daemon(tmp_path, cfg) as d:
        offloadd(["offload-now", "--config", str(cfg), "--wait", "--timeout", "60"], tmp_path)
        alive = offloadd(["status", "--config", str(cfg), "--json"], tmp_path)
        assert json.loads(alive.stdout)["members"][0].get("alive") is True
        d.signal(signal.SIGKILL)
        d.proc.wait(30)
        p = offloadd(["status", "--config", str(cfg)], tmp_path, check=False)
        assert p.returncode == 1, p.stdout + p.stderr
        assert f"DEAD: pid {d.pid} is not running" in p.stdout, p.stdout
        assert "OWNER DEAD" in p.stdout and f"{TOPIC}: ok" not in p.stdout, p.stdout
        j = offloadd(["status", "--config", str(cfg), "--json"], tmp_path, check=False)
        st = json.loads(j.stdout)
        assert j.returncode == 1 and st["members"][0]["alive"] is False
        # the summary reads no owner node: the dead owner is the one its status record names
        sm = offloadd(["status", "--config", str(cfg), "--json", "--summary"], tmp_path,
                      check=False)
        summary = json.loads(sm.stdout)["summary"]
        assert sm.returncode == 1 and summary["by_state"] == {"failing": 1}, sm.stdout


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_verify_fails_while_a_topic_is_stuck_failing(tmp_path: Path) -> None:
    """The tier path is a file: every upload fails. What is committed (nothing) is sound, but
    verify said "verify: OK" and exited 0 while the topic could not offload at all."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "tier-is-a-file").write_text("not a directory")
    cfg = tmp_path / "offloadd.toml"
    cfg.write_text(CONFIG.format(port=port) + '[blobstore]\npath = "tier-is-a-file/objects"\n'
                   "[offload]\nretry_base_s = 30\nretry_max_s = 30\n")
    with producing_daemon(tmp_path, cfg) as d:
        offloadd(["offload-now", "--config", str(cfg), "--wait", "--timeout", "60"], tmp_path,
                 check=False)
        assert d.stop() == 0
        p = offloadd(["verify", "--config", str(cfg)], tmp_path, check=False)
        assert p.returncode == 1, p.stdout + p.stderr
        assert "offload is failing: " in p.stdout, p.stdout
        assert "tier-is-a-file" in p.stdout and "verify: FAILED" in p.stdout


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_standalone_that_offloaded_nothing_exits_1_with_the_reason(tmp_path: Path) -> None:
    """Every upload fails (the tier path is a file) and the run is stopped by SIGTERM before
    anything was committed, as `timeout 20 offloadd standalone` does: it printed its summary
    and exited 0."""
    import subprocess

    from tests.ops.support import OFFLOADD, wait_for

    (tmp_path / "tier-is-a-file").write_text("not a directory")
    cfg = tmp_path / "standalone.toml"
    cfg.write_text('[blobstore]\npath = "tier-is-a-file/objects"\n[metrics]\nenabled = false\n'
                   '[daemon]\nlog_format = "json"\n')
    err = tmp_path / "standalone.err"
    with err.open("wb") as log:
        proc = subprocess.Popen([*OFFLOADD, "standalone", "--json", "--config", str(cfg),
                                 "--topics", "1",
                                 "--rate", "200000"], cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=log)
        try:
            # the first progress line: the topic is written and served, its segment open
            wait_for(lambda: "last committed topic-0=None" in err.read_text(errors="replace"),
                     60, "the first progress line")
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    assert proc.returncode == 1, err.read_text()[-3000:]
    summary = json.loads(out.decode().strip().splitlines()[-1])
    assert summary["problem"].startswith("nothing was offloaded: "), summary
    assert "nothing was offloaded" in err.read_text()
