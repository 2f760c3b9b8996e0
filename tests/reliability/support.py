"""Shared pieces of the reliability suite: configs, ``offloadd`` subprocesses, and what the
metadata says was written and committed (the figures live in conftest.py).

Every ``offloadd`` here is a real process (``[sys.executable, "-m", "offloadd", ...]``) whose
stdout, stderr and log files stay on disk, so the security test can search all of them. What the
tests read from the metadata (written vs committed entries) they read in-process through
:mod:`offloadd.wiring`, which opens the embedded store or ZooKeeper as the config says.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

OFFLOADD = [sys.executable, "-m", "offloadd"]

TomlValue = str | int | float | bool | list[str]
Sections = Mapping[str, Mapping[str, TomlValue]]


# ---- configs ---------------------------------------------------------------------------------
def _toml_value(v: TomlValue) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(json.dumps(x) for x in v) + "]"
    return json.dumps(v)


def toml(sections: Sections) -> str:
    out = []
    for name, table in sections.items():
        out.append(f"[{name}]")
        out += [f"{k} = {_toml_value(v)}" for k, v in table.items()]
        out.append("")
    return "\n".join(out)


def merge(base: Sections, *more: Sections) -> dict[str, dict[str, TomlValue]]:
    out: dict[str, dict[str, TomlValue]] = {k: dict(v) for k, v in base.items()}
    for m in more:
        for k, v in m.items():
            out.setdefault(k, {}).update(v)
    return out


def local_sections(root: Path, *, metadata_url: str | None = None) -> dict[str, dict[str, Any]]:
    """A small, fast-rolling set-up under ``root``: embedded ledgers, filesystem tier, segments
    of ~50 KB in 8 KiB blocks that close within 0.3 s, ledgers of ~120 KB, DEBUG logs."""
    return {
        "metadata": {"url": metadata_url or f"embedded:{root}/data/metadata"},
        "source": {"path": f"{root}/data/ledgers", "rollover_bytes": 120_000,
                   "rollover_minutes": 0.02},
        "blobstore": {"path": f"{root}/data/tier"},
        "offload": {"max_size_per_segment_mbytes": 0.05,
                    "max_segment_rollover_time_minutes": 0.005,
                    "max_block_size_bytes": 8192, "retry_base_s": 0.1, "retry_max_s": 0.5},
        "retention": {"interval_s": 0.5, "orphan_grace_s": 5},
        "metrics": {"enabled": False},
        "daemon": {"pid_file": f"{root}/data/offloadd.pid", "log_level": "DEBUG",
                   "log_format": "text", "shutdown_deadline_s": 10},
    }


def write_config(path: Path, sections: Sections) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(toml(sections))
    return path


# ---- processes -------------------------------------------------------------------------------
@dataclass
class Outputs:
    """Every file an ``offloadd`` process of a test wrote its stdout or stderr to."""

    root: Path
    files: list[Path] = field(default_factory=list)
    _n: int = 0

    def new(self, name: str) -> Path:
        self._n += 1
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / f"{self._n:03d}-{name}"
        self.files.append(path)
        return path


def cli(args: list[str], cwd: Path, *, timeout: float = 90, env: Mapping[str, str] | None = None,
        outputs: Outputs | None = None) -> subprocess.CompletedProcess[str]:
    p = subprocess.run([*OFFLOADD, *args], cwd=cwd, capture_output=True, text=True,
                       timeout=timeout, env=dict(env) if env is not None else None,
                       stdin=subprocess.DEVNULL)
    if outputs is not None:
        outputs.new(f"{args[0]}.out").write_text(p.stdout)
        outputs.new(f"{args[0]}.err").write_text(p.stderr)
    return p


def ok(p: subprocess.CompletedProcess[str], what: str = "offloadd") -> str:
    assert p.returncode == 0, f"{what} exited {p.returncode}:\n{p.stderr[-4000:]}"
    return p.stdout


# Imports done before the go signal: a restart in the crash loop then costs the daemon's own
# start-up, not the interpreter's ~1 s of imports (the same code runs once it is told to go).
PRELOAD = """
import sys
import uvloop
import offloadd.shell.cli, offloadd.shell.service, offloadd.shell.runtime, offloadd.offload.topic
import offloadd.metadata.embedded, offloadd.blobstore.filesystem, offloadd.ledger.local
import offloadd.retention.gc, offloadd.commit.cluster
if sys.stdin.readline().strip() == "go":
    sys.exit(offloadd.shell.cli.main(sys.argv[1:]))
