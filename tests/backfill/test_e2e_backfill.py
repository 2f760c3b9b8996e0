"""The backfill acceptance scenario on real processes::

    offloadd produce (several runs: ledgers of varying sizes and entry sizes)
      └▶ offloadd backfill --master local[2]   ── killed (SIGKILL, whole process group) midway
           └▶ offloadd backfill again          ── skips what was committed, redoes the rest
                └▶ offloadd verify             ── clean: no gap, no duplicate, no orphan
                     └▶ offloadd standalone    ── streaming continues right after the history
                          └▶ offloadd verify   ── clean, contiguous from 1st to last entry

The default suite runs it on ~40 MiB in 20 ledgers; with OFFLOADD_SLOW_TESTS=1 also on 500 MiB in
more than 50 ledgers.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.backfill.support import write_config

pytestmark = pytest.mark.integration

OFFLOADD = [sys.executable, "-m", "offloadd"]
TOPIC = "persistent://public/default/topic-0"  # what `standalone --topics 1` writes
MiB = 1024 * 1024
PROGRESS = re.compile(r" (\d+)/(\d+) segments ")


@dataclass(frozen=True)
class Scenario:
    # one `produce` run per row: (bytes, entry size, ledger rollover bytes)
    runs: tuple[tuple[int, int, int], ...]
    segment_mbytes: float
    min_ledgers: int
    min_bytes: int


SMALL = Scenario(runs=((10 * MiB, 1024, 3 * MiB // 2), (10 * MiB, 4000, 2 * MiB),
                       (10 * MiB, 700, 5 * MiB // 2), (10 * MiB, 16_000, 3 * MiB)),
                 segment_mbytes=2, min_ledgers=20, min_bytes=40 * MiB)
LARGE = Scenario(runs=((100 * MiB, 1024, 7 * MiB), (100 * MiB, 4096, 9 * MiB),
                       (100 * MiB, 700, 11 * MiB), (100 * MiB, 2000, 13 * MiB),
                       (100 * MiB, 16_384, 8 * MiB)),
                 segment_mbytes=64, min_ledgers=50, min_bytes=500 * MiB)


def offloadd(args: list[str], cwd: Path, *, timeout: float = 300, check: bool = True,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    p = subprocess.run([*OFFLOADD, *args], cwd=cwd, capture_output=True, text=True,
                       timeout=timeout, env={**os.environ, **(env or {})})
    if check and p.returncode != 0:
        raise AssertionError(f"offloadd {' '.join(args)} exited {p.returncode}:\n{p.stderr}")
    return p


def verify(cwd: Path, cfg: Path) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(offloadd(["verify", "--config", str(cfg), "--json",
                                               "--orphan-grace", "0"], cwd, check=False).stdout)
    return out


def backfill_killed_midway(cwd: Path, cfg: Path, after: int, timeout: float) -> tuple[int, int]:
    """Run a backfill and SIGKILL its process group (driver, JVM, Python workers) once
    ``after`` segments are committed; returns (committed seen, planned)."""
    proc = subprocess.Popen([*OFFLOADD, "backfill", "--json", "--config", str(cfg), "--topic",
                             TOPIC,
                             "--master", "local[2]", "--spark-conf", "spark.ui.enabled=false"],
                            cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    seen: list[tuple[int, int]] = []
    reached = threading.Event()

    def follow() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            m = PROGRESS.search(line)
            if m:
                seen.append((int(m.group(1)), int(m.group(2))))
                if seen[-1][0] >= after:
                    reached.set()

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    try:
        assert reached.wait(timeout), f"backfill never committed {after} segments: {seen}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        reader.join(timeout=10)
        if proc.stderr is not None:
            proc.stderr.close()
    return seen[-1]


def run_scenario(tmp_path: Path, sc: Scenario) -> None:
    cfg = write_config(tmp_path, segment_mbytes=sc.segment_mbytes, block_bytes=MiB)
    for nbytes, entry_size, rollover in sc.runs:
        offloadd(["produce", "--json", "--config", str(cfg), "--topic", TOPIC, "--bytes",
                  str(nbytes),
                  "--entry-size", str(entry_size)], tmp_path,
                 env={"OFFLOADD_SOURCE__ROLLOVER_BYTES": str(rollover)})
    ledgers = sorted((tmp_path / "data" / "ledgers").glob("*.off"))
    assert len(ledgers) >= sc.min_ledgers
    sizes = {p.stat().st_size for p in ledgers}
    assert len(sizes) > 3  # ledgers of varying sizes

    committed, planned = backfill_killed_midway(tmp_path, cfg, after=2, timeout=240)
    assert 2 <= committed < planned
    mid = verify(tmp_path, cfg)["topics"][0]
    assert mid["segments"] < planned  # the kill left work undone...
    assert mid["assigned"] == planned - mid["segments"]  # ...recorded ASSIGNED up front

    again = json.loads(offloadd(["backfill", "--json", "--config", str(cfg), "--topic", TOPIC,
                                 "--master", "local[2]", "--spark-conf",
                                 "spark.ui.enabled=false"], tmp_path, timeout=600).stdout)
    assert again["ok"]
    assert again["skipped_segments"] == mid["segments"]
    assert again["redone_segments"] == mid["assigned"] and again["new_segments"] == 0
    assert again["skipped_segments"] + again["redone_segments"] + again["new_segments"] \
        == planned
    rep = verify(tmp_path, cfg)
    assert rep["ok"], rep
    topic = rep["topics"][0]
    assert topic["segments"] == planned and topic["assigned"] == 0
    assert topic["duplicates"] == 0 and topic["gaps"] == [] and rep["orphans"] == []
    assert topic["bytes"] >= sc.min_bytes and topic["first"].endswith(":0")
    backfill_end = topic["last_offloaded"]

    # Streaming picks up right after the history: one ordered, gap-free log.
    offloadd(["standalone", "--json", "--config", str(cfg), "--duration", "3", "--rate", "3000000",
              "--topics", "1"], tmp_path, timeout=180)
    rep = verify(tmp_path, cfg)
    assert rep["ok"], rep
    topic = rep["topics"][0]
    assert topic["segments"] > planned
    assert topic["gaps"] == [] and topic["duplicates"] == 0 and rep["orphans"] == []
    assert topic["source_checked"] == topic["entries"]
    last = tuple(map(int, topic["last_offloaded"].split(":")))
    assert last > tuple(map(int, backfill_end.split(":")))


@pytest.mark.timeout(600)
def test_backfill_killed_midway_then_rerun_verifies_and_streaming_continues(
        tmp_path: Path) -> None:
    run_scenario(tmp_path, SMALL)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_backfill_of_500_mib_in_50_ledgers_killed_midway_then_rerun(tmp_path: Path) -> None:
    run_scenario(tmp_path, LARGE)

