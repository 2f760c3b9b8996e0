"""Generated protobuf modules are built from proto/ by scripts/gen-proto, never hand-edited."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(120)
def test_generated_modules_match_the_proto_sources(tmp_path: Path) -> None:
    subprocess.run([str(ROOT / "scripts" / "gen-proto"), str(tmp_path)], check=True,
                   capture_output=True, timeout=100)
    fresh = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.suffix in (".py", ".pyi")}
    committed = {p.name: p.read_bytes() for p in (ROOT / "offloadd" / "_proto").iterdir()
                 if p.suffix in (".py", ".pyi") and p.name != "__init__.py"}
    assert fresh, "scripts/gen-proto produced nothing"
    stale = sorted(n for n in fresh.keys() | committed.keys() if fresh.get(n) != committed.get(n))
    assert not stale, f"offloadd/_proto is stale for {stale}: run scripts/gen-proto"
