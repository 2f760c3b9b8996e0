"""Helpers for the format tests: build runs, and walk a data object through its index while
checking every writer rule of format/layout.py (the checks a Pulsar reader silently relies on)."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import settings

from offloadd.format import (
    HEADER_LEN,
    LEDGER_BLOCK_MAGIC,
    MIN_PADDING,
    STREAMING_BLOCK_MAGIC,
    IndexEntry,
    LedgerIndex,
    StreamingIndex,
    frame_entries,
    iter_block_entries,
    padding,
    parse_block_header,
)
from offloadd.model import EntryRun

# The machine is shared: wall-clock deadlines would make property tests flaky.
RELAXED = settings(deadline=None)

Entry = tuple[int, int, bytes]  # ledger id, entry id, payload


def make_run(ledger_id: int, first_entry_id: int, payloads: Sequence[bytes]) -> EntryRun:
    data, offsets = frame_entries(first_entry_id, payloads)
    return EntryRun(ledger_id, first_entry_id, memoryview(data), offsets)


def _walk(
    data: bytes, obj: str, blocks: Sequence[tuple[int | None, IndexEntry]], magic: int,
    exact_last: bool,
) -> list[Entry]:
    """Read every block listed, asserting the block-level writer rules; return the entries."""
    out: list[Entry] = []
    expected_offset = 0
    ordered = sorted(blocks, key=lambda b: b[1].offset)
    for n, (ledger_id, entry) in enumerate(ordered, start=1):
        assert entry.part_id == n, "part ids count blocks from 1 in object order"
        assert entry.offset == expected_offset, "blocks are contiguous and offsets hit headers"
        header = parse_block_header(data, entry.offset, obj, magic=magic)
        assert header.first_entry_id == entry.first_entry_id
        if magic == STREAMING_BLOCK_MAGIC:
            assert header.ledger_id == ledger_id
        pos = entry.offset + HEADER_LEN
        count = 0
        for entry_id, payload in iter_block_entries(data, entry.offset, obj):
            out.append((ledger_id if ledger_id is not None else -1, entry_id, bytes(payload)))
            pos += 12 + len(payload)
            count += 1
        assert count >= 1, "no block without entries"
        end = entry.offset + header.block_len
        pad = end - pos
        if exact_last and n == len(ordered):
            assert pad == 0, "the ledger-based last block is sized exactly"
        else:
            assert pad >= MIN_PADDING, f"block {n} ends with only {pad} padding bytes"
        assert data[pos:end] == padding(pad), "padding is the FE DC DE AD pattern"
        expected_offset = end
    assert expected_offset == len(data), "blocks cover the whole data object"
    return out


def read_streaming(data: bytes, index: StreamingIndex, obj: str = "obj") -> list[Entry]:
    assert index.data_object_length == len(data)
    blocks = [(s.ledger_id, b) for s in index.sections for b in s.blocks]
    entries = _walk(data, obj, blocks, STREAMING_BLOCK_MAGIC, exact_last=False)
    for s in index.sections:
        held = [e for e in entries if e[0] == s.ledger_id]
        assert held, f"section of ledger {s.ledger_id} without entries"
        assert s.entries == held[-1][1] + 1, "entries = last entry id held + 1"
        assert s.size == sum(len(e[2]) for e in held)
        for b in s.blocks:
            block_len = parse_block_header(data, b.offset, obj).block_len
            assert index.block_end(b) == b.offset + block_len
    return entries


def read_ledger(data: bytes, index: LedgerIndex, ledger_id: int, obj: str = "obj") -> list[Entry]:
    assert index.data_object_length == len(data)
    blocks: list[tuple[int | None, IndexEntry]] = [(None, b) for b in index.blocks]
    entries = _walk(data, obj, blocks, LEDGER_BLOCK_MAGIC, exact_last=True)
    assert index.last_entry_id == entries[-1][1]
    for b in index.blocks:
        assert index.block_end(b) == b.offset + parse_block_header(data, b.offset, obj).block_len
    return [(ledger_id, e, p) for _, e, p in entries]
