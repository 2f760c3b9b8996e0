"""Shared pieces of the lakehouse tests: ``offloadd`` subprocesses in a test directory, and the
table side of the writer's digest (rows in log order, SHA-1 over ``uint32 length + payload``)."""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

from offloadd import config as config_mod
from offloadd.config import Settings
from offloadd.lakehouse.tables import open_catalog
from offloadd.model import TopicName

OFFLOADD = [sys.executable, "-m", "offloadd"]

def write_config(cwd: Path, body: str = "", *, lakehouse: str = "enabled = true\n",
                 blobstore: str | None = None, name: str = "offloadd.toml") -> Path:
    """The standalone demo policy (small segments, short ledgers; a --config run does not get
    it) with every path absolute under ``cwd/data``, so subprocesses and the test process see
    the same stores. ``blobstore``: the [blobstore] table's body (default: filesystem)."""
    data = cwd / "data"
    if blobstore is None:
        blobstore = f'path = "{data}/tier"'
    text = f"""
[metadata]
url = "embedded:{data}/metadata"
[daemon]
pid_file = "{data}/offloadd.pid"
[blobstore]
{blobstore}
[source]
path = "{data}/ledgers"
rollover_bytes = 1572864
rollover_minutes = 0.25
[offload]
max_size_per_segment_mbytes = 4
max_segment_rollover_time_minutes = 0.1
max_block_size_bytes = 1048576
[metrics]
enabled = false
{body}
[lakehouse]
path = "{data}/lakehouse"
{lakehouse}
"""
    path = cwd / name
    path.write_text(text)
    return path


def run(args: list[str], cwd: Path, timeout: float = 120,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run([*OFFLOADD, *args], cwd=cwd, capture_output=True, text=True,
                       timeout=timeout, stdin=subprocess.DEVNULL)
    if check and p.returncode != 0:
        raise AssertionError(f"offloadd {' '.join(args)} exited {p.returncode}:\n"
                             f"{p.stderr[-4000:]}")
    return p


def settings_of(cfg: Path) -> Settings:
    return config_mod.load(cfg)


def table_rows(settings: Settings, topic: str) -> Any:
    """The topic's table as Arrow, in (ledger, entry, batch index) order."""
    t = TopicName.parse(topic)
    table = open_catalog(settings, create=False).load_table((t.tenant, t.namespace, t.local))
    return table.scan().to_arrow().sort_by([("ledger_id", "ascending"),
                                            ("entry_id", "ascending"),
                                            ("batch_index", "ascending")])


def digest(rows: Any) -> dict[str, Any]:
    h = hashlib.sha1()
    for p in rows.column("payload").to_pylist():
        p = p or b""
        h.update(struct.pack(">I", len(p)) + p)
    return {"messages": rows.num_rows, "sha1": h.hexdigest()}


def distinct_positions(rows: Any) -> int:
    cols = zip(rows.column("ledger_id").to_pylist(), rows.column("entry_id").to_pylist(),
               rows.column("batch_index").to_pylist(), strict=True)
    return len(set(cols))


def summary(out: str) -> dict[str, Any]:
    line = out.strip().splitlines()[-1]
    result: dict[str, Any] = json.loads(line)
    return result
