"""One embedded store, several processes: who is refused, and what ``verify`` sees when the
catalog and the store's files disagree (issue 13, defect 4).

Two ``offloadd standalone`` in one directory used to run side by side: the second closed the
first's open ledgers in the catalog (it took them for a dead writer's) while the first kept
appending to their files; the entries past the recorded ends were never offloaded, and
``verify``, which compared the catalog only with itself, said OK. Now the store is locked (a
writer lock and an offloader lock under ``[source] path``) and ``verify`` compares every closed
ledger's recorded end with what its files hold.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from offloadd.ledger.local import frame_entries, ledger_files
from tests.reliability.conftest import Figures
from tests.reliability.support import (
    Proc,
    cli,
    counts,
    local_sections,
    ok,
    verify,
    write_config,
)

pytestmark = pytest.mark.integration


def _says(path: Path, what: str) -> bool:
    try:
        return what in path.read_text()
    except OSError:
        return False


@pytest.mark.timeout(180)
def test_a_second_writer_or_daemon_on_a_standalones_store_is_refused(
        tmp_path: Path, figures: Figures) -> None:
    figures.add("bad_input", cases=3)
    cfg = write_config(tmp_path / "offloadd.toml", local_sections(tmp_path))
    sections = local_sections(tmp_path)
    sections["daemon"]["pid_file"] = f"{tmp_path}/other.pid"
    other_pid_file = write_config(tmp_path / "other.toml", sections)
    # long enough to outlive the three refused commands, whose start-ups alone took over 6 s
    # on a loaded machine (the last one then found the store free, and ran)
    first = Proc(["standalone", "--json", "--config", str(cfg), "--duration", "25", "--rate",
                  "300000",
                  "--topics", "2"], tmp_path, tmp_path / "first.log")
    try:
        pid_file = tmp_path / "data" / "offloadd.pid"  # written once it is up and writing
        deadline = time.monotonic() + 60
        while not _says(pid_file, str(first.pid)):
            assert first.alive() and time.monotonic() < deadline, first.text()[-4000:]
            time.sleep(0.02)
        refused = {
            "standalone": cli(["standalone", "--json", "--config", str(cfg), "--duration", "2",
                               "--rate",
                               "300000", "--topics", "2"], tmp_path),
            "produce": cli(["produce", "--json", "--config", str(cfg), "--topics", "2", "--bytes",
                            "100000"], tmp_path),
            # its own pid file: the pid-file check alone would not have stopped it
            "run": cli(["run", "--config", str(other_pid_file)], tmp_path, timeout=60),
        }
        assert first.alive(), first.text()[-4000:]
        for name, p in refused.items():
            assert p.returncode == 1, (name, p.returncode, p.stderr[-2000:])
            kind = "offloader" if name == "run" else "writer"
            assert (f"is in use: offloadd standalone (pid {first.pid}) holds its {kind} lock"
                    in p.stderr), (name, p.stderr[-2000:])
            assert "Traceback" not in p.stderr
        assert first.wait(120) == 0, first.text()[-4000:]
    finally:
        first.kill9()
    summary = json.loads(first.out.read_text().strip().splitlines()[-1])
    assert summary["drained"] is True, summary
    written = summary["entries_written"]
    offloaded = sum(t["entries_offloaded"] for t in summary["topics"].values())
    assert written > 0 and offloaded == written, summary
    c = counts(cfg)
    assert sum(t.written for t in c.values()) == written
    rep = verify(cfg, tmp_path)
    assert rep["ok"], rep
    figures.add("bad_input", cases_passed=3)


@pytest.fixture(scope="module")
def offloaded_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A standalone run, finished: closed ledgers, every entry committed."""
    root = tmp_path_factory.mktemp("store-safety")
    cfg = write_config(root / "offloadd.toml", local_sections(root))
    ok(cli(["standalone", "--json", "--config", str(cfg), "--duration", "2", "--rate", "300000",
            "--topics", "1"], root, timeout=120))
    return root


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src / "data", dst / "data")
    return write_config(dst / "offloadd.toml", local_sections(dst))


def _closed_ledgers(cfg: Path) -> list[tuple[int, int]]:
    """(ledger id, entries) of the topic's closed ledgers, from the catalog."""
    import asyncio

    from offloadd import config, wiring
    from offloadd.metadata import managed_ledger

    async def go() -> list[tuple[int, int]]:
        md = await wiring.open_metadata(config.load(str(cfg)))
        try:
            (name,) = await managed_ledger.list_names(md)
            info, _ = await managed_ledger.load(md, name)
            return [(li.ledgerId, li.entries) for li in info.ledgerInfo if li.HasField("entries")]
        finally:
            await md.close()

    return asyncio.run(go())


def _verify_text(cfg: Path, cwd: Path) -> tuple[int, str]:
    p = cli(["verify", "--config", str(cfg), "--orphan-grace", "0"], cwd)
    assert "Traceback" not in p.stderr, p.stderr
    return p.returncode, p.stdout + p.stderr


@pytest.mark.timeout(120)
def test_verify_reports_entries_a_second_writer_left_past_a_closed_ledgers_end(
        offloaded_store: Path, tmp_path: Path, figures: Figures) -> None:
    """What the second standalone left behind: the catalog closed a ledger at N entries while
    its files go on (the first writer kept appending). No segment will ever cover them."""
    figures.add("bad_input", cases=1)
    cfg = _copy(offloaded_store, tmp_path)
    assert verify(cfg, tmp_path)["ok"]
    ledger_id, entries = _closed_ledgers(cfg)[0]
    files = ledger_files(tmp_path / "data" / "ledgers", ledger_id)
    log_end = files.log.stat().st_size
    frames, crcs, offs, _ = frame_entries([b"acknowledged, never offloaded"] * 7, entries,
                                          log_end)
    for path, data in ((files.log, frames), (files.crc, crcs), (files.off, offs)):
        with path.open("ab") as f:
            f.write(data)
    code, said = _verify_text(cfg, tmp_path)
    assert code == 1 and "verify: FAILED" in said, said
    assert (f"ledger {ledger_id}: the catalog closed it at {entries} entries, but the source "
            f"holds {entries + 7}: entries {entries}..{entries + 6} were written after it was "
            "closed") in said, said
    figures.add("bad_input", cases_passed=1)


@pytest.mark.timeout(120)
def test_verify_reports_committed_entries_the_source_no_longer_holds(
        offloaded_store: Path, tmp_path: Path, figures: Figures) -> None:
    figures.add("bad_input", cases=1)
    cfg = _copy(offloaded_store, tmp_path)
    ledger_id, entries = _closed_ledgers(cfg)[0]
    files = ledger_files(tmp_path / "data" / "ledgers", ledger_id)
    keep = entries - 3
    offsets = files.off.read_bytes()
    cut = int.from_bytes(offsets[8 * keep:8 * keep + 8], "little")
    for path, size in ((files.off, 8 * keep), (files.crc, 4 * keep), (files.log, cut)):
        with path.open("r+b") as f:
            f.truncate(size)
    code, said = _verify_text(cfg, tmp_path)
    assert code == 1 and "verify: FAILED" in said, said
    assert (f"ledger {ledger_id}: the catalog closed it at {entries} entries, but the source "
            f"holds {keep}: entries {keep}..{entries - 1} are missing from the source") in said
    assert f"but the source holds only {keep} entries of it" in said, said
    figures.add("bad_input", cases_passed=1)
