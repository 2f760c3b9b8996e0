"""Logs: JSON lines for journald and containers, plain lines in a terminal, and never a secret
— not in the log, not on stdout, not in ``status`` or ``config check`` output."""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import re
import signal
import sys
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from offloadd import logs
from tests.fixtures.s3 import MotoBucket, moto_server, s3_bucket
from tests.fixtures.zookeeper import zk_server
from tests.ops.support import DaemonProcess, committed_entries, offloadd, wait_for, zk_chroot

__all__ = ["moto_server", "s3_bucket", "zk_server"]  # fixtures used below

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

    def test_a_plain_line_carries_the_date_and_the_utc_offset(
            self, root_logger: logging.Logger, monkeypatch: pytest.MonkeyPatch) -> None:
        import datetime

        err = _Tty()
        monkeypatch.setattr(sys, "stderr", err)
        logs.configure("text", "INFO")
        logging.getLogger("offloadd.test").info("hello")
        stamp = err.getvalue().splitlines()[-1].split(" ", 1)[0]
        # 2026-11-27T21:30:59.123+00:00: a full ISO-8601 time a reader can place on any host
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d", stamp)
        when = datetime.datetime.fromisoformat(stamp)
        now = datetime.datetime.now(datetime.UTC)
        assert abs((now - when).total_seconds()) < 300

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
[retention]
orphan_grace_s = 72000
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
        cmd("produce", "--json", "--config", str(cfg), "--topic", topic, "--bytes", "50000")
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
    from offloadd.config.keys import secret_keys

    keys = sorted(secret_keys())
    assert ("blobstore", "secret_access_key") in keys and ("metadata", "acl_digest") in keys
    overrides: dict[str, object] = {"blobstore__access_key_id": "AKIAOFFLOADDTEST"}
    for section, key in keys:
        overrides[f"{section}__{key}"] = f"user:secret-{section}-{key}"
    s = config.load(None, **overrides)
    found = config.secret_values(s)
    for section, key in keys:
        assert f"user:secret-{section}-{key}" in found


# ---- every representation of a secret (issue 13, defect 8) ----------------------------------
# Passwords made of distinctive alphanumeric runs joined by the characters that escaping,
# quoting and URL-encoding change. Alphanumerics survive every one of those encodings verbatim,
# so "no run appears in the output" catches a leak in any representation, including ones the
# redaction never heard of.
HOSTILE_PASSWORDS = [
    "Qv7Rz\\Lm2Pw",  # a backslash: doubled by repr() and JSON
    "Tn8Ks'Hy4Jd",  # a single quote: repr() switches to "..." quoting
    "Fe3Wu\"Bc5Gx'Np6",  # both quotes: repr() escapes the '
    "Rk4Dm%41Yt9@Vs2",  # % and @: URL-encoded as %25 and %40
    "Zh6Cq\u00e9\u20ac\U0001F600Lx3",  # é € 😀: \\xe9, \\u20ac, surrogate pairs in JSON
]
TOKENS = {p: [t for t in re.split(r"[^A-Za-z0-9]+", p) if len(t) >= 3] for p in HOSTILE_PASSWORDS}


def leaked(text: str, password: str) -> list[str]:
    return [t for t in TOKENS[password] if t in text]


REPRESENTATIONS: list[tuple[str, Callable[[str], str]]] = [
    ("literal", lambda s: s),
    ("repr", repr),
    ("ascii", ascii),
    ("json", json.dumps),
    ("json-utf8", lambda s: json.dumps(s, ensure_ascii=False)),
    ("url-encoded", lambda s: urllib.parse.quote(s, safe="")),
    ("url-encoded-plus", urllib.parse.quote_plus),
    ("bytes-repr", lambda s: repr(s.encode())),
    ("unicode-escape", lambda s: s.encode("unicode_escape").decode()),
    ("repr-in-a-tuple", lambda s: repr(("digest", f"offloadd:{s}"))),
    ("json-of-repr", lambda s: json.dumps(repr(s))),
    ("base64", lambda s: base64.b64encode(f"offloadd:{s}".encode()).decode()),
]


@pytest.mark.parametrize("password", HOSTILE_PASSWORDS)
@pytest.mark.parametrize(("form", "encode"), REPRESENTATIONS, ids=[r[0] for r in REPRESENTATIONS])
def test_every_representation_of_a_secret_is_redacted(
        password: str, form: str, encode: Callable[[str], str]) -> None:
    out = io.StringIO()
    h = logging.StreamHandler(out)
    h.setFormatter(logs.JsonFormatter())
    h.addFilter(logs.RedactFilter([f"offloadd:{password}"]))
    lg = logging.getLogger("offloadd.redact-test")
    lg.addHandler(h)
    lg.propagate = False
    lg.setLevel(logging.DEBUG)
    try:
        lg.debug("Sending request(xid=-4): %s", encode(password))
    finally:
        lg.removeHandler(h)
        lg.propagate = True
        lg.setLevel(logging.NOTSET)
    text = out.getvalue()
    assert "***" in text
    assert leaked(text, password) == [], text


