"""The ZooKeeper client's log (issue 23 item 7): no session credentials even at DEBUG, kazoo's
own lines at WARNING unless asked, and a one-shot command's answer not buried under connection
lines — against a real ZooKeeper."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import socket
import sys
from binascii import hexlify
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from offloadd import logs
from tests.fixtures.zookeeper import zk_server
from tests.ops.support import offloadd, zk_chroot

__all__ = ["zk_server"]  # fixture used below


@pytest.fixture
def debug_log(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], io.StringIO]]:
    """``start()``: the daemon's log set-up at DEBUG, into a buffer (set up in the test itself:
    pytest's capture replaces sys.stderr between set-up and call); the loggers restored after."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    levels = {n: logging.getLogger(n).level for n in logs.LIBRARY_LOGGERS}

    def start() -> io.StringIO:
        err = io.StringIO()
        monkeypatch.setattr(sys, "stderr", err)
        logs.configure("json", "DEBUG")
        return err

    try:
        yield start
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        for name, lvl in levels.items():
            logging.getLogger(name).setLevel(lvl)


def _credentials(client_id: tuple[int, bytes]) -> list[str]:
    """Every form in which kazoo shows a session's id and password. (offloadd's own lines name
    the session as 0x<hex id>, without its password, to match ZooKeeper's server logs.)"""
    session_id, passwd = client_id
    return [str(session_id), repr(passwd), hexlify(passwd).decode()]


@pytest.mark.integration
@pytest.mark.timeout(90)
async def test_a_reconnect_at_debug_shows_no_session_id_or_password(
        zk_server: str, debug_log: Callable[[], io.StringIO],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """kazoo, asked for its DEBUG lines, logs the Connect request of a reconnect — which
    carries the session's id and password — and both come out as ***."""
    from offloadd.metadata.zookeeper import SessionState, ZooKeeperMetadataStore

    monkeypatch.setenv(logs.LIBRARY_LEVEL_ENV, "DEBUG")
    captured = debug_log()
    store = await ZooKeeperMetadataStore.open(f"zk://{zk_server}/noise-{os.getpid()}",
                                              session_timeout_s=10, connect_timeout_s=20)
    try:
        client_id = store.client.client_id
        back = asyncio.Event()
        states: list[SessionState] = []

        def seen(state: SessionState) -> None:
            states.append(state)
            if state is SessionState.CONNECTED:
                back.set()

        store.add_session_listener(seen)
        # cut the TCP connection under kazoo: it reconnects to the same session, sending its
        # id and password again
        store.client._connection._socket.shutdown(socket.SHUT_RDWR)
        async with asyncio.timeout(30):
            await back.wait()
        assert store.client.client_id == client_id, "the same session must be resumed"
        await store.create("/after", b"x")
    finally:
        await store.close()
    text = captured.getvalue()
    reconnects = [json.loads(line)["msg"] for line in text.splitlines()
                  if "Connect(" in line and "session_id=***" in line]
    assert len(reconnects) >= 2, text[-3000:]  # the first connect and the reconnect
    assert all("passwd=***" in m for m in reconnects), reconnects
    for form in _credentials(client_id):
        assert form not in text, (form, text[-3000:])


@pytest.mark.integration
@pytest.mark.timeout(90)
async def test_kazoo_logs_warnings_only_unless_asked(
        zk_server: str, debug_log: Callable[[], io.StringIO],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """At DEBUG, without $OFFLOADD_LIBRARY_LOG_LEVEL, kazoo's requests and connection lines
    stay out of the log; offloadd's own DEBUG lines do not."""
    from offloadd.metadata.zookeeper import ZooKeeperMetadataStore

    monkeypatch.delenv(logs.LIBRARY_LEVEL_ENV, raising=False)
    captured = debug_log()
    logging.getLogger("offloadd.noise-test").debug("our own debug line")
    store = await ZooKeeperMetadataStore.open(f"zk://{zk_server}/noise-{os.getpid()}-2",
                                              connect_timeout_s=20)
    try:
        await store.create("/node", b"x")
    finally:
        await store.close()
    records = [json.loads(line) for line in captured.getvalue().splitlines()]
    assert any(r["msg"] == "our own debug line" for r in records)
    kazoo = [r for r in records if ".kazoo" in r["logger"] or r["logger"].startswith("kazoo")]
    assert kazoo == [], kazoo


@pytest.fixture
def zk_config(zk_server: str, tmp_path: Path) -> Path:
    """A configuration on ZooKeeper with the shipped production log format (JSON), its
    store created (``status`` refuses one that does not exist)."""
    chroot = zk_chroot(zk_server, "noise-cli")
    cfg = tmp_path / "offloadd.toml"
    cfg.write_text(f'[metadata]\nurl = "zk://{zk_server}{chroot}"\n'
                   '[daemon]\nlog_format = "json"\n[metrics]\nenabled = false\n')
    return cfg


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_cli_command_on_zookeeper_prints_its_answer_alone(zk_config: Path,
                                                             tmp_path: Path) -> None:
    """``status`` at the default level: the answer on stdout and nothing on stderr (it
    printed six INFO lines, one of them "ZooKeeper session lost -> connected")."""
    env = {k: v for k, v in os.environ.items() if k != logs.LIBRARY_LEVEL_ENV}
    p = offloadd(["status", "--config", str(zk_config)], tmp_path, env=env)
    assert "metadata zk://" in p.stdout
    assert p.stderr == "", p.stderr


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_cli_command_at_debug_shows_no_kazoo_lines(zk_config: Path, tmp_path: Path) -> None:
    """``status --log-level DEBUG``: offloadd's own DEBUG lines, none of kazoo's (its requests
    and, on a reconnect, the session's password) and no INFO line from it."""
    env = {k: v for k, v in os.environ.items() if k != logs.LIBRARY_LEVEL_ENV}
    p = offloadd(["status", "--config", str(zk_config), "--log-level", "DEBUG"], tmp_path,
                 env=env)
    records = [json.loads(line) for line in p.stderr.splitlines()]
    assert any(r["level"] == "debug" for r in records), p.stderr  # DEBUG is on
    kazoo = [r for r in records if ".kazoo" in r["logger"]]
    assert kazoo == [], kazoo
    assert not any("passwd" in r["msg"] or "Connect(" in r["msg"] for r in records)
