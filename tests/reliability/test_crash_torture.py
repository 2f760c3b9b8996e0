"""Crash torture: ``offloadd run`` is killed with SIGKILL again and again while it works, and
restarted each time; afterwards nothing committed is missing, duplicated or wrong, and one gc
pass leaves no orphan.

The rig: a pre-produced history on two topics plus a live ``offloadd produce`` writer, a daemon
with small segments (~50 KB, 8 KiB blocks, closed within 0.3 s) and a gc pass every 0.5 s, so
commits are frequent and a kill lands in every phase. Two kinds of kill alternate:

- random: at a uniform 0.05..1.5 s after the daemon's first log line (stores open, recovery
  about to run);
- aimed: as soon as the daemon logs a phase marker (multipart started, blocks built, parts in
  flight, range assigned, data complete, index written / committing, redo of an assigned
  segment, an orphan deleted by the gc loop). Orphans for the gc loop to delete are planted
  (copies of committed objects under fresh uuids, older than the grace period) before those.

Where each kill landed is read from the process's last log line (``[daemon] log_level = DEBUG``
and the phase lines in :mod:`offloadd.offload.topic`), and counted.
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
import shutil
import signal
import time
import uuid
from pathlib import Path

import pytest

from tests.reliability.conftest import Figures
from tests.reliability.support import (
    Outputs,
    Proc,
    cli,
    counts,
    drained,
    gc,
    integrity,
    local_sections,
    ok,
    verify,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.integration

# (marker in the daemon's log, the phase a kill right after it lands in); the last line a killed
# daemon wrote names its phase. A multipart upload starts and its first part is submitted with no
# pause between the two lines, so a kill aimed at the start counts as mid-multipart.
MARKERS = [
    ("building a block from", "block build"),
    ("multipart upload started", "mid-multipart"),
    ("part(s) uploading", "mid-multipart"),
    (": assigning ", "assign (range commit)"),
    ("assigned; draining parts", "mid-multipart after assign"),
    ("data object complete; writing index", "between upload and commit"),
    ("index written; committing", "during commit"),
    ("redoing assigned segment", "recovery redo"),
    ("deleted orphan object", "during gc"),
]
REDO = "redoing assigned segment"
GC = "deleted orphan object"
# kills that leave an ASSIGNED segment are followed by one aimed at its redo at start-up
_THEN_REDO = {"assigned; draining parts", "data object complete; writing index"}


def plan(kills: int) -> list[str | None]:
    """Random kills (None) alternating with aimed ones (a marker), cycling through the markers."""
    aims = [m for m, _ in MARKERS if m != REDO]
    out: list[str | None] = []
    k = 0
    while len(out) < kills:
        out.append(None)
        aim = aims[k % len(aims)]
        k += 1
        out.append(aim)
        if aim in _THEN_REDO:
            out.append(REDO)
    return out[:kills]


def phase_of(lines: list[str]) -> str:
    """The phase a kill landed in: a start-up redo not finished yet, else what the last line the
    process wrote says."""
    redoing: set[str] = set()
    for line in lines:
        topic = line.partition(" topic ")[2].partition(": ")[0]
        if "redoing assigned segment" in line:
            redoing.add(topic)
        elif " offloaded: " in line:
            redoing.discard(topic)
    if redoing:
        return "recovery redo"
    last = lines[-1] if lines else ""
    for marker, phase in MARKERS:
        if marker in last:
            return phase
    if " offloaded: " in last:
        return "after commit"
    return "start-up / idle"


def plant_orphans(tier: Path, n: int, age_s: float) -> list[str]:
    """Copy committed data objects under fresh uuids (with their metadata sidecars), dated
    ``age_s`` seconds back: objects nothing references, as a crashed writer would leave."""
    objs = [p for p in tier.iterdir() if p.is_file() and len(p.name) == 36]
    then = time.time() - age_s
    planted = []
    for src in objs[:n]:
        uid = str(uuid.uuid4())
        shutil.copyfile(src, tier / uid)
        meta = tier / ".meta" / f"{src.name}.json"
        if meta.exists():
            shutil.copyfile(meta, tier / ".meta" / f"{uid}.json")
        os.utime(tier / uid, (then, then))
        planted.append(uid)
    return planted


def wait_logged(d: Proc, marker: str, timeout: float) -> None:
    """Until ``marker`` is in the log (TimeoutError after ``timeout``); fails if ``d`` exits."""
    deadline = time.monotonic() + timeout
    while marker not in d.text():
        if not d.alive():
            raise AssertionError(f"the daemon exited {d.proc.returncode}:\n{d.text()[-4000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError(marker)
        time.sleep(0.005)


def torture(tmp_path: Path, figures: Figures, *, kills: int, history_bytes: int,
            rate: int, seed: int, section: str = "crash_torture") -> None:
    rng = random.Random(seed)
    cfg = write_config(tmp_path / "offloadd.toml", local_sections(tmp_path))
    outputs = Outputs(tmp_path / "outputs")
    tier = tmp_path / "data" / "tier"
    ok(cli(["produce", "--json", "--config", str(cfg), "--topics", "2", "--bytes",
            str(history_bytes),
            "--entry-size", "512"], tmp_path, outputs=outputs), "the history writer")
    writer = Proc(["produce", "--json", "--config", str(cfg), "--topics", "2", "--duration", "3600",
                   "--rate", str(rate), "--entry-size", "512"], tmp_path, outputs.new("writer.log"))
    phases: collections.Counter[str] = collections.Counter()
    aimed = 0
    planted: set[str] = set()
    run_args = ["run", "--config", str(cfg)]
    nxt: Proc | None = Proc(run_args, tmp_path, outputs.new("run-000.log"), preload=True)
    t0 = time.monotonic()
    try:
        for i, target in enumerate(plan(kills)):
            if target == GC and tier.exists():
                planted.update(plant_orphans(tier, 20, age_s=60))
            assert nxt is not None
            d, nxt = nxt, None
            d.go()
            # the next daemon imports while this one works
            nxt = Proc(run_args, tmp_path, outputs.new(f"run-{i + 1:03d}.log"), preload=True)
            try:
                d.wait_for(bool, 20, "the daemon's first log line")
                if target is None:
                    time.sleep(rng.uniform(0.05, 1.5))
                else:
                    aimed += 1
                    with contextlib.suppress(TimeoutError):
                        wait_logged(d, target, 2.5)
            finally:
                d.kill9()
            phases[phase_of(d.lines())] += 1
            assert d.proc.returncode == -signal.SIGKILL, d.text()[-2000:]
            assert writer.alive(), writer.text()[-2000:]
        torture_s = time.monotonic() - t0
    finally:
        if nxt is not None:
            nxt.kill9()
        assert writer.stop(30) == 0, writer.text()[-2000:]

    # A last, undisturbed run drains everything written, then stops gracefully.
    final = Proc(["run", "--config", str(cfg)], tmp_path, outputs.new("run-final.log"))
    try:
        wait_until(lambda: drained(cfg), 120, "every written entry to be committed")
    finally:
        assert final.stop(60) == 0, final.text()[-4000:]

    written = counts(cfg)
    before = verify(cfg, tmp_path, outputs=outputs)
    first = integrity(before, written)
    sweep = gc(cfg, tmp_path, grace=0, outputs=outputs)
    after = verify(cfg, tmp_path, outputs=outputs)
    last = integrity(after, written)
    leftover_uploads = list((tier / ".uploads").iterdir()) if (tier / ".uploads").exists() else []

    figures.set(section, kills=kills, aimed_kills=aimed, random_kills=kills - aimed,
                restarts=kills + 1, kills_by_phase=dict(sorted(phases.items())),
                torture_seconds=round(torture_s, 1), orphans_planted=len(planted),
                planted_removed_by_daemon_gc=len(planted - set(before["orphans"])),
                entries_written=last.written, entries_checked=last.entries,
                source_checked=last.source_checked, entries_lost=last.lost,
                entries_duplicated=last.duplicated,
                checksum_mismatches=last.checksum_mismatches,
                # what the kills left (planted ones aside) for the final gc pass
                orphans_before_gc=len(set(before["orphans"]) - planted),
                orphans_removed_by_gc=len(sweep["orphans_removed"]),
                uploads_swept_by_gc=sweep["uploads_swept"],
                orphans_left=last.orphans + len(leftover_uploads),
                faults_injected=kills, faults_survived=kills if after["ok"] else 0)

    assert before["topics"] and all(t["ok"] for t in before["topics"]), before
    assert first.lost == 0 and first.duplicated == 0 and first.checksum_mismatches == 0
    assert sweep["ok"], sweep
    assert after["ok"], after
    assert last.orphans == 0 and leftover_uploads == []
    assert last.lost == 0 and last.duplicated == 0 and last.errors == []
    assert last.entries == last.written > 0
    # every committed entry's payload was compared with the source's
    assert last.source_checked == last.entries
    # the kills did land while the daemon worked, not only while it started
    assert sum(n for p, n in phases.items() if p != "start-up / idle") >= kills // 2, phases


@pytest.mark.timeout(300)
def test_fifty_kill9_at_random_and_aimed_moments_lose_and_duplicate_nothing(
        tmp_path: Path, figures: Figures) -> None:
    torture(tmp_path, figures, kills=50, history_bytes=4_000_000, rate=150_000, seed=1)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_long_torture_of_three_hundred_kill9(tmp_path: Path, figures: Figures) -> None:
    torture(tmp_path, figures, kills=300, history_bytes=20_000_000, rate=300_000, seed=2,
            section="crash_torture_long")
