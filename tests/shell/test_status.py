"""``offloadd status`` merges a daemon's live view only from the daemon of its own deployment."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from offloadd import wiring
from offloadd.config import Settings
from offloadd.shell.status import collect, render_text


class _Daemon:
    """A stand-in ``/status`` endpoint on loopback answering with ``body``."""

    def __init__(self) -> None:
        self.body: dict[str, Any] = {}
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                data = json.dumps(outer.body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.bind = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def daemon() -> Iterator[_Daemon]:
    d = _Daemon()
    try:
        yield d
    finally:
        d.close()


async def _settings(tmp_path: Path, bind: str) -> Settings:
    settings = Settings.model_validate({
        "metadata": {"url": f"embedded:{tmp_path}/metadata"},
        "source": {"path": f"{tmp_path}/ledgers"},
        "blobstore": {"driver": "filesystem", "path": f"{tmp_path}/tier"},
        "metrics": {"enabled": True, "bind": bind},
    })
    md = await wiring.open_metadata(settings)  # status refuses a store that does not exist
    await md.close()
    return settings


def _live(metadata: str) -> dict[str, Any]:
    return {"state": "running", "pid": 4242, "metadata": metadata, "store_circuit": "healthy",
            "store_ready": True, "store_reason": "", "buffer": {"used": 0, "cap": 1},
            "topics": {}}


@pytest.mark.timeout(60)
async def test_the_daemon_of_this_deployment_is_merged(tmp_path: Path, daemon: _Daemon) -> None:
    settings = await _settings(tmp_path, daemon.bind)
    daemon.body = _live(wiring.deployment(settings))
    st = await collect(settings)
    assert st["daemon"] is not None and st["daemon"]["pid"] == 4242
    assert "other_daemon" not in st
    assert "daemon pid 4242 running" in render_text(st)


@pytest.mark.timeout(60)
async def test_another_deployments_daemon_is_named_not_merged(tmp_path: Path,
                                                             daemon: _Daemon) -> None:
    settings = await _settings(tmp_path, daemon.bind)
    daemon.body = _live("zk://elsewhere:2181/other-cluster")
    st = await collect(settings)
    assert st["daemon"] is None
    assert st["other_daemon"]["metadata"] == "zk://elsewhere:2181/other-cluster"
    text = render_text(st)
    assert "another deployment (zk://elsewhere:2181/other-cluster)" in text
    assert "daemon pid 4242" not in text


def test_the_deployment_never_shows_a_credential() -> None:
    s = Settings.model_validate({"metadata": {"url": "embedded:/srv/offloadd/metadata"}})
    assert wiring.deployment(s) == "embedded:/srv/offloadd/metadata"
    s = Settings.model_validate({"metadata": {"url": "zk://zk1:2181,zk2:2181/pulsar"}})
    assert wiring.deployment(s) == "zk://zk1:2181,zk2:2181/pulsar"


@pytest.mark.timeout(60)
async def test_a_daemon_that_never_answers_is_not_waited_for_past_the_timeout() -> None:
    """A process that accepts on the metrics address but never answers (a wedged daemon):
    status goes on without its view instead of hanging."""
    import socket

    from offloadd.shell.status import _daemon_status

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        bind = f"127.0.0.1:{listener.getsockname()[1]}"
        assert await _daemon_status(bind, timeout_s=0.5) is None


@pytest.mark.timeout(60)
async def test_the_daemons_topic_count_is_given(tmp_path: Path, daemon: _Daemon) -> None:
    settings = await _settings(tmp_path, daemon.bind)
    daemon.body = {**_live(wiring.deployment(settings)),
                   "topics": {"persistent://public/default/x": {"failed_attempts": 0}}}
    st = await collect(settings)
    assert st["daemon"]["topics_owned"] == 1
    assert "1 topic(s) owned" in render_text(st)
