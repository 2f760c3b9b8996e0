"""Helpers shared by the ledger tests: a frame parser (entry by entry, the slow obvious way),
deterministic payloads, and a tailer that follows a topic through the LedgerSource protocol."""

from __future__ import annotations

import asyncio
import hashlib
import struct
from pathlib import Path

import crc32c

from offloadd.errors import NotFound
from offloadd.ledger.base import LedgerSource
from offloadd.model import FRAME_OVERHEAD, EntryRun, LedgerState, Position, TopicName

HEADER = struct.Struct(">iq")


def frames(run: EntryRun) -> list[bytes]:
    """The payloads of a run, checking every frame header, offset and CRC on the way."""
    data = bytes(run.data)
    assert run.offsets[0] == 0
    assert run.offsets[-1] == len(data)
    out = []
    for i in range(run.count):
        start, end = run.offsets[i], run.offsets[i + 1]
        length, entry_id = HEADER.unpack_from(data, start)
        assert entry_id == run.first_entry_id + i
        assert length == end - start - FRAME_OVERHEAD
        payload = data[start + FRAME_OVERHEAD:end]
        if run.crcs is not None:
            assert run.crcs[i] == crc32c.crc32c(payload)
        out.append(payload)
    return out


def payload(i: int) -> bytes:
    """Entry ``i`` of a deterministic stream: sizes 0..~2 KiB, content tied to ``i``."""
    size = (i * 7919) % 2053
    seed = hashlib.blake2b(i.to_bytes(8, "big"), digest_size=32).digest()
    return (seed * (size // 32 + 1))[:size]


async def tail(source: LedgerSource, topic: TopicName, count: int, *,
               max_bytes: int = 64 * 1024) -> list[tuple[Position, bytes]]:
    """Follow ``topic`` from its first ledger until ``count`` entries arrived."""
    got: list[tuple[Position, bytes]] = []
    ledger_id: int | None = None
    next_entry = 0
    while len(got) < count:
        try:
            descs = await source.ledgers(topic)
        except NotFound:
            await asyncio.sleep(0.02)
            continue
        if ledger_id is None:
            if not descs:
                await asyncio.sleep(0.02)
                continue
            ledger_id = descs[0].ledger_id
        desc = next(d for d in descs if d.ledger_id == ledger_id)
        if desc.last_entry_id >= next_entry:
            run = await source.read(topic, ledger_id, next_entry, desc.last_entry_id,
                                    max_bytes=max_bytes)
            assert run.ledger_id == ledger_id
            assert run.first_entry_id == next_entry
            assert 1 <= run.count <= desc.last_entry_id - next_entry + 1
            got.extend((Position(ledger_id, next_entry + i), p)
                       for i, p in enumerate(frames(run)))
            next_entry += run.count
            continue
        later = [d.ledger_id for d in descs if d.ledger_id > ledger_id]
        if desc.state is LedgerState.CLOSED and later:
            ledger_id, next_entry = min(later), 0
            continue
        await source.wait_for_entries(topic, ledger_id, next_entry - 1, 1.0)
    return got


def overwrite(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def append_bytes(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)
