"""Nobody reads our secrets in an output, and the defaults are the safe ones.

One set-up with both secrets: S3 credentials ``testing`` / a long random secret (moto over HTTP)
and a ZooKeeper digest ACL ``user:<long random password>``, DEBUG logs. It runs ``config check``,
``produce``, ``run`` (scraped on /metrics, /status, /healthz, /readyz; sent SIGUSR1 and SIGHUP),
``status`` (text and JSON, with the daemon's live view merged in), ``verify``, ``gc``, ``read``,
``standalone``, and the error paths most likely to echo a secret: a wrong ZooKeeper password, a
misspelt secret key in the config, an unreachable S3 endpoint. Every stdout, stderr, log file and
scrape, every ZooKeeper node's data and every object's user metadata is searched for the secrets
(and the password alone): zero hits. Also: every ZooKeeper node we created carries the digest ACL
(no world access), metrics and admin bind to loopback by default, S3 TLS verification is on by
default.
"""

from __future__ import annotations

import json
import secrets
import signal
import socket
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import make_digest_acl_credential

from offloadd.blobstore.s3 import S3Options
from offloadd.config import Settings
from tests.fixtures.s3 import MIN_PART_SIZE, MotoBucket
from tests.reliability.conftest import Figures
from tests.reliability.support import (
    Outputs,
    Proc,
    TomlValue,
    cli,
    drained,
    merge,
    ok,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening_addresses(port: int) -> set[str]:
    """Local IPv4/IPv6 addresses with a socket listening on ``port`` (from /proc/net)."""
    out: set[str] = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            addr, hexport = fields[1].split(":")
            if fields[3] == "0A" and int(hexport, 16) == port:  # 0A: LISTEN
                if width == 8:
                    out.add(socket.inet_ntoa(bytes.fromhex(addr)[::-1]))
                else:
                    raw = b"".join(bytes.fromhex(addr[i:i + 8])[::-1] for i in range(0, 32, 8))
                    out.add(socket.inet_ntop(socket.AF_INET6, raw))
    return out


def fetch(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return str(resp.read().decode(errors="replace"))
    except urllib.error.HTTPError as exc:  # /readyz answers 503 while not ready
        return str(exc.read().decode(errors="replace"))


def walk(zk: KazooClient, path: str) -> list[str]:
    out = [path]
    for child in zk.get_children(path):
        out += walk(zk, f"{path.rstrip('/')}/{child}")
    return out


@pytest.mark.timeout(240)
def test_no_output_holds_a_secret_and_the_defaults_are_safe(
        tmp_path: Path, s3_bucket: MotoBucket, zk_server: str, figures: Figures) -> None:
    s3_secret = "s3SECRET" + secrets.token_urlsafe(32)
    zk_password = "zkPW" + secrets.token_urlsafe(32)
    wrong_password = "zkWRONG" + secrets.token_urlsafe(32)
    digest = f"offloadd:{zk_password}"
    needles = {"s3 secret": s3_secret, "zk digest": digest, "zk password": zk_password,
               "wrong zk password": wrong_password}
    chroot = f"/sec-{uuid.uuid4().hex[:10]}"
    port = free_port()
    base: dict[str, dict[str, TomlValue]] = {
        "metadata": {"url": f"zk://{zk_server}{chroot}", "acl_digest": digest,
                     "session_timeout_s": 4.0},
        "source": {"path": f"{tmp_path}/data/ledgers", "rollover_bytes": 150_000},
        "blobstore": {"driver": "aws-s3", "endpoint": s3_bucket.endpoint,
                      "bucket": s3_bucket.name, "access_key_id": "testing",
                      "secret_access_key": s3_secret,
                      "min_part_size_bytes": MIN_PART_SIZE},
        "offload": {"max_size_per_segment_mbytes": 0.1,
                    "max_segment_rollover_time_minutes": 0.01,
                    "max_block_size_bytes": 16384, "min_block_size_bytes": 0},
        "metrics": {"enabled": True, "bind": f"127.0.0.1:{port}"},
        "daemon": {"pid_file": f"{tmp_path}/data/offloadd.pid", "log_level": "DEBUG",
                   "log_format": "json"},
    }
    cfg = write_config(tmp_path / "offloadd.toml", base)
    outputs = Outputs(tmp_path / "outputs")
    cwd = tmp_path

    ok(cli(["config", "check", "--config", str(cfg)], cwd, outputs=outputs))
    ok(cli(["produce", "--json", "--config", str(cfg), "--topics", "2", "--bytes", "400000"], cwd,
            outputs=outputs))
    d = Proc(["run", "--config", str(cfg)], cwd, outputs.new("run.log"))
    outputs.files.append(d.out)
    try:
        d.wait_for(lambda t: "offloadd ready" in t, 60, "the daemon to be ready")
        wait_until(lambda: drained(cfg), 90, "the history to be offloaded")
        bound = listening_addresses(port)
        for path in ("/metrics", "/status", "/healthz", "/readyz"):
            outputs.new(f"scrape{path.replace('/', '-')}").write_text(
                fetch(f"http://127.0.0.1:{port}{path}"))
        ok(cli(["status", "--config", str(cfg), "--json"], cwd, outputs=outputs))
        st = json.loads(ok(cli(["status", "--config", str(cfg), "--json"], cwd)))
        assert st["daemon"] is not None  # the live view was merged in (and searched)
        ok(cli(["status", "--config", str(cfg)], cwd, outputs=outputs))
        ok(cli(["offload-now", "--config", str(cfg)], cwd, outputs=outputs))
        d.signal(signal.SIGHUP)
        d.wait_for(lambda t: "configuration reloaded" in t, 30, "the reload")
    finally:
        assert d.stop() == 0, d.text()[-4000:]
    ok(cli(["verify", "--config", str(cfg), "--json", "--orphan-grace", "0"], cwd,
           outputs=outputs))
    ok(cli(["verify", "--config", str(cfg)], cwd, outputs=outputs))
    ok(cli(["gc", "--config", str(cfg), "--json"], cwd, outputs=outputs))
    ok(cli(["read", "--config", str(cfg), "--topic", "persistent://public/default/topic-0",
            "--count", "20"], cwd, outputs=outputs))
    standalone_cfg = write_config(tmp_path / "standalone.toml", merge(base, {
        "metrics": {"enabled": True, "bind": f"127.0.0.1:{free_port()}"},
        "source": {"path": f"{tmp_path}/data/ledgers2"}}))
    ok(cli(["standalone", "--json", "--config", str(standalone_cfg), "--duration", "1", "--rate",
            "200000", "--topics", "1"], cwd, outputs=outputs, timeout=120))

    # error paths, where a careless message would echo what it was given
    wrong = write_config(tmp_path / "wrong.toml", merge(base, {
        "metadata": {"acl_digest": f"offloadd:{wrong_password}"}}))
    p = cli(["status", "--config", str(wrong)], cwd, outputs=outputs)
    assert p.returncode == 1 and ("not authorized" in p.stderr or "authentication" in p.stderr), \
        p.stderr
    typo = tmp_path / "typo.toml"
    typo.write_text(cfg.read_text().replace("secret_access_key", "secret_acess_key"))
    p = cli(["config", "check", "--config", str(typo)], cwd, outputs=outputs)
    assert p.returncode == 2 and "secret_acess_key" in p.stderr, p.stderr
    down = write_config(tmp_path / "down.toml", merge(base, {
        "blobstore": {"endpoint": f"http://127.0.0.1:{free_port()}", "max_attempts": 1,
                      "connect_timeout_s": 1.0}}))
    p = cli(["verify", "--config", str(down)], cwd, outputs=outputs, timeout=120)
    assert p.returncode == 1, p.stderr

    # search everything that came out, and what we stored
    texts = {str(f.relative_to(tmp_path)): f.read_bytes() for f in outputs.files if f.exists()}
    zk = KazooClient(hosts=zk_server, auth_data=[("digest", digest)], timeout=10)
    zk.start(timeout=15)
    try:
        nodes = walk(zk, chroot)
        for node in nodes:
            texts[f"zk:{node}"] = bytes(zk.get(node)[0])
        acls = {node: zk.get_acls(node)[0] for node in nodes}
    finally:
        zk.stop()
        zk.close()
    client = s3_bucket.boto3()
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=s3_bucket.name).get("Contents", [])]
    for key in keys:
        texts[f"s3:{key}"] = json.dumps(client.head_object(Bucket=s3_bucket.name, Key=key)
                                        .get("Metadata", {})).encode()
    hits = {f"{name} in {where}": data.count(secret.encode())
            for where, data in texts.items() for name, secret in needles.items()
            if secret.encode() in data}

    # every node we created (the chroot included) carries our digest ACL and no world access
    digest_id = make_digest_acl_credential("offloadd", zk_password)
    unprotected = [n for n, acl in acls.items()
                   if not any(a.id.scheme == "digest" and a.id.id == digest_id for a in acl)
                   or any(a.id.scheme == "world" and a.perms & ~1 for a in acl)]
    anonymous = KazooClient(hosts=zk_server, timeout=10)
    anonymous.start(timeout=15)
    try:
        with pytest.raises(NoAuthError):
            anonymous.get(f"{chroot}/managed-ledgers/public/default/persistent/topic-0")
    finally:
        anonymous.stop()
        anonymous.close()

    defaults = Settings()
    figures.set("security", outputs_searched=len(outputs.files),
                bytes_searched=sum(len(t) for t in texts.values()),
                zk_nodes_searched=len(nodes), s3_objects_searched=len(keys),
                secrets_searched=len(needles), secret_hits=sum(hits.values()),
                zk_nodes_with_digest_acl=len(nodes) - len(unprotected),
                zk_nodes_without=len(unprotected),
                metrics_default_bind=defaults.metrics.bind, metrics_listening_on=sorted(bound),
                s3_verify_tls_default=defaults.blobstore.verify_tls,
                cases=6, cases_passed=0)

    assert hits == {}, hits
    # the control: the same search does find them where they are meant to be
    assert all(secret.encode() in wrong.read_bytes() for secret in needles.values()
               if secret != zk_password and secret != digest)
    assert s3_secret.encode() in cfg.read_bytes() and digest.encode() in cfg.read_bytes()
    assert len(nodes) > 10 and unprotected == [], {n: acls[n] for n in unprotected}
    assert defaults.metrics.bind.startswith("127.0.0.1:"), defaults.metrics.bind
    assert bound == {"127.0.0.1"}, bound
    assert defaults.blobstore.verify_tls is True and S3Options(bucket="b").verify_tls is True
    assert len(keys) >= 4 and len(outputs.files) >= 20
    figures.set("security", cases_passed=6)
