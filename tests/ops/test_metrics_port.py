"""A busy metrics port (issue 23 item 8): the daemon retries the bind for ``[metrics]
bind_retry_s``, then exits 75, which the systemd unit restarts — not 2, a configuration error it
never restarts. Real ``offloadd run`` processes, a real socket holding the port."""

from __future__ import annotations

import re
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ops.support import DaemonProcess, wait_for

UNIT = Path(__file__).resolve().parents[2] / "deploy" / "offloadd.service"
EXIT_PORT_BUSY = 75

CONFIG = """
[metrics]
bind = "127.0.0.1:{port}"
bind_retry_s = {retry}
[daemon]
shutdown_deadline_s = 5
"""


@pytest.fixture
def holder() -> Iterator[socket.socket]:
    """A listening socket on a loopback port: another process's exporter."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    try:
        yield s
    finally:
        s.close()


def _config(tmp_path: Path, port: int, retry: float) -> Path:
    cfg = tmp_path / "offloadd.toml"
    cfg.write_text(CONFIG.format(port=port, retry=retry))
    return cfg


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_the_daemon_binds_once_the_port_frees(tmp_path: Path, holder: socket.socket) -> None:
    port = holder.getsockname()[1]
    d = DaemonProcess(tmp_path, _config(tmp_path, port, 60))
    try:
        d.wait_logged("retrying every second", timeout=60)
        assert d.proc.poll() is None
        holder.close()  # the old daemon is gone
        d.wait_logged("offloadd ready", timeout=60)
        assert d.logged("busy attempt(s)")  # "listening on ... after N busy attempt(s)"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            assert r.status == 200
        assert d.stop() == 0
    finally:
        d.close()


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_port_that_stays_busy_exits_with_a_code_systemd_restarts(
        tmp_path: Path, holder: socket.socket) -> None:
    port = holder.getsockname()[1]
    d = DaemonProcess(tmp_path, _config(tmp_path, port, 1))
    try:
        wait_for(lambda: d.proc.poll() is not None, 60, "the daemon to give up")
        assert d.proc.returncode == EXIT_PORT_BUSY, d.log_path.read_text()
        text = d.log_path.read_text()
        assert "bind_retry_s" in text and "config error" not in text, text
    finally:
        d.close()
    unit = UNIT.read_text()
    assert re.search(r"^Restart=on-failure$", unit, re.M)
    prevent = re.findall(r"^RestartPreventExitStatus=(.*)$", unit, re.M)
    assert all(str(EXIT_PORT_BUSY) not in v.split() for v in prevent), prevent
