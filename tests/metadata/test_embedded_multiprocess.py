"""The embedded store across real processes: CAS holds, and a killed owner's ephemerals go."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from offloadd.metadata.base import Versioned
from offloadd.metadata.embedded import EmbeddedMetadataStore

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

REPO = Path(__file__).resolve().parents[2]

# Run in a child: prints "ready", waits for a line on stdin, then increments /counter N times
# with a compare-and-set loop and prints how many CAS attempts lost.
INCREMENTER = """
import asyncio, sys
from offloadd.errors import Conflict
from offloadd.metadata.embedded import EmbeddedMetadataStore

async def main(path, times):
    store = await EmbeddedMetadataStore.open(path)
    print("ready", flush=True)
    sys.stdin.readline()
    lost = 0
    for _ in range(times):
        while True:
            current = await store.get("/counter")
            try:
                await store.set("/counter", str(int(current.data) + 1).encode(), current.version)
                break
            except Conflict:
                lost += 1
    await store.close()
    print("lost", lost, flush=True)

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""

# Run in a child: creates an ephemeral /owner, prints "created" and waits to be killed.
EPHEMERAL_OWNER = """
import asyncio, sys
from offloadd.metadata.embedded import EmbeddedMetadataStore

async def main(path):
    store = await EmbeddedMetadataStore.open(path)
    await store.create("/owner", b"child", ephemeral=True)
    print("created", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main(sys.argv[1]))
"""


async def spawn(script: str, *args: str) -> asyncio.subprocess.Process:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, *args, env=env, cwd=REPO,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)


async def expect_line(proc: asyncio.subprocess.Process, prefix: bytes) -> bytes:
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 20)
    assert line.startswith(prefix), f"child said {line!r}, expected {prefix!r}"
    return line


class TestAcrossProcesses:
    """Two processes on one database behave like two ZooKeeper clients."""

    async def test_concurrent_cas_increments_lose_no_update(self, tmp_path: Path) -> None:
        times = 200
        store = await EmbeddedMetadataStore.open(tmp_path)
        await store.create("/counter", b"0")
        children = [await spawn(INCREMENTER, str(tmp_path), str(times)) for _ in range(2)]
        try:
            for child in children:
                await expect_line(child, b"ready")
            for child in children:  # release both at once so their loops overlap
                assert child.stdin is not None
                child.stdin.write(b"go\n")
                await child.stdin.drain()
            for child in children:
                await expect_line(child, b"lost")
                assert await asyncio.wait_for(child.wait(), 20) == 0
            assert await store.get("/counter") == Versioned(str(2 * times).encode(), 2 * times)
        finally:
            for child in children:
                if child.returncode is None:
                    child.kill()
                    await child.wait()
            await store.close()

    async def test_ephemeral_of_a_killed_process_disappears(self, tmp_path: Path) -> None:
        child = await spawn(EPHEMERAL_OWNER, str(tmp_path))
        try:
            await expect_line(child, b"created")
            observer = await EmbeddedMetadataStore.open(tmp_path)
            # A live owner keeps its node, whoever else opens the database.
            assert await observer.get("/owner") == Versioned(b"child", 0)
            await observer.close()
            child.send_signal(signal.SIGKILL)
            await asyncio.wait_for(child.wait(), 20)
        finally:
            if child.returncode is None:
                child.kill()
                await child.wait()
        newcomer = await EmbeddedMetadataStore.open(tmp_path)
        try:
            assert not await newcomer.exists("/owner")
            assert await newcomer.children("/") == []
        finally:
            await newcomer.close()
