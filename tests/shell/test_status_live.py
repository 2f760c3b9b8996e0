"""``offloadd status`` against a running daemon (issue 22, "Status at scale"): the daemon's live
view merged in, and the summary view's counts, top topics by lag and failing topics, with the
``--topic`` and ``--namespace`` filters, on the embedded store with real processes.

Three topics are offloaded by a daemon whose tier works; a second daemon, on the same store
but with a tier that refuses every write (its path is under a file), then gets new entries on
one of them: that topic fails (its segment cannot be uploaded), the other two have nothing to
offload and stay ok.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ops.support import DaemonProcess, offloadd, wait_for

OK_A = "persistent://public/default/live-a"
OK_B = "persistent://public/default/live-b"
BAD = "persistent://other/ns/live-c"
CONFIG = """
[metrics]
bind = "127.0.0.1:{port}"
[blobstore]
path = "{tier}"
[offload]
retry_base_s = 60
retry_max_s = 60
[daemon]
shutdown_deadline_s = 5
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _status(cwd: Path, *args: str) -> tuple[int, str]:
    p = offloadd(["status", "--config", "refusing.toml", *args], cwd, check=False)
    assert p.returncode in (0, 1), p.stdout + p.stderr
    return p.returncode, p.stdout


def _bad_is_failing(cwd: Path) -> bool:
    _, out = _status(cwd, "--json", "--topic", BAD)
    (t,) = json.loads(out)["topics"]
    return bool((t.get("live") or {}).get("failed_attempts"))


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int]]:
    """(its directory, the running daemon's pid): the daemon with the refusing tier, ``BAD``
    failing under it."""
    cwd = tmp_path_factory.mktemp("status-live")
    port = _port()
    (cwd / "working.toml").write_text(CONFIG.format(port=port, tier="tier/objects"))
    (cwd / "a-file").write_text("not a directory")
    (cwd / "refusing.toml").write_text(CONFIG.format(port=port, tier="a-file/objects"))
    first = DaemonProcess(cwd, cwd / "working.toml", name="working")
    try:
        first.wait_logged("offloadd ready")
        for topic in (OK_A, OK_B, BAD):
            offloadd(["produce", "--config", "working.toml", "--topic", topic,
                      "--bytes", "20000"], cwd)
        offloadd(["offload-now", "--config", "working.toml", "--wait", "--timeout", "60"], cwd)
        assert first.stop() == 0
    finally:
        first.close()
    second = DaemonProcess(cwd, cwd / "refusing.toml", name="refusing")
    try:
        second.wait_logged("offloadd ready")
        offloadd(["produce", "--config", "refusing.toml", "--topic", BAD, "--bytes", "20000"],
                 cwd)
        offloadd(["offload-now", "--config", "refusing.toml", "--topic", BAD, "--wait",
                  "--timeout", "20"], cwd, check=False)
        wait_for(lambda: _bad_is_failing(cwd), 60, f"{BAD} failing in the daemon's view",
                 every=0.5)
        yield cwd, second.pid
    finally:
        second.close()


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_the_daemons_live_view_is_merged(deployment: tuple[Path, int]) -> None:
    cwd, pid = deployment
    code, out = _status(cwd, "--json")
    doc = json.loads(out)
    assert code == 1  # a topic is failing
    assert doc["daemon"]["pid"] == pid and doc["daemon"]["topics_owned"] == 3
    topics: dict[str, dict[str, Any]] = {t["topic"]: t for t in doc["topics"]}
    assert set(topics) == {OK_A, OK_B, BAD}
    assert all("live" in t and t["lag"]["measured_by"] == "daemon" for t in topics.values())
    assert topics[BAD]["live"]["failed_attempts"] >= 1
    assert "a-file" in topics[BAD]["live"]["last_error"]
    assert not topics[OK_A]["live"].get("failed_attempts")
    _, text = _status(cwd, "--all-topics")
    assert f"daemon pid {pid} running" in text and "3 topic(s) owned" in text
    assert f"{BAD}: FAILING" in text and f"{OK_A}: ok" in text


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_the_summary_counts_ranks_by_lag_and_lists_the_failing(
        deployment: tuple[Path, int]) -> None:
    cwd, pid = deployment
    code, out = _status(cwd, "--json", "--summary")
    doc = json.loads(out)
    assert code == 1 and "topics" not in doc
    assert "topics" not in doc["daemon"] and doc["daemon"]["topics_owned"] == 3
    s = doc["summary"]
    assert s["topics"] == 3 and s["by_state"] == {"failing": 1, "ok": 2}
    # only the failing topic has entries the tier does not hold
    assert [x["topic"] for x in s["top_lag"]] == [BAD]
    assert s["top_lag"][0]["lag"]["entries"] > 0
    (f,) = s["failing"]
    assert f["topic"] == BAD and f["failed_attempts"] >= 1 and "a-file" in f["error"]
    _, text = _status(cwd, "--summary")
    assert f"daemon pid {pid} running" in text
    assert "3 topic(s): 1 failing, 2 ok" in text
    assert "top 1 by lag:" in text and "failing (1):" in text
    assert f"  {BAD}: FAILING" in text


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_the_filters_narrow_the_daemons_view_too(deployment: tuple[Path, int]) -> None:
    cwd, _ = deployment
    code, out = _status(cwd, "--json", "--namespace", "public/default")
    doc = json.loads(out)
    assert code == 0  # the failing topic is not among these
    assert sorted(t["topic"] for t in doc["topics"]) == [OK_A, OK_B]
    assert all("live" in t for t in doc["topics"])
    code, text = _status(cwd, "--topic", BAD)
    assert code == 1
    assert text.count("persistent://") == 1 and f"{BAD}: FAILING" in text
    assert "last error" in text and "a-file" in text
    code, out = _status(cwd, "--summary", "--namespace", "other/*")
    assert code == 1 and "1 topic(s): 1 failing" in out
