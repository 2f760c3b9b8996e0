"""Logs: JSON lines for journald and containers, plain lines in a terminal, and never a secret
— not in the log, not on stdout, not in ``status`` or ``config check`` output."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from offloadd import logs
from tests.ops.support import DaemonProcess, committed_entries, offloadd, wait_for

S3_SECRET = "s3-SECRET-wJalrXUtnFEMI-K7MDENG"
S3_TOKEN = "s3-TOKEN-FwoGZXIvYXdzEJr"
ZK_PASSWORD = "zk-PASSWORD-7f3a9c"


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def root_logger() -> Iterator[logging.Logger]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield root
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


class TestFormat:
    """``auto`` is JSON unless stderr is a terminal."""

    def test_json_lines_when_stderr_is_not_a_terminal(
            self, root_logger: logging.Logger, monkeypatch: pytest.MonkeyPatch) -> None:
        err = io.StringIO()
        monkeypatch.setattr(sys, "stderr", err)
        logs.configure("auto", "INFO")
        logging.getLogger("offloadd.test").info("segment %s offloaded", "u1")
        rec = json.loads(err.getvalue().splitlines()[-1])
        assert rec["msg"] == "segment u1 offloaded" and rec["level"] == "info"
        assert rec["logger"] == "offloadd.test" and rec["ts"].endswith("Z")

    def test_plain_lines_in_a_terminal(self, root_logger: logging.Logger,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
        err = _Tty()
        monkeypatch.setattr(sys, "stderr", err)
        logs.configure("auto", "INFO")
        logging.getLogger("offloadd.test").warning("hello %d", 3)
        line = err.getvalue().splitlines()[-1]
        assert "WARNING" in line and line.endswith("offloadd.test: hello 3")
        assert not line.startswith("{")

    def test_an_exception_is_one_json_record(self, root_logger: logging.Logger,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
        err = io.StringIO()
        monkeypatch.setattr(sys, "stderr", err)
        logs.configure("json", "INFO")
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            logging.getLogger("offloadd.test").exception("failed")
        lines = err.getvalue().splitlines()
        rec = json.loads(lines[-1])
        assert len(lines) == 1 and "RuntimeError: boom" in rec["exc"]


class TestRedaction:
    """A known secret that slips into a message or a traceback is replaced by ***."""

    def _emit(self, secrets: list[str], msg: str, *args: object,
              exc: BaseException | None = None) -> str:
        out = io.StringIO()
        h = logging.StreamHandler(out)
        h.setFormatter(logs.JsonFormatter())
        h.addFilter(logs.RedactFilter(secrets))
        lg = logging.getLogger("offloadd.redact-test")
        lg.addHandler(h)
        lg.propagate = False
        try:
            lg.error(msg, *args, exc_info=(type(exc), exc, exc.__traceback__) if exc else None)
        finally:
            lg.removeHandler(h)
            lg.propagate = True
        return out.getvalue()

    def test_message_and_arguments(self) -> None:
        text = self._emit([S3_SECRET], "connecting with %s", S3_SECRET)
        assert S3_SECRET not in text and "***" in text

    def test_the_password_of_a_user_password_secret_alone(self) -> None:
        text = self._emit([f"offloadd:{ZK_PASSWORD}"], "auth failed for %s", ZK_PASSWORD)
        assert ZK_PASSWORD not in text

    def test_tracebacks(self) -> None:
        try:
            raise PermissionError(f"denied for key {S3_SECRET}")
        except PermissionError as exc:
            text = self._emit([S3_SECRET], "upload failed", exc=exc)
        assert S3_SECRET not in text and "PermissionError" in text


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_daemon_never_shows_its_secrets(tmp_path: Path) -> None:
    """Secrets set in the file and the environment (unused by the embedded store and the
    filesystem driver, which must not matter) appear in no output of any command."""
    cfg = tmp_path / "offloadd.toml"
    cfg.write_text(f"""
[metadata]
url = "embedded:./data/metadata"
acl_digest = "offloadd:{ZK_PASSWORD}"
[blobstore]
driver = "filesystem"
access_key_id = "AKIAOFFLOADDTEST"
session_token = "{S3_TOKEN}"
[offload]
max_segment_rollover_time_minutes = 600
[metrics]
enabled = false
[daemon]
log_level = "DEBUG"
shutdown_deadline_s = 5
""")
    env = dict(os.environ, OFFLOADD_BLOBSTORE__SECRET_ACCESS_KEY=S3_SECRET)
    outputs: list[str] = []

    def cmd(*args: str, check: bool = True) -> None:
        p = offloadd(list(args), tmp_path, env=env, check=check)
        outputs.extend([p.stdout, p.stderr])

    d = DaemonProcess(tmp_path, cfg, env=env)
    try:
        d.wait_logged("ready")
        topic = "persistent://public/default/secret"
        cmd("produce", "--config", str(cfg), "--topic", topic, "--bytes", "50000")
        d.wait_logged(f"offloading topic {topic}")
        d.signal(signal.SIGUSR1)
        wait_for(lambda: sum(committed_entries(tmp_path).values()) > 0, 10, "a commit")
        d.signal(signal.SIGHUP)
        d.wait_logged("configuration reloaded")
        cmd("status", "--config", str(cfg))
        cmd("status", "--config", str(cfg), "--json")
        cmd("config", "check", "--config", str(cfg))
        cmd("verify", "--config", str(cfg))
        assert d.stop() == 0
    finally:
        d.close()
    # a broken config that holds the secrets: the error line must not echo them either
    bad = tmp_path / "bad.toml"
    bad.write_text(f'[metadata]\nacl_digest = "{ZK_PASSWORD}"\n'
                   f'[blobstore]\nsecret_acess_key = "{S3_SECRET}"\n')
    cmd("config", "check", "--config", str(bad), check=False)
    daemon_out = d.log_path.read_text() + d.out_path.read_text()
    records = [json.loads(line) for line in d.log_path.read_text().splitlines()]
    assert any("segment" in r["msg"] and "offloaded" in r["msg"] for r in records)
    everything = "\n".join([*outputs, daemon_out])
    for secret in (S3_SECRET, S3_TOKEN, ZK_PASSWORD):
        assert secret not in everything


def test_the_log_filter_gets_every_secret_the_configuration_holds() -> None:
    from offloadd import config

    keys = sorted(config._secret_keys())
    assert ("blobstore", "secret_access_key") in keys and ("metadata", "acl_digest") in keys
    overrides: dict[str, object] = {"blobstore__access_key_id": "AKIAOFFLOADDTEST"}
    for section, key in keys:
        overrides[f"{section}__{key}"] = f"user:secret-{section}-{key}"
    s = config.load(None, **overrides)
    found = config.secret_values(s)
    for section, key in keys:
        assert f"user:secret-{section}-{key}" in found
