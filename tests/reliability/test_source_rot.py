"""A flipped bit in the embedded store is never uploaded (issue 13, defect 6).

Before, with the default configuration, ``offloadd run`` read a rotten entry, framed it into a
block, stamped the block with a fresh (valid) CRC32C and committed it: the tier then held the
wrong bytes under a good checksum, and ``read`` returned them with exit 0. Now the source checks
what it reads, by default: the segment holding the entry fails, is retried, and stays failing —
visible in the daemon's status and metrics — until the file is repaired; the entry is never
skipped, and nothing after it is committed before it.
"""

from __future__ import annotations

import json
import socket
import struct
import urllib.request
from pathlib import Path

import pytest

from offloadd.ledger.local import ledger_files
from offloadd.model import FRAME_OVERHEAD
from tests.reliability.conftest import Figures
from tests.reliability.support import (
    Proc,
    cli,
    counts,
    local_sections,
    merge,
    ok,
    verify,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.integration

TOPIC = "persistent://public/default/rot"
ML = "public/default/persistent/rot"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


def closed_ledgers(root: Path) -> list[tuple[int, int]]:
    import asyncio

    from offloadd.metadata import managed_ledger
    from offloadd.metadata.embedded import EmbeddedMetadataStore

    async def go() -> list[tuple[int, int]]:
        md = await EmbeddedMetadataStore.open(root / "data" / "metadata")
        try:
            info, _ = await managed_ledger.load(md, ML)
            return [(li.ledgerId, li.entries) for li in info.ledgerInfo if li.HasField("entries")]
        finally:
            await md.close()

    return asyncio.run(go())


def committed_end(root: Path) -> tuple[int, int] | None:
    import asyncio

    from offloadd.metadata import managed_ledger
    from offloadd.metadata.embedded import EmbeddedMetadataStore
    from offloadd.model import catalog

    async def go() -> tuple[int, int] | None:
        md = await EmbeddedMetadataStore.open(root / "data" / "metadata")
        try:
            info, _ = await managed_ledger.load(md, ML)
            ends = [tuple(s.end) for s in catalog.segments(info)]  # assigned ones too
            return max(ends) if ends else None  # type: ignore[return-value]
        finally:
            await md.close()

    return asyncio.run(go())


@pytest.mark.timeout(240)
def test_a_rotten_source_entry_fails_its_segment_until_repaired_and_is_never_skipped(
        tmp_path: Path, figures: Figures) -> None:
    figures.add("bad_input", cases=1)
    port = free_port()
    cfg = write_config(tmp_path / "offloadd.toml", merge(local_sections(tmp_path), {
        "metrics": {"enabled": True, "bind": f"127.0.0.1:{port}"}}))
    ok(cli(["produce", "--json", "--config", str(cfg), "--topic", TOPIC, "--bytes", "400000",
            "--entry-size", "1000"], tmp_path))
    ledger_id, entries = closed_ledgers(tmp_path)[2]
    victim = entries // 2
    f = ledger_files(tmp_path / "data" / "ledgers", ledger_id)
    start = struct.unpack("<q", f.off.read_bytes()[8 * victim:8 * victim + 8])[0]
    at = start + FRAME_OVERHEAD + 321
    good = f.log.read_bytes()
    rotten = bytearray(good)
    rotten[at] ^= 0x04  # one bit
    f.log.write_bytes(bytes(rotten))

    d = Proc(["run", "--config", str(cfg)], tmp_path, tmp_path / "run.log")
    try:
        said = f"entry {victim}: payload CRC32C"
        d.wait_for(lambda t: said in t, 60, "the rotten entry to be refused")
        d.wait_for(lambda t: t.count(said) >= 3, 60, "the segment to be retried")
        line = next(ln for ln in d.lines() if said in ln)
        assert f"topic {TOPIC}" in line and f"ledger {ledger_id}" in line and str(f.log) in line
        # nothing at or past the rotten entry is committed, or even assigned
        end = committed_end(tmp_path)
        assert end is None or end < (ledger_id, victim), end
        status = json.loads(get(f"http://127.0.0.1:{port}/status"))["topics"][TOPIC]
        assert status["failed_attempts"] >= 1 and said in status["last_error"], status
        metrics = get(f"http://127.0.0.1:{port}/metrics")
        errors = [ln for ln in metrics.splitlines()
                  if ln.startswith("brk_ledgeroffloader_offload_error") and TOPIC in ln]
        assert errors and float(errors[0].rsplit(" ", 1)[1]) >= 1, errors
        # repaired (a replica, a backup): the same entry goes up, and everything after it
        f.log.write_bytes(good)
        wait_until(lambda: counts(cfg)[ML].committed == counts(cfg)[ML].written, 60,
                   "everything to be committed once the file is repaired")
        assert d.stop(60) == 0, d.text()[-4000:]
    finally:
        d.kill9()
    rep = verify(cfg, tmp_path)  # contiguous, and every payload's CRC32C equals the source's
    assert rep["ok"], rep
    (topic,) = rep["topics"]
    assert topic["source_checked"] == topic["entries"] == counts(cfg)[ML].written
    figures.add("bad_input", cases_passed=1)
