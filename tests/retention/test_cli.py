"""``offloadd gc`` as a process: dry run, then the real pass, then ``offloadd verify``."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from offloadd.model.keys import streaming_data_key, streaming_index_key
from tests.retention.rig import Rig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CONFIG = """
[metadata]
url = "embedded:./metadata"
[source]
path = "./ledgers"
[blobstore]
driver = "filesystem"
path = "./tier"
[retention]
orphan_grace_s = 3600
"""


def offloadd(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "offloadd", *args, "--config", "c.toml"],
                          cwd=cwd, capture_output=True, text=True, timeout=60)


async def test_gc_removes_deleted_segments_and_orphans_then_verify_passes(
        tmp_path: Path) -> None:
    (tmp_path / "c.toml").write_text(CONFIG)
    rig = await Rig.open(tmp_path)
    try:
        await rig.write(60)
        await rig.offload_all()
        s1 = (await rig.segments())[0]
        await rig.gc()  # track, so that deleting the ledgers marks S1
        await rig.delete_ledgers(list(s1.ledger_ids()))
        ghost = streaming_data_key(uuid.uuid4())
        await rig.blob.put(ghost, [b"x"], {})
    finally:
        await rig.close()
    s1_keys = {streaming_data_key(s1.uid), streaming_index_key(s1.uid)}

    dry = offloadd(tmp_path, "gc", "--json", "--dry-run", "--grace", "0")
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert plan["dry_run"] and plan["orphans_removed"] == [ghost]
    assert [d["segment"] for d in plan["deleted_segments"]] == [str(s1.uid)]
    assert all((tmp_path / "tier" / k).exists() for k in (*s1_keys, ghost))

    young = offloadd(tmp_path, "gc")  # config grace of an hour: the ghost stays
    assert young.returncode == 0, young.stderr
    assert "gc: 1 segment(s), 0 orphan(s)" in young.stdout and "OK" in young.stdout
    assert (tmp_path / "tier" / ghost).exists()
    assert not any((tmp_path / "tier" / k).exists() for k in s1_keys)

    done = offloadd(tmp_path, "gc", "--grace", "0", "--json")
    assert done.returncode == 0, done.stderr
    rep = json.loads(done.stdout)
    assert rep["ok"] and rep["orphans_removed"] == [ghost] and rep["deleted_segments"] == []
    assert not (tmp_path / "tier" / ghost).exists()

    ver = offloadd(tmp_path, "verify", "--json", "--orphan-grace", "0")
    assert ver.returncode == 0, ver.stdout + ver.stderr
    assert json.loads(ver.stdout)["orphans"] == []
