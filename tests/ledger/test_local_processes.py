"""The embedded store across processes: a writer process appends while this process tails.

Every entry must arrive exactly once, in order, with its bytes, never torn; a writer killed
mid-stream leaves an open ledger that the next writer closes at exactly what was written.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from offloadd.ledger.local import LocalLedgerSource, LocalLedgerWriter
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
