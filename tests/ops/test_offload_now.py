"""``offloadd offload-now`` never signals a process that is not the daemon; ``--wait`` blocks until
the forced segment is committed (or an attempt at it failed) and says which; the HTTP control
endpoint serves loopback clients, or holders of the configured token, and nobody else."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from offloadd.metrics import Metrics
from offloadd.shell.httpserver import MetricsServer
from tests.ops.support import DaemonProcess, committed_entries, ml, offloadd

TOPIC = "persistent://public/default/now"
TOKEN = "s3cr3t-control-token-42"

BASE = """
[source]
rollover_minutes = 600
rollover_bytes = 1073741824
[offload]
max_segment_rollover_time_minutes = 600
max_size_per_segment_mbytes = 1024
{offload}
[blobstore]
path = "{tier}"
[metrics]
bind = "127.0.0.1:{port}"
[daemon]
shutdown_deadline_s = 5
[retention]
orphan_grace_s = 72000
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_config(tmp_path: Path, *, offload: str = "", tier: str = "data/tier") -> Path:
    p = tmp_path / "offloadd.toml"
    p.write_text(BASE.format(offload=offload, port=free_port(), tier=tier))
    return p


def produce(tmp_path: Path, cfg: Path, nbytes: int) -> int:
    out = offloadd(["produce", "--json", "--config", str(cfg), "--topic", TOPIC, "--bytes",
                    str(nbytes)],
                   tmp_path)
    return int(json.loads(out.stdout)["entries"])


# ---- the pid file ------------------------------------------------------------------------------
class TestPidFile:
    """Only the live offloadd that holds the pid file's lock is ever signalled."""

    @pytest.mark.timeout(60)
    def test_a_stale_pid_file_naming_a_live_process_is_not_signalled(
            self, tmp_path: Path) -> None:
        (tmp_path / "data").mkdir()
        victim = subprocess.Popen(["sleep", "60"])
        try:
            (tmp_path / "data" / "offloadd.pid").write_text(f"{victim.pid}\n")
            res = offloadd(["offload-now"], tmp_path, check=False)
            assert res.returncode == 1, res
            assert "not running (stale pid file): no offloadd holds its lock" in res.stderr
            time.sleep(0.2)
            assert victim.poll() is None, "offload-now killed an unrelated process"
        finally:
            victim.kill()
            victim.wait()

    @pytest.mark.timeout(60)
    def test_a_pid_file_locked_by_another_program_is_not_signalled(self, tmp_path: Path) -> None:
        pid_file = tmp_path / "data" / "offloadd.pid"
        pid_file.parent.mkdir()
        holder = subprocess.Popen(
            [sys.executable, "-c", "import fcntl, os, sys, time\n"
             f"fd = os.open({str(pid_file)!r}, os.O_RDWR | os.O_CREAT)\n"
             "fcntl.flock(fd, fcntl.LOCK_EX)\n"
             "os.write(fd, f'{os.getpid()}\\n'.encode())\n"
             "print('locked', flush=True)\ntime.sleep(60)\n"],
            stdout=subprocess.PIPE, text=True)
        other = subprocess.Popen(["sleep", "60"])
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
            res = offloadd(["offload-now"], tmp_path, check=False)
            assert res.returncode == 1 and "which is not offloadd" in res.stderr, res
            pid_file.write_text(f"{other.pid}\n")  # names one process, another holds the lock
            res = offloadd(["offload-now"], tmp_path, check=False)
            assert res.returncode == 1, res
            assert f"the process holding its lock is {holder.pid}" in res.stderr
            time.sleep(0.2)
            assert holder.poll() is None and other.poll() is None
        finally:
            for p in (holder, other):
                p.kill()
                p.wait()
            if holder.stdout is not None:
                holder.stdout.close()

    @pytest.mark.integration
    @pytest.mark.timeout(90)
    def test_the_daemon_holds_its_pid_file_locked_while_it_runs(self, tmp_path: Path) -> None:
        cfg = make_config(tmp_path)
        d = DaemonProcess(tmp_path, cfg)
        try:
            d.wait_logged("ready")
            locks = Path("/proc/locks").read_text()
            assert any(f" {d.pid} " in line and "FLOCK" in line for line in locks.splitlines())
            second = offloadd(["run", "--config", str(cfg)], tmp_path, check=False)
            assert second.returncode == 1
            assert f"another offloadd (pid {d.pid}) is running" in second.stderr
            assert d.stop() == 0
            assert not (tmp_path / "data" / "offloadd.pid").exists()
        finally:
            d.close()


