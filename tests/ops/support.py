"""Helpers for the operations tests: a real ``offloadd run`` process and what it committed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

OFFLOADD = [sys.executable, "-m", "offloadd"]


def zk_chroot(zk_server: str, name: str) -> str:
    """Create ``/{name}-{pid}`` on ``zk_server`` and return it: a store of this test's own, which
    exists (``status`` is read-only and refuses a store that does not exist yet)."""
    from kazoo.client import KazooClient

    chroot = f"/{name}-{os.getpid()}"
    zk = KazooClient(hosts=zk_server)
    zk.start(timeout=10)
    try:
        zk.ensure_path(chroot)
    finally:
        zk.stop()
        zk.close()
    return chroot


def offloadd(args: list[str], cwd: Path, *, timeout: float = 60, check: bool = True,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    p = subprocess.run([*OFFLOADD, *args], cwd=cwd, capture_output=True, text=True,
                       timeout=timeout, env=env)
    if check and p.returncode != 0:
        raise AssertionError(f"offloadd {' '.join(args)} exited {p.returncode}:\n{p.stderr}")
    return p


def wait_for(pred: Callable[[], bool], timeout: float, what: str, every: float = 0.1) -> float:
    """Poll ``pred`` until true; return the seconds it took. Fails after ``timeout``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return time.monotonic() - t0
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class DaemonProcess:
    """``offloadd run --config`` in ``cwd``; its stderr (JSON log lines) goes to a file."""

    def __init__(self, cwd: Path, config: Path, *, env: dict[str, str] | None = None,
                 name: str = "run") -> None:
        self.cwd = cwd
        self.log_path = cwd / f"{name}.log"
        self.out_path = cwd / f"{name}.out"
        self._log: IO[bytes] = open(self.log_path, "wb")  # noqa: SIM115
        self._out: IO[bytes] = open(self.out_path, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen([*OFFLOADD, "run", "--config", str(config)], cwd=cwd,
                                     stdout=self._out, stderr=self._log,
                                     env=env if env is not None else dict(os.environ))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def logs(self) -> list[dict[str, object]]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append({"msg": line})
        return out

    def logged(self, text: str) -> bool:
        return any(text in str(r.get("msg", "")) for r in self.logs())

    def wait_logged(self, text: str, timeout: float = 30) -> None:
        def seen() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"offloadd run exited {self.proc.returncode}:\n"
                                     f"{self.log_path.read_text()}")
            return self.logged(text)
        wait_for(seen, timeout, f"log line {text!r}")

    def signal(self, sig: signal.Signals) -> None:
        os.kill(self.proc.pid, sig)

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()
        self._out.close()


def committed_entries(cwd: Path) -> dict[str, int]:
    """Entries in complete (OFFLOADED) segments per managed ledger, read from the metadata."""

    async def go() -> dict[str, int]:
        from offloadd.metadata import managed_ledger
        from offloadd.metadata.embedded import EmbeddedMetadataStore
        from offloadd.model import catalog

        md = await EmbeddedMetadataStore.open(cwd / "data" / "metadata")
        try:
            out = {}
            for name in await managed_ledger.list_names(md):
                info, _ = await managed_ledger.load(md, name)
                out[name] = sum(s.entries for s in catalog.segments(info) if s.complete)
            return out
        finally:
            await md.close()

    if not (cwd / "data" / "metadata").exists():
        return {}
    return asyncio.run(go())


def ml(topic: str) -> str:
    """persistent://t/ns/x -> t/ns/persistent/x"""
    t, ns, local = topic.removeprefix("persistent://").split("/")
    return f"{t}/{ns}/persistent/{local}"
