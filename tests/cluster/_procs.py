"""A cluster of real processes for the integration tests: ``offloadd run`` daemons and an
``offloadd produce`` writer sharing one ZooKeeper chroot, one ledger directory and one tier.

The rig reads ZooKeeper itself (kazoo, synchronously) to see owners, epochs and members as they
change, and decodes managed-ledger nodes to count committed entries.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.retry import KazooRetry

from offloadd.errors import FormatError
from offloadd.metadata import managed_ledger
from offloadd.model import catalog

OFFLOADD = [sys.executable, "-m", "offloadd"]
DOMAIN = "public/default/persistent"

CONFIG = """
[metadata]
url = "{url}"
session_timeout_s = {session_timeout}
connect_timeout_s = 10

[source]
path = "{tmp}/ledgers"
rollover_bytes = 300000
rollover_minutes = 0.05

[blobstore]
path = "{tmp}/tier"

[offload]
max_size_per_segment_mbytes = 0.25
max_segment_rollover_time_minutes = 0.03
max_block_size_bytes = 65536
retry_base_s = 0.2
retry_max_s = 2.0
flow_permits_per_second = {flow}

[metrics]
enabled = false

[daemon]
pid_file = "{tmp}/{name}.pid"
owner_id = "{name}"
shutdown_deadline_s = 20
log_format = "text"
"""


class Rig:
    def __init__(self, tmp: Path, hosts: str, *, session_timeout: float = 3.0,
                 flow: float = 0) -> None:
        self.tmp = tmp
        self.hosts = hosts
        self.chroot = f"/cluster-{uuid.uuid4().hex[:10]}"
        self.url = f"zk://{hosts}{self.chroot}"
        self.session_timeout = session_timeout
        self.flow = flow
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._zk: KazooClient | None = None
        # the rig's own reads ride out a ZooKeeper election like the daemons do
        self._retry = KazooRetry(max_tries=-1, delay=0.1, max_delay=1.0, deadline=30)

    # ---- processes -----------------------------------------------------------------------------
    def config(self, name: str) -> Path:
        path = self.tmp / f"{name}.toml"
        if not path.exists():
            path.write_text(CONFIG.format(url=self.url, session_timeout=self.session_timeout,
                                          tmp=self.tmp, name=name, flow=self.flow))
        return path

    def log(self, name: str) -> Path:
        return self.tmp / f"{name}.log"

    def spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        with self.log(name).open("ab") as out:
            proc = subprocess.Popen([*OFFLOADD, *args, "--config", str(self.config(name))],
                                    cwd=self.tmp, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
        self.procs[name] = proc
        return proc

    def start_daemon(self, name: str) -> subprocess.Popen[bytes]:
        return self.spawn(name, ["run"])

    def produce(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        return self.spawn(name, ["produce", "--json", *args])

    def signal(self, name: str, sig: signal.Signals) -> None:
        os.kill(self.procs[name].pid, sig)

    def stop(self, name: str, timeout: float = 40) -> int:
        proc = self.procs[name]
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        return proc.wait(timeout)

    def wait_exit(self, name: str, timeout: float) -> int:
        return self.procs[name].wait(timeout)

    def run(self, name: str, args: list[str], timeout: float = 60
            ) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*OFFLOADD, *args, "--config", str(self.config(name))],
                              cwd=self.tmp, capture_output=True, text=True, timeout=timeout)

    def verify(self) -> dict[str, Any]:
        p = self.run("verifier", ["verify", "--json", "--orphan-grace", "0"], timeout=120)
        rep: dict[str, Any] = json.loads(p.stdout)
        assert (p.returncode == 0) == rep["ok"], p.stderr
        return rep

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait(10)
        if self._zk is not None:
            self._zk.stop()
            self._zk.close()

    # ---- what ZooKeeper holds ------------------------------------------------------------------
    @property
    def zk(self) -> KazooClient:
        if self._zk is None:
            self._zk = KazooClient(hosts=self.hosts, timeout=10)
            self._zk.start(timeout=15)
        return self._zk

    def _children(self, path: str) -> list[str]:
        try:
            return sorted(self._retry(self.zk.get_children, self.chroot + path))
        except NoNodeError:
            return []

    def _get(self, path: str) -> bytes | None:
        try:
            data, _ = self._retry(self.zk.get, self.chroot + path)
            return bytes(data)
        except NoNodeError:
            return None

    def topics(self) -> list[str]:
        return self._children(f"/managed-ledgers/{DOMAIN}")

    def members(self) -> list[str]:
        return self._children("/offloadd/members")

    def owners(self) -> dict[str, str]:
        out = {}
        for t in self._children(f"/offloadd/owners/{DOMAIN}"):
            data = self._get(f"/offloadd/owners/{DOMAIN}/{t}")
            if data is not None:
                out[t] = data.decode()
        return out

    def epochs(self) -> dict[str, int]:
        out = {}
        for t in self._children(f"/offloadd/topics/{DOMAIN}"):
            data = self._get(f"/offloadd/topics/{DOMAIN}/{t}")
            if data is not None:
                out[t] = int(json.loads(data)["epoch"])
        return out

    def info(self, topic: str) -> Any:
        data = self._get(f"/managed-ledgers/{DOMAIN}/{topic}")
        assert data is not None, topic
        return managed_ledger.decode(data, topic)

    def committed(self) -> dict[str, int]:
        """Entries in complete segments, per topic."""
        return {t: sum(s.entries for s in catalog.segments(self.info(t)) if s.complete)
                for t in self.topics()}

    def committed_or_error(self) -> dict[str, int]:
        """As :meth:`committed`, with -1 for topics whose node does not decode."""
        out = {}
        for t in self.topics():
            try:
                out[t] = sum(s.entries for s in catalog.segments(self.info(t)) if s.complete)
            except FormatError:
                out[t] = -1
        return out

    def written(self) -> dict[str, int]:
        """Entries in closed ledgers, per topic (all of them once the writer has exited)."""
        return {t: sum(li.entries for li in self.info(t).ledgerInfo) for t in self.topics()}

    def drained(self) -> bool:
        return self.committed() == self.written()

    # ---- waiting -------------------------------------------------------------------------------
    def wait(self, pred: Callable[[], bool], timeout: float, what: str) -> float:
        """Poll ``pred`` until true; the seconds it took. Fails naming ``what`` and the logs."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if pred():
                return time.monotonic() - t0
            for name, proc in self.procs.items():
                if name.startswith("d") and proc.poll() is not None and \
                        proc.returncode not in (0, -signal.SIGKILL):
                    raise AssertionError(f"{name} exited {proc.returncode}:\n{self.tail(name)}")
            time.sleep(0.1)
        raise AssertionError(f"timed out after {timeout:g}s waiting for {what}\n"
                             + "\n".join(f"--- {n}\n{self.tail(n)}" for n in self.procs))

    def tail(self, name: str, lines: int = 25) -> str:
        try:
            return "\n".join(self.log(name).read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