"""


class Proc:
    """A long-running ``offloadd`` (``run``, ``produce``...) with stdout and stderr in files.

    ``preload``: the process imports offloadd, then waits for :meth:`go` before running."""

    def __init__(self, args: list[str], cwd: Path, log: Path, *,
                 env: Mapping[str, str] | None = None, preload: bool = False) -> None:
        self.args = args
        self.log = log
        self.out = log.with_suffix(log.suffix + ".stdout")
        log.parent.mkdir(parents=True, exist_ok=True)
        self._err: IO[bytes] = open(log, "wb")  # noqa: SIM115  (closed in wait/kill)
        self._out: IO[bytes] = open(self.out, "wb")  # noqa: SIM115
        self.started = time.monotonic()
        argv = [sys.executable, "-c", PRELOAD, *args] if preload else [*OFFLOADD, *args]
        self.proc = subprocess.Popen(argv, cwd=cwd, stdout=self._out, stderr=self._err,
                                     stdin=subprocess.PIPE if preload else subprocess.DEVNULL,
                                     env=dict(env) if env is not None else None)

    def go(self) -> None:
        """Let a preloaded process run."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.close()
        self.started = time.monotonic()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def lines(self) -> list[str]:
        return self.text().splitlines()

    def wait_for(self, pred: Callable[[str], bool], timeout: float, what: str,
                 every: float = 0.01) -> float:
        """Poll the log until ``pred(text)``; seconds it took. Fails if the process exits."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if pred(self.text()):
                return time.monotonic() - t0
            if not self.alive():
                raise AssertionError(f"offloadd {self.args[0]} exited {self.proc.returncode} "
                                     f"before {what}:\n{self.text()[-4000:]}")
            time.sleep(every)
        raise AssertionError(f"timed out after {timeout:g}s waiting for {what}:\n"
                             f"{self.text()[-4000:]}")

    def signal(self, sig: signal.Signals) -> None:
        os.kill(self.proc.pid, sig)

    def kill9(self) -> None:
        if self.alive():
            self.proc.kill()
        self.proc.wait(10)
        self._close()

    def stop(self, timeout: float = 60) -> int:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self._close()

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._close()

    def _close(self) -> None:
        if self.alive():
            self.proc.kill()
            self.proc.wait(10)
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        self._err.close()
        self._out.close()


def wait_until(pred: Callable[[], bool], timeout: float, what: str, every: float = 0.1) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return time.monotonic() - t0
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


# ---- what the metadata says ------------------------------------------------------------------
@dataclass(frozen=True)
class TopicCounts:
    written: int  # entries in the managed ledger's ledgers (closed ones; open ones count so far)
    committed: int  # entries in complete segments
    assigned: int  # segments not complete


async def _counts(config: Path) -> dict[str, TopicCounts]:
    from offloadd import config as config_mod
    from offloadd import wiring
    from offloadd.metadata import managed_ledger
    from offloadd.model import LedgerState, TopicName, catalog

    settings = config_mod.load(str(config))
    md = await wiring.open_metadata(settings)
    src = wiring.open_source(settings, md)
    try:
        out = {}
        for name in await managed_ledger.list_names(md):
            info, _ = await managed_ledger.load(md, name)
            segs = catalog.segments(info)
            written = sum(li.entries for li in info.ledgerInfo)  # open ones: 0 here
            descs = await src.ledgers(TopicName.from_managed_ledger(name))
            open_entries = sum(d.entries for d in descs if d.state is LedgerState.OPEN)
            out[name] = TopicCounts(written + open_entries,
                                    sum(s.entries for s in segs if s.complete),
                                    sum(1 for s in segs if not s.complete))
        return out
    finally:
        await src.close()
        await md.close()


def counts(config: Path) -> dict[str, TopicCounts]:
    """Per managed ledger: entries written, entries committed, segments still assigned."""
    return asyncio.run(_counts(config))


def drained(config: Path) -> bool:
    c = counts(config)
    return bool(c) and all(t.committed == t.written > 0 and t.assigned == 0 for t in c.values())


def verify(config: Path, cwd: Path, *, outputs: Outputs | None = None,
           timeout: float = 120) -> dict[str, Any]:
    p = cli(["verify", "--config", str(config), "--json", "--orphan-grace", "0"], cwd,
            timeout=timeout, outputs=outputs)
    assert p.returncode in (0, 1), f"verify exited {p.returncode}:\n{p.stderr[-4000:]}"
    rep: dict[str, Any] = json.loads(p.stdout)
    assert rep["ok"] == (p.returncode == 0)
    return rep


def gc(config: Path, cwd: Path, *, grace: float = 0, outputs: Outputs | None = None
       ) -> dict[str, Any]:
    p = cli(["gc", "--config", str(config), "--json", "--grace", str(grace)], cwd,
            outputs=outputs)
    assert p.returncode in (0, 1), f"gc exited {p.returncode}:\n{p.stderr[-4000:]}"
    rep: dict[str, Any] = json.loads(p.stdout)
    return rep


@dataclass(frozen=True)
class Integrity:
    """What a verify report says about loss and duplication, against what was written."""

    entries: int
    written: int
    lost: int
    duplicated: int
    checksum_mismatches: int
    source_checked: int
    gaps: int
    errors: list[str]
    orphans: int


def integrity(rep: Mapping[str, Any], written: Mapping[str, TopicCounts]) -> Integrity:
    """Loss = entries written before the last committed position that no committed segment holds
    (gaps, plus any shortfall against what the writer wrote); duplicates as verify counts them."""
    entries = sum(t["entries"] for t in rep["topics"])
    want = sum(c.written for c in written.values())
    gaps = sum(len(t["gaps"]) for t in rep["topics"])
    return Integrity(
        entries=entries, written=want, lost=max(want - entries, 0) + gaps,
        duplicated=sum(t["duplicates"] for t in rep["topics"]) + max(entries - want, 0),
        checksum_mismatches=sum(t["checksum_mismatches"] for t in rep["topics"]),
        source_checked=sum(t["source_checked"] for t in rep["topics"]),
        gaps=gaps, errors=[e for t in rep["topics"] for e in t["errors"]],
        orphans=len(rep["orphans"]))
