"""A filesystem tier copied by hand (``cp -r tier/* copy/``) loses its hidden ``.meta`` directory:
every object's user metadata. Which blocks carry a CRC32C must not be lost with it — the index
object records it in its own bytes (Pulsar-readable, see ``format/checksum.py``) — so a block whose
checksum mark and payload rot together still fails ``read`` (naming the block) and ``verify``,
and ``verify`` calls the lost metadata an error of its own (Pulsar's readers refuse objects
without it).
"""

from __future__ import annotations

import asyncio
import re
import subprocess
from pathlib import Path

import pytest

from offloadd.metadata import managed_ledger
from offloadd.metadata.embedded import EmbeddedMetadataStore
from offloadd.model import catalog
from tests.reliability.support import cli, local_sections, merge, ok, write_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOPIC = "persistent://public/default/topic-0"
ML = "public/default/persistent/topic-0"


def flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


async def committed(root: Path) -> list[str]:
    md = await EmbeddedMetadataStore.open(root / "data" / "metadata")
    try:
        info, _ = await managed_ledger.load(md, ML)
        return [str(s.uid) for s in catalog.segments(info) if s.complete]
    finally:
        await md.close()


@pytest.fixture(scope="module")
def copied(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """A standalone run's tier, copied with ``cp -r tier/*`` and the config pointed at the copy;
    (root, config, uid of the segment to damage)."""
    root = tmp_path_factory.mktemp("copied")
    sections = merge(local_sections(root), {"offload": {"max_size_per_segment_mbytes": 0.1,
                                                        "max_block_size_bytes": 16384}})
    cfg = write_config(root / "offloadd.toml", sections)
    ok(cli(["standalone", "--json", "--config", str(cfg), "--duration", "1", "--rate", "400000",
            "--topics", "1"], root, timeout=120))
    (root / "data" / "copy").mkdir()
    subprocess.run("cp -r data/tier/* data/copy/", shell=True, cwd=root, check=True)
    assert (root / "data" / "tier" / ".meta").is_dir()
    assert not (root / "data" / "copy" / ".meta").exists()  # the glob skips hidden names
    cfg = write_config(root / "offloadd.toml", merge(
        sections, {"blobstore": {"path": f"{root}/data/copy"}}))
    uids = asyncio.run(committed(root))
    assert len(uids) >= 2
    return root, cfg, uids[-1]


def test_verify_calls_the_lost_metadata_an_error(copied: tuple[Path, Path, str]) -> None:
    root, cfg, uid = copied
    ver = cli(["verify", "--config", str(cfg), "--orphan-grace", "0"], root)
    assert ver.returncode == 1, ver.stdout + ver.stderr
    assert "verify: FAILED" in ver.stdout
    assert re.search(rf"{uid}-index: .*metadata is missing", ver.stdout), ver.stdout


def test_a_rotten_mark_and_payload_fail_read_and_verify_without_the_metadata(
        copied: tuple[Path, Path, str]) -> None:
    root, cfg, uid = copied
    data = root / "data" / "copy" / uid
    flip(data, 36)  # the checksum mark of block 1 (header bytes 36..39)
    flip(data, 128 + 12 + 5)  # a payload byte of its first entry
    try:
        read = cli(["read", "--config", str(cfg), "--topic", TOPIC], root)
        assert read.returncode == 1, read.stderr[-2000:]
        assert re.search(rf"{uid} \(block 1 at byte 0\) at byte 36: block checksum mark "
                         "damaged", read.stderr), read.stderr[-2000:]
        ver = cli(["verify", "--config", str(cfg), "--orphan-grace", "0"], root)
        assert ver.returncode == 1
        assert "block checksum mark damaged" in ver.stdout, ver.stdout
    finally:
        flip(data, 36)
        flip(data, 128 + 12 + 5)