@pytest.fixture
def debug_log(root_logger: logging.Logger, monkeypatch: pytest.MonkeyPatch
              ) -> Callable[[list[str]], io.StringIO]:
    """``configure(secrets)``: the daemon's own log set-up at DEBUG, into a buffer."""
    def configure(secrets: list[str]) -> io.StringIO:
        err = io.StringIO()
        monkeypatch.setattr(sys, "stderr", err)
        monkeypatch.setenv(logs.LIBRARY_LEVEL_ENV, "DEBUG")  # kazoo's requests, Auth included
        logs.configure("json", "DEBUG", secrets)
        return err

    return configure


@pytest.mark.integration
@pytest.mark.timeout(120)
async def test_zookeeper_digest_passwords_never_reach_a_debug_log(
        zk_server: str, debug_log: Callable[[list[str]], io.StringIO]) -> None:
    """kazoo logs its ``Auth(...)`` request at DEBUG as a repr, in which ``\\`` and ``'`` come
    out escaped; a real server authenticates each hostile password (and the store creates a
    node under it), and no form of any password reaches the log."""
    from offloadd.metadata.zookeeper import DigestAcl, ZooKeeperMetadataStore

    for i, password in enumerate(HOSTILE_PASSWORDS):
        err = debug_log([f"offloadd:{password}"])
        store = await ZooKeeperMetadataStore.open(
            f"zk://{zk_server}/redact-{os.getpid()}-{i}", connect_timeout_s=20,
            acl=DigestAcl("offloadd", password))
        try:
            await store.create("/node", b"x")
            assert (await store.get("/node")).data == b"x"
        finally:
            await store.close()
        text = err.getvalue()
        assert "Auth(" in text, "kazoo's auth request must be logged for this test to mean much"
        assert leaked(text, password) == [], text


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_cli_command_on_zookeeper_at_debug_shows_no_form_of_the_password(
        zk_server: str, tmp_path: Path) -> None:
    """The whole path: the password in the environment, ``offloadd status`` at DEBUG."""
    password = HOSTILE_PASSWORDS[2] + HOSTILE_PASSWORDS[0] + HOSTILE_PASSWORDS[4]
    TOKENS[password] = [t for t in re.split(r"[^A-Za-z0-9]+", password) if len(t) >= 3]
    chroot = zk_chroot(zk_server, "redact-cli")
    cfg = tmp_path / "offloadd.toml"
    cfg.write_text(f'[metadata]\nurl = "zk://{zk_server}{chroot}"\n'
                   '[daemon]\nlog_level = "DEBUG"\nlog_format = "json"\n')
    env = dict(os.environ, OFFLOADD_METADATA__ACL_DIGEST=f"offloadd:{password}",
               OFFLOADD_LIBRARY_LOG_LEVEL="DEBUG")  # kazoo's own DEBUG lines too
    p = offloadd(["status", "--config", str(cfg), "--json"], tmp_path, env=env)
    text = p.stdout + p.stderr
    assert "Auth(" in text, text[-2000:]
    assert leaked(text, password) == [], text


@pytest.mark.integration
@pytest.mark.timeout(120)
async def test_s3_secret_keys_never_reach_a_debug_log(
        s3_bucket: MotoBucket, debug_log: Callable[[list[str]], io.StringIO]) -> None:
    """Hostile secret keys on a real S3 server (moto takes any), with botocore itself at DEBUG
    (the daemon keeps it at WARNING; here it is forced on), through puts, reads, an error."""
    from offloadd.blobstore.s3 import S3BlobStore
    from offloadd.errors import OffloaddError

    for password in HOSTILE_PASSWORDS:
        err = debug_log([password])
        for noisy in ("botocore", "aiobotocore"):
            logging.getLogger(noisy).setLevel(logging.DEBUG)
        store = await S3BlobStore.open(s3_bucket.options(secret_access_key=password,
                                                         max_attempts=2))
        try:
            await store.put("k", [b"payload"], {"role": "data"})
            assert await store.get_range("k", 0, 7) == b"payload"
            with pytest.raises(OffloaddError):
                await store.head("no-such-key")
        finally:
            await store.close()
            for noisy in ("botocore", "aiobotocore"):
                logging.getLogger(noisy).setLevel(logging.WARNING)
        text = err.getvalue()
        assert "botocore" in text  # its DEBUG lines were there to be searched
        assert leaked(text, password) == [], text
