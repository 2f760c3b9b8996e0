"""systemd integration: the shipped unit passes ``systemd-analyze verify``, and ``offloadd run``
speaks sd_notify — READY, STATUS, WATCHDOG, RELOADING and STOPPING — over $NOTIFY_SOCKET."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from offloadd import config
from offloadd.shell.service import Notifier
from tests.ops.support import DaemonProcess

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "deploy" / "offloadd.service"


def unit_settings() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", ";", "[")):
            k, _, v = line.partition("=")
            out.setdefault(k.strip(), []).append(v.strip())
    return out


class TestUnitFile:
    """deploy/offloadd.service: Type=notify with a watchdog, reload by SIGHUP, hardened."""

    @pytest.mark.timeout(60)
    def test_systemd_analyze_verify_passes(self, tmp_path: Path) -> None:
        tool = shutil.which("systemd-analyze")
        if tool is None:
            pytest.skip("systemd-analyze is not installed (Debian package systemd)")
        # verify checks that ExecStart's binary exists: point it at this venv's offloadd
        exe = Path(sys.executable).parent / "offloadd"
        assert exe.exists(), exe
        text = UNIT.read_text().replace("/opt/offloadd/.venv/bin/offloadd", str(exe))
        unit = tmp_path / "offloadd.service"
        unit.write_text(text)
        out = subprocess.run([tool, "verify", str(unit)], capture_output=True, text=True,
                             timeout=50)
        assert out.returncode == 0, out.stderr
        assert out.stderr.strip() == "", out.stderr  # warnings (unknown keys...) count too

    def test_the_unit_is_a_notify_service_with_watchdog_and_reload(self) -> None:
        u = unit_settings()
        assert u["Type"] == ["notify"] and u["NotifyAccess"] == ["main"]
        assert u["WatchdogSec"] == ["30"]
        assert u["ExecStart"] == [
            "/opt/offloadd/.venv/bin/offloadd run --config /etc/offloadd/offloadd.toml"]
        assert u["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
        assert u["KillSignal"] == ["SIGTERM"]

    def test_systemd_waits_longer_than_the_shutdown_deadline(self) -> None:
        stop = int(re.sub(r"s$", "", unit_settings()["TimeoutStopSec"][0]))
        prod = config.load(ROOT / "config" / "production.toml")
        default = config.load(None)
        assert stop > prod.daemon.shutdown_deadline_s
        assert stop > default.daemon.shutdown_deadline_s

    def test_the_unit_is_hardened(self) -> None:
        u = unit_settings()
        assert u.get("DynamicUser") == ["yes"] or "User" in u
        for key, want in [("ProtectSystem", "strict"), ("NoNewPrivileges", "yes"),
                          ("PrivateTmp", "yes"), ("ProtectHome", "yes"),
                          ("StateDirectory", "offloadd")]:
            assert u.get(key) == [want], key
        assert "AF_INET" in u["RestrictAddressFamilies"][0]
        assert u["CapabilityBoundingSet"] == [""]


@pytest.fixture
def notify_socket() -> Iterator[tuple[socket.socket, str]]:
    # sun_path holds 108 bytes: pytest's tmp_path can be longer
    d = tempfile.mkdtemp(prefix="offn-", dir="/tmp")
    path = os.path.join(d, "notify")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(0.2)
    try:
        yield s, path
    finally:
        s.close()
        shutil.rmtree(d, ignore_errors=True)


def receive_until(s: socket.socket, want: str, got: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(want in m.splitlines() for m in got):
            return
        try:
            got.append(s.recv(4096).decode())
        except TimeoutError:
            continue
    raise AssertionError(f"no {want!r} within {timeout}s; got {got}")


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_run_sends_ready_watchdog_reloading_and_stopping(
        tmp_path: Path, notify_socket: tuple[socket.socket, str]) -> None:
    sock, path = notify_socket
    cfg = tmp_path / "offloadd.toml"
    cfg.write_text("[metrics]\nenabled = false\n[daemon]\nshutdown_deadline_s = 5\n")
    env = dict(os.environ, NOTIFY_SOCKET=path, WATCHDOG_USEC="500000")
    env.pop("WATCHDOG_PID", None)
    d = DaemonProcess(tmp_path, cfg, env=env)
    try:
        got: list[str] = []
        receive_until(sock, "READY=1", got, 30)
        ready = next(m for m in got if "READY=1" in m.splitlines())
        assert f"MAINPID={d.pid}" in ready.splitlines()
        assert any(line.startswith("STATUS=offloading") for line in ready.splitlines())
        got.clear()
        receive_until(sock, "WATCHDOG=1", got, 5)
        got.clear()
        d.signal(signal.SIGHUP)
        receive_until(sock, "RELOADING=1", got, 10)
        reloading = next(m for m in got if "RELOADING=1" in m.splitlines())
        assert re.search(r"^MONOTONIC_USEC=\d+$", reloading, re.M)
        receive_until(sock, "READY=1", got, 10)
        got.clear()
        d.signal(signal.SIGTERM)
        receive_until(sock, "STOPPING=1", got, 10)
        assert d.proc.wait(20) == 0
    finally:
        d.close()


def test_notifier_speaks_to_an_abstract_socket_and_is_silent_without_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"offloadd-test-{os.getpid()}"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind("\0" + name)
    s.settimeout(2)
    try:
        n = Notifier("@" + name)
        n.send("READY=1")
        assert s.recv(100) == b"READY=1"
        n.close()
    finally:
        s.close()
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    quiet = Notifier()
    assert not quiet.enabled
    quiet.send("READY=1")  # a no-op, not an error


def test_the_watchdog_interval_is_half_watchdog_usec_for_this_process_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    n = Notifier("@x")
    try:
        monkeypatch.setenv("WATCHDOG_USEC", "30000000")
        monkeypatch.delenv("WATCHDOG_PID", raising=False)
        assert n.watchdog_interval() == 15.0
        monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
        assert n.watchdog_interval() is None
    finally:
        n.close()
