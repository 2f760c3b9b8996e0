"""kill -9 of the projection at random points: no duplicate and no missing row.

A real ``offloadd lakehouse sync`` subprocess projects a backlog in many small commits
(``commit_max_bytes`` 16 KiB: each commit writes a data file, a manifest, a manifest list and a
metadata file, then compare-and-sets the SQLite catalog); it is SIGKILLed after a random delay,
again and again, so the kills land everywhere — in start-up, between reading and writing, between
the data files and the catalog commit, inside the commit. Afterwards one sync runs to the end, and
every topic's table must hold exactly the messages the writer sent.

The default suite kills 20 times (about a minute); ``OFFLOADD_SLOW_TESTS=1`` adds a 100-kill run.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.lakehouse.support import (
    OFFLOADD,
    digest,
    distinct_positions,
    run,
    settings_of,
    summary,
    table_rows,
    write_config,
)

pytestmark = pytest.mark.integration
TOPICS = ["persistent://public/default/topic-0", "persistent://public/default/topic-1"]


def backlog(cwd: Path, seconds: int) -> tuple[Path, dict[str, Any]]:
    cfg = write_config(cwd, lakehouse="enabled = false\ncommit_max_bytes = 16384\n")
    out = run(["standalone", "--json", "--config", str(cfg), "--duration", str(seconds),
               "--topics", "2",
               "--rate", "1000000"], cwd, timeout=seconds + 180)
    return cfg, summary(out.stdout)


def _commits(cwd: Path) -> tuple[str, ...]:
    """The tables' current metadata files, straight from the SQLite catalog: a new one is a
    commit. Cheap enough to poll while the projection runs (no table scan)."""
    db = cwd / "data" / "lakehouse" / "catalog.db"
    if not db.exists():
        return ()
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True,
                                                timeout=5)) as con:
            rows = con.execute("SELECT table_name, metadata_location FROM iceberg_tables "
                               "ORDER BY table_name").fetchall()
    except sqlite3.Error:  # created but not initialised yet, or locked
        return ()
    return tuple(f"{name}={loc}" for name, loc in rows)


def kill_loop(cwd: Path, cfg: Path, kills: int, rng: random.Random,
              budget_s: float) -> dict[str, int]:
    """SIGKILL ``lakehouse sync`` runs until ``kills`` kills. Half the kills come after a blind
    random delay (start-up, catalog and table creation, reading, anything); the other half once
    the run has committed something, after a further random delay of up to a second (between
    and inside commits). A run that finishes first is counted: then the backlog ran out."""
    done = {"kills": 0, "finished": 0, "commits_between_kills": 0}
    deadline = time.monotonic() + budget_s
    before = _commits(cwd)
    while done["kills"] < kills and time.monotonic() < deadline:
        proc = subprocess.Popen([*OFFLOADD, "lakehouse", "sync", "--json", "--config", str(cfg)],
                                cwd=cwd,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                stdin=subprocess.DEVNULL)
        if rng.random() < 0.5:
            delay = rng.uniform(0.2, 3.0)
        else:
            until = time.monotonic() + 30
            while proc.poll() is None and _commits(cwd) == before and time.monotonic() < until:
                time.sleep(0.05)
            delay = rng.uniform(0.0, 1.0)
        try:
            proc.wait(timeout=delay)
            done["finished"] += 1
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            done["kills"] += 1
        now = _commits(cwd)
        if now != before:
            done["commits_between_kills"] += 1
        before = now
    return done


def check(cfg: Path, cwd: Path, sent: dict[str, Any]) -> None:
    run(["lakehouse", "sync", "--json", "--config", str(cfg)], cwd, timeout=300)
    settings = settings_of(cfg)
    for topic in TOPICS:
        rows = table_rows(settings, topic)
        assert distinct_positions(rows) == rows.num_rows, f"{topic}: duplicate rows"
        assert digest(rows) == sent["topics"][topic]["sent"], f"{topic}: rows differ"


@pytest.mark.timeout(900)  # a hang guard: the kill loop alone may take its 300 s budget
def test_twenty_kills_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    cfg, sent = backlog(tmp_path, 8)
    seed = int(os.environ.get("OFFLOADD_KILL_SEED", time.time_ns() % 1_000_000))
    stats = kill_loop(tmp_path, cfg, 20, random.Random(seed), budget_s=300)
    print(f"kill loop (seed {seed}): {stats}")
    assert stats["kills"] >= 20, stats
    assert stats["finished"] == 0, f"the backlog ran out before 20 kills: {stats}"
    assert stats["commits_between_kills"] >= 5, stats  # the kills interrupted real progress
    check(cfg, tmp_path, sent)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_hundred_kills(tmp_path: Path) -> None:
    cfg, sent = backlog(tmp_path, 30)
    seed = int(os.environ.get("OFFLOADD_KILL_SEED", time.time_ns() % 1_000_000))
    stats = kill_loop(tmp_path, cfg, 100, random.Random(seed), budget_s=1200)
    print(f"kill loop (seed {seed}): {stats}")
    assert stats["kills"] >= 100, stats
    check(cfg, tmp_path, sent)
