"""Disk full, on small tmpfs volumes (we are root on these machines; the tests skip, saying why,
where mounting is not permitted):

- the filesystem tier fills up while the daemon offloads: every failed write is reported as
  "disk full: free space on the volume", nothing half-written is committed, and once the volume
  grows (``mount -o remount,size=...``) the daemon carries on by itself and finishes;
- the embedded store (metadata and ledgers) is full when the daemon starts: it exits with an
  error that says the disk is full and where, changing nothing; ``status`` says the same; once
  space returns the daemon runs and finishes.

Either way verify then finds every entry once, with the source's CRC32C, and no orphan.
"""

from __future__ import annotations

import errno
import subprocess
import uuid
from collections.abc import Callable, Iterator
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
    merge,
    ok,
    verify,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.integration

Mount = Callable[[Path, str], Path]


@pytest.fixture
def tmpfs() -> Iterator[Mount]:
    """``tmpfs(dir, "8m")`` mounts a tmpfs of that size on ``dir``; all are unmounted after."""
    mounted: list[Path] = []

    def mount(where: Path, size: str) -> Path:
        where.mkdir(parents=True, exist_ok=True)
        p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                           capture_output=True, text=True, timeout=30)
        if p.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root): {p.stderr.strip()}")
        mounted.append(where)
        return where

    try:
        yield mount
    finally:
        for where in reversed(mounted):
            if subprocess.run(["umount", str(where)], capture_output=True,
                              timeout=30).returncode != 0:
                subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _readyz(port: int) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def resize(where: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(where)], check=True,
                   capture_output=True, timeout=30)


def _write_until_error(path: Path, chunk: bytes) -> int | None:
    try:
        with open(path, "ab") as f:
            while True:
                f.write(chunk)
                f.flush()
    except OSError as exc:  # from a write, or from the close flushing what is left
        return exc.errno


def fill(volume: Path) -> Path:
    """Write a file until the volume has no space left; its path (delete it to free space)."""
    path = volume / f"filler-{uuid.uuid4().hex[:8]}"
    assert _write_until_error(path, b"\0" * 65536) == errno.ENOSPC
    assert _write_until_error(path, b"\0") == errno.ENOSPC  # the last few bytes too
    return path


@pytest.mark.timeout(150)
def test_a_tier_that_fills_up_is_reported_and_offload_resumes_when_it_grows(
        tmp_path: Path, tmpfs: Mount, figures: Figures) -> None:
    tier = tmpfs(tmp_path / "tiervol", "2m")
    port = _free_port()
    cfg = write_config(tmp_path / "offloadd.toml", merge(local_sections(tmp_path), {
        "blobstore": {"path": str(tier / "tier")},
        "offload": {"max_size_per_segment_mbytes": 0.25, "max_block_size_bytes": 65536},
        "metrics": {"enabled": True, "bind": f"127.0.0.1:{port}"},
        "daemon": {"log_level": "INFO"}}))
    outputs = Outputs(tmp_path / "outputs")
    ok(cli(["produce", "--json", "--config", str(cfg), "--topics", "2", "--bytes", "5000000"],
           tmp_path,
           outputs=outputs))
    d = Proc(["run", "--config", str(cfg)], tmp_path, outputs.new("run.log"))
    try:
        d.wait_for(lambda t: "disk full: free space on the volume" in t, 60,
                   "the tier to fill up and the daemon to say so")
        full_at = counts(cfg)
        assert 0 < sum(c.committed for c in full_at.values()) < sum(
            c.written for c in full_at.values())
        # not ready while full, saying why (it answered 200 "blob store circuit is healthy").
        # Not at once: an aborted upload frees room, and a segment that then fits is written
        # whole (which lifts the refusal) before the volume is full for good
        wait_until(lambda: (lambda r: r[0] == 503 and "disk full" in r[1])(_readyz(port)), 30,
                   "/readyz to answer 503 naming the full disk")
        resize(tier, "64m")
        wait_until(lambda: drained(cfg), 90, "offload to finish once the tier has room")
        assert d.alive()
        wait_until(lambda: _readyz(port)[0] == 200, 30, "ready again once writes succeed")
    finally:
        assert d.stop() == 0, d.text()[-4000:]
    errors = d.text().count("disk full: free space on the volume")
    sweep = gc(cfg, tmp_path, grace=0, outputs=outputs)
    rep = verify(cfg, tmp_path, outputs=outputs)
    got = integrity(rep, counts(cfg))
    figures.set("disk_full_tier", faults_injected=1, faults_survived=1 if rep["ok"] else 0,
                disk_full_errors_reported=errors, entries_written=got.written,
                entries_checked=got.entries, entries_lost=got.lost,
                entries_duplicated=got.duplicated, checksum_mismatches=got.checksum_mismatches,
                orphans_removed_by_gc=len(sweep["orphans_removed"]), orphans_left=got.orphans)
    assert rep["ok"], rep
    assert got.lost == 0 and got.duplicated == 0 and got.source_checked == got.entries > 0


@pytest.mark.timeout(120)
def test_a_full_embedded_store_is_a_clear_error_and_nothing_changes_until_space_returns(
        tmp_path: Path, tmpfs: Mount, figures: Figures) -> None:
    vol = tmpfs(tmp_path / "storevol", "8m")
    cfg = write_config(tmp_path / "offloadd.toml", merge(local_sections(
        tmp_path, metadata_url=f"embedded:{vol}/metadata"), {
            "source": {"path": str(vol / "ledgers")},
            "offload": {"max_size_per_segment_mbytes": 0.25, "max_block_size_bytes": 65536},
            "daemon": {"log_level": "INFO"}}))
    outputs = Outputs(tmp_path / "outputs")
    ok(cli(["produce", "--json", "--config", str(cfg), "--topics", "2", "--bytes", "3000000"],
           tmp_path,
           outputs=outputs))
    before = counts(cfg)
    db = (vol / "metadata" / "metadata.db").read_bytes()
    filler = fill(vol)

    run = cli(["run", "--config", str(cfg)], tmp_path, timeout=60, outputs=outputs)
    status = cli(["status", "--config", str(cfg)], tmp_path, outputs=outputs)
    for p in (run, status):
        assert p.returncode == 1, p.stderr
        assert "disk full" in p.stderr and str(vol / "metadata") in p.stderr, p.stderr
        assert "Traceback" not in p.stderr
    assert (vol / "metadata" / "metadata.db").read_bytes() == db  # untouched

    filler.unlink()
    assert counts(cfg) == before
    d = Proc(["run", "--config", str(cfg)], tmp_path, outputs.new("run.log"))
    try:
        wait_until(lambda: drained(cfg), 90, "offload to finish once there is room")
    finally:
        assert d.stop() == 0, d.text()[-4000:]
    rep = verify(cfg, tmp_path, outputs=outputs)
    got = integrity(rep, counts(cfg))
    figures.set("disk_full_embedded_store", faults_injected=1,
                faults_survived=1 if rep["ok"] else 0, entries_written=got.written,
                entries_checked=got.entries, entries_lost=got.lost,
                entries_duplicated=got.duplicated, checksum_mismatches=got.checksum_mismatches,
                orphans_left=got.orphans)
    assert rep["ok"], rep
    assert got.lost == 0 and got.duplicated == 0 and got.source_checked == got.entries > 0