# ---- --wait and the control endpoint -----------------------------------------------------------
@pytest.mark.integration
@pytest.mark.timeout(120)
def test_offload_now_wait_returns_once_the_segment_is_committed(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    env = {**os.environ, "OFFLOADD_METRICS__CONTROL_TOKEN": TOKEN}
    d = DaemonProcess(tmp_path, cfg, env=env)
    try:
        d.wait_logged("ready")
        n = produce(tmp_path, cfg, 200_000)
        d.wait_logged(f"offloading topic {TOPIC}")
        assert committed_entries(tmp_path).get(ml(TOPIC), 0) == 0
        res = offloadd(["offload-now", "--config", str(cfg), "--topic", TOPIC, "--wait"],
                       tmp_path, env=env)
        assert res.stdout.startswith(f"{TOPIC}: committed up to "), res.stdout
        # returned only once committed: no waiting needed here
        assert committed_entries(tmp_path)[ml(TOPIC)] == n
        again = offloadd(["offload-now", "--config", str(cfg), "--wait", "--json"], tmp_path,
                         env=env)
        assert json.loads(again.stdout)["results"][0]["result"] == "nothing"
        unknown = offloadd(["offload-now", "--config", str(cfg), "--wait", "--topic",
                            "persistent://public/default/nope"], tmp_path, env=env, check=False)
        assert unknown.returncode == 1 and "not-served" in unknown.stdout
        wrong = offloadd(["offload-now", "--config", str(cfg), "--wait"], tmp_path,
                         env={**env, "OFFLOADD_METRICS__CONTROL_TOKEN": "wrong-token"},
                         check=False)
        assert wrong.returncode == 1 and "HTTP 401" in wrong.stderr
        assert d.stop() == 0
        assert TOKEN not in d.log_path.read_text()
    finally:
        d.close()


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_offload_now_wait_reports_a_failed_attempt(tmp_path: Path) -> None:
    """The tier path is a file: every upload fails; --wait says so and exits 1."""
    (tmp_path / "tier-is-a-file").write_text("not a directory")
    cfg = make_config(tmp_path, tier="tier-is-a-file/objects",
                      offload="retry_base_s = 30\nretry_max_s = 30")
    d = DaemonProcess(tmp_path, cfg)
    try:
        d.wait_logged("ready")
        produce(tmp_path, cfg, 50_000)
        d.wait_logged(f"offloading topic {TOPIC}")
        res = offloadd(["offload-now", "--config", str(cfg), "--wait", "--timeout", "60"],
                       tmp_path, check=False)
        assert res.returncode == 1, res
        assert res.stdout.startswith(f"{TOPIC}: failed"), res.stdout
        assert "tier-is-a-file" in res.stdout  # the attempt's error
    finally:
        assert d.stop() == 0


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_offload_now_refuses_another_deployments_daemon(tmp_path: Path) -> None:
    """A second deployment (its own store, under other/) whose [metrics] bind names the port
    where this one's daemon listens: offload-now --wait and --url refuse, naming both
    deployments, and the daemon closes nothing (it used to close its segments and print its
    topics as the other deployment's)."""
    cfg = make_config(tmp_path)
    d = DaemonProcess(tmp_path, cfg)
    try:
        d.wait_logged("ready")
        produce(tmp_path, cfg, 50_000)
        d.wait_logged(f"offloading topic {TOPIC}")
        other = tmp_path / "other"
        other.mkdir()
        other_cfg = other / "offloadd.toml"
        other_cfg.write_text(cfg.read_text().replace('path = "data/tier"',
                                                     'path = "data/other-tier"'))
        port = cfg.read_text().split('bind = "127.0.0.1:')[1].split('"')[0]
        for extra in (["--wait"], ["--url", f"http://127.0.0.1:{port}"]):
            res = offloadd(["offload-now", "--config", str(other_cfg), *extra,
                            "--timeout", "20"], other, check=False)
            assert res.returncode == 1, (extra, res)
            assert f"embedded:{tmp_path}/data/metadata" in res.stderr, res.stderr
            assert f"embedded:{other}/data/metadata" in res.stderr, res.stderr
            assert TOPIC not in res.stdout
        time.sleep(1)  # what a wrongly accepted request would have had time to commit
        assert committed_entries(tmp_path).get(ml(TOPIC), 0) == 0
    finally:
        assert d.stop() == 0


@pytest.mark.timeout(60)
async def test_the_control_endpoint_refuses_a_caller_of_another_deployment() -> None:
    """The daemon checks too (the body's metadata): one that took the port after the
    caller's own check refuses with 409 and does nothing."""
    calls: list[object] = []

    async def offload_now(topics: list[str] | None, wait: bool,
                          timeout_s: float) -> list[Mapping[str, Any]]:
        calls.append(topics)
        return []

    async def ready() -> tuple[bool, str]:
        return True, "ok"

    server = MetricsServer("127.0.0.1:0", metrics=Metrics(), ready=ready, status=lambda: {
        "metadata": "zk://zk1:2181/ours"}, offload_now=offload_now)
    await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(server.url + "/offload-now",
                                 json={"metadata": "zk://zk9:2181/theirs"}) as r:
                assert r.status == 409
                body = await r.json()
                assert "zk://zk1:2181/ours" in body["error"]
                assert "zk://zk9:2181/theirs" in body["error"]
            assert calls == []
            async with http.post(server.url + "/offload-now",
                                 json={"metadata": "zk://zk1:2181/ours"}) as r:
                assert r.status == 200
            assert calls == [None]
    finally:
        await server.stop()


def _outside_address() -> str | None:
    """An address of this host that is not loopback, if it has one."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.123", 9))  # no packet is sent
            addr = str(s.getsockname()[0])
    except OSError:
        return None
    return None if addr.startswith("127.") else addr


class TestControlEndpoint:
    """POST /offload-now: loopback only without a token; the token from anywhere with one."""

    calls: list[tuple[list[str] | None, bool, float]]

    @pytest.fixture
    async def http(self) -> AsyncIterator[aiohttp.ClientSession]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
            yield s

    async def serve(self, token: str | None) -> MetricsServer:
        self.calls = []

        async def offload_now(topics: list[str] | None, wait: bool,
                              timeout: float) -> list[Mapping[str, Any]]:
            self.calls.append((topics, wait, timeout))
            if topics and topics[0] == "bad":
                raise ValueError("'bad' is not a topic name")
            return [{"topic": t, "result": "committed"} for t in topics or ["all"]]

        async def ready() -> tuple[bool, str]:
            return True, "ok"

        server = MetricsServer("0.0.0.0:0", metrics=Metrics(), ready=ready,
                               offload_now=offload_now, control_token=token)
        await server.start()
        return server

    @pytest.mark.timeout(30)
    async def test_loopback_only_without_a_token(self, http: aiohttp.ClientSession) -> None:
        server = await self.serve(None)
        try:
            url = f"http://127.0.0.1:{server.port}/offload-now"
            async with http.post(url, json={"topics": ["t"], "wait": True,
                                            "timeout_s": 5}) as r:
                assert r.status == 200
                assert await r.json() == {"ok": True, "results": [{"topic": "t",
                                                                   "result": "committed"}]}
            assert self.calls == [(["t"], True, 5.0)]
            async with http.post(url, json={"topics": ["bad"]}) as r:
                assert r.status == 400 and "not a topic name" in (await r.json())["error"]
            async with http.post(url, data=b"{not json") as r:
                assert r.status == 400
            async with http.post(url, json={"timeout_s": -1}) as r:
                assert r.status == 400
            outside = _outside_address()
            if outside is not None:
                async with http.post(f"http://{outside}:{server.port}/offload-now") as r:
                    assert r.status == 403
                    assert "control_token" in (await r.json())["error"]
            async with http.get(url) as r:
                assert r.status == 405
        finally:
            await server.stop()
        assert len(self.calls) == 2  # the refused calls never reached the daemon

    @pytest.mark.timeout(30)
    async def test_with_a_token_every_caller_needs_it(self, http: aiohttp.ClientSession) -> None:
        server = await self.serve(TOKEN)
        try:
            hosts = ["127.0.0.1", *([a] if (a := _outside_address()) else [])]
            for host in hosts:
                url = f"http://{host}:{server.port}/offload-now"
                async with http.post(url) as r:
                    assert r.status == 401
                async with http.post(url, headers={"Authorization": "Bearer nope"}) as r:
                    assert r.status == 401
                async with http.post(url, headers={"Authorization": f"Bearer {TOKEN}"}) as r:
                    assert r.status == 200
        finally:
            await server.stop()
        assert len(self.calls) == len(hosts)
