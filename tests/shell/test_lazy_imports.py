"""A daemon on the embedded default loads no library it does not use (issue 22: "the daemon's
baseline shrinks too: import heavy libraries only where used").

Checked in a fresh interpreter: the daemon is opened on an embedded store with the filesystem
tier and the metrics endpoint, runs a discovery pass, stops; then ``sys.modules`` must hold none
of the payload codecs (only decompressing a Pulsar batch needs them), the lakehouse's Arrow /
Iceberg / DuckDB, the S3 client or the ZooKeeper client.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HEAVY = ("lz4", "zstandard", "cramjam", "pyarrow", "pyiceberg", "duckdb", "botocore",
         "aiobotocore", "boto3", "kazoo", "pandas", "numpy")

SCRIPT = textwrap.dedent("""
    import asyncio, json, sys

    async def main(path):
        from offloadd import config
        from offloadd.shell.runtime import Runtime

        rt = await Runtime.open(config.load(path))
        try:
            await rt.start_metrics()
            task = asyncio.create_task(rt.daemon.run(install_signals=False))
            while not rt.daemon.ready:
                await asyncio.sleep(0.05)
            rt.daemon.request_stop()
            await task
        finally:
            await rt.close()

    asyncio.run(main(sys.argv[1]))
    print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
""")


@pytest.mark.timeout(180)
def test_the_embedded_default_daemon_imports_no_heavy_library(tmp_path: Path) -> None:
    cfg = tmp_path / "offloadd.toml"
    cfg.write_text(textwrap.dedent(f"""
        [metadata]
        url = "embedded:{tmp_path / 'metadata'}"
        [blobstore]
        driver = "filesystem"
        path = "{tmp_path / 'tier'}"
        [source]
        path = "{tmp_path / 'ledgers'}"
        [metrics]
        bind = "127.0.0.1:0"
        [daemon]
        pid_file = "{tmp_path / 'offloadd.pid'}"
    """))
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(cfg)], capture_output=True,
                       text=True, timeout=150, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    loaded = set(json.loads(p.stdout.strip().splitlines()[-1]))
    assert "offloadd" in loaded
    assert sorted(loaded & set(HEAVY)) == []


STATUS_SCRIPT = textwrap.dedent("""
    import asyncio, json, sys

    async def main(path):
        from offloadd import config, wiring
        from offloadd.shell.status import collect

        settings = config.load(path)
        md = await wiring.open_metadata(settings)  # status refuses a store that is not there
        await md.close()
        await collect(settings)

    asyncio.run(main(sys.argv[1]))
    print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
""")


@pytest.mark.timeout(180)
def test_status_imports_no_lakehouse_library_while_the_lakehouse_is_off(tmp_path: Path) -> None:
    """``offloadd status`` with the lakehouse off and no catalog: pyiceberg and its kin were a
    third of the command's start-up (issue 22, status at 10,000 topics)."""
    cfg = tmp_path / "offloadd.toml"
    cfg.write_text(textwrap.dedent(f"""
        [metadata]
        url = "embedded:{tmp_path / 'metadata'}"
        [source]
        path = "{tmp_path / 'ledgers'}"
        [lakehouse]
        path = "{tmp_path / 'lakehouse'}"
        [metrics]
        enabled = false
    """))
    p = subprocess.run([sys.executable, "-c", STATUS_SCRIPT, str(cfg)], capture_output=True,
                       text=True, timeout=150, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    loaded = set(json.loads(p.stdout.strip().splitlines()[-1]))
    assert "offloadd" in loaded
    assert sorted(loaded & {"pyiceberg", "duckdb", "pyarrow", "sqlalchemy"}) == []
