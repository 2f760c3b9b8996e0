"""The embedded store across processes: a writer process appends while this process tails.

Every entry must arrive exactly once, in order, with its bytes, never torn; a writer killed
mid-stream leaves an open ledger that the next writer closes at exactly what was written.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import cast

import pytest

from offloadd.ledger.local import LocalLedgerSource, LocalLedgerWriter
from offloadd.metadata.base import Versioned
from offloadd.metadata.embedded import EmbeddedMetadataStore
from offloadd.model import LedgerState, Position, TopicName
from tests.ledger.support import frames, payload, tail

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

TOPIC = TopicName.parse("persistent://public/default/cross")
ROOT = Path(__file__).resolve().parents[2]


def start_writer(tmp_path: Path, count: int, max_entries: int,
                 mode: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.ledger.writer_process", str(tmp_path / "ledgers"),
         str(tmp_path / "metadata"), str(TOPIC), str(count), str(max_entries), mode],
        cwd=ROOT, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)


async def finish(proc: subprocess.Popen[bytes]) -> tuple[int, bytes]:
    try:
        _, err = await asyncio.to_thread(proc.communicate, timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            await asyncio.to_thread(proc.wait, 10)
    return proc.returncode, err


@pytest.mark.parametrize("max_bytes", [4096, 1 << 20])
async def test_tail_sees_every_entry_of_a_writer_process_once_in_order(
        tmp_path: Path, max_bytes: int) -> None:
    count = 6000
    metadata = await EmbeddedMetadataStore.open(tmp_path / "metadata")
    source = LocalLedgerSource(tmp_path / "ledgers", metadata)
    proc = start_writer(tmp_path, count, 700, "close")
    try:
        async with asyncio.timeout(60):
            got = await tail(source, TOPIC, count, max_bytes=max_bytes)
    finally:
        code, err = await finish(proc)
    assert code == 0, err.decode()
    assert [p for _, p in got] == [payload(i) for i in range(count)]
    positions = [pos for pos, _ in got]
    assert positions == sorted(set(positions))
    descs = await source.ledgers(TOPIC)
    assert all(d.state is LedgerState.CLOSED for d in descs)
    assert [d.entries for d in descs] == [700] * 8 + [400]
    await metadata.close()


async def test_killed_writer_leaves_an_open_ledger_the_next_writer_closes(
        tmp_path: Path) -> None:
    count = 1500
    metadata = await EmbeddedMetadataStore.open(tmp_path / "metadata")
    source = LocalLedgerSource(tmp_path / "ledgers", metadata, verify_crc=True)
    proc = start_writer(tmp_path, count, 1000, "kill")
    try:
        async with asyncio.timeout(60):
            got = await tail(source, TOPIC, count)
    finally:
        code, err = await finish(proc)
    assert code == -9, err.decode()
    _, second = await source.ledgers(TOPIC)
    assert (second.state, second.entries) == (LedgerState.OPEN, 500)

    writer = LocalLedgerWriter(tmp_path / "ledgers", metadata)
    pos = await writer.append(TOPIC, [b"after the crash"])
    closed = (await source.ledgers(TOPIC))[1]
    assert (closed.state, closed.entries) == (LedgerState.CLOSED, 500)
    assert closed.size == sum(len(payload(i)) for i in range(1000, 1500))
    run = await source.read(TOPIC, closed.ledger_id, 0, 499)
    assert frames(run) == [p for _, p in got[1000:]]
    assert pos == Position(pos.ledger_id, 0)
    assert pos.ledger_id > closed.ledger_id
    await writer.close()
    await metadata.close()


class CountingStore(EmbeddedMetadataStore):
    """Counts the reads a tailer makes while it waits."""

    gets = 0

    async def get(self, path: str) -> Versioned:
        self.gets += 1
        return await super().get(path)


async def test_an_idle_tailer_is_woken_by_the_writer_process_without_polling(
        tmp_path: Path) -> None:
    """Waiting at the end of a topic written by another process reads nothing per topic (the
    old 20 ms poll made ~50 metadata reads a second); the writer's next append wakes it."""
    code, err = await finish(start_writer(tmp_path, 5, 1000, "close"))
    assert code == 0, err.decode()
    metadata = cast(CountingStore, await CountingStore.open(tmp_path / "metadata"))
    source = LocalLedgerSource(tmp_path / "ledgers", metadata)
    try:
        (desc,) = await source.ledgers(TOPIC)
        assert desc.state is LedgerState.CLOSED and desc.last_entry_id == 4
        before = metadata.gets
        waiting = asyncio.ensure_future(source.wait_for_entries(TOPIC, desc.ledger_id, 4, 60.0))
        await asyncio.sleep(1.0)
        assert not waiting.done()
        assert metadata.gets - before <= 1  # the one look before waiting
        proc = start_writer(tmp_path, 3, 1000, "close")
        try:
            async with asyncio.timeout(30):  # well before the wait's own 60 s
                await waiting
        finally:
            code, err = await finish(proc)
        assert code == 0, err.decode()
        ledgers = await source.ledgers(TOPIC)
        assert [d.entries for d in ledgers] == [5, 3]
    finally:
        waiting.cancel()
        await source.close()
        await metadata.close()
