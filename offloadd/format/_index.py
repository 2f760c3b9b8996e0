"""Pieces both index formats share: the block table and lookups over it.

A block table is ``count × (int64 firstEntryId, int32 partId, int64 offset)``, big-endian,
20 bytes a row; ``offset`` is where the block's header starts in the data object and part ids
start at 1.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from offloadd.errors import FormatError
from offloadd.format.block import HEADER_LEN

Buffer = bytes | bytearray | memoryview

ROW = struct.Struct(">qiq")


@dataclass(frozen=True)
class IndexEntry:
    """One block as an index lists it: its first entry, its part number, its header offset."""

    first_entry_id: int
    part_id: int
    offset: int


def pack_rows(blocks: Sequence[IndexEntry]) -> bytes:
    pack = ROW.pack
    return b"".join([pack(b.first_entry_id, b.part_id, b.offset) for b in blocks])


def unpack_rows(
    buf: Buffer, pos: int, count: int, data_object_length: int, obj: str
) -> tuple[IndexEntry, ...]:
    """Read and validate ``count`` rows at ``buf[pos:]`` (the caller checked they fit)."""
    rows: list[IndexEntry] = []
    prev_entry = prev_offset = -1
    for i, (first_entry_id, part_id, offset) in enumerate(
        ROW.iter_unpack(buf[pos : pos + count * ROW.size])
    ):
        at = pos + i * ROW.size
        if first_entry_id <= prev_entry or first_entry_id < 0:
            raise FormatError(
                obj, at, f"block first entry id {first_entry_id} is not above the previous "
                f"block's {prev_entry} (blocks must be sorted by entry)"
            )
        if part_id < 1:
            raise FormatError(obj, at + 8, f"part id {part_id} (part ids start at 1)")
        if not 0 <= offset < data_object_length:
            raise FormatError(
                obj, at + 12, f"block offset {offset} is outside the data object "
                f"(length {data_object_length})"
            )
        if offset <= prev_offset:
            raise FormatError(
                obj, at + 12, f"block offset {offset} is not above the previous block's "
                f"{prev_offset}"
            )
        rows.append(IndexEntry(first_entry_id, part_id, offset))
        prev_entry, prev_offset = first_entry_id, offset
    return tuple(rows)


def check_lengths(
    obj: str, actual: int, total: int, header_size: int, data_length: int, header_length: int
) -> None:
    """Validate an index header's lengths: ``total`` must equal the bytes present exactly."""
    if total < header_size:
        raise FormatError(obj, 4, f"index length {total} is shorter than its header")
    if total > actual:
        raise FormatError(obj, 4, f"truncated index: header says {total} bytes, {actual} present")
    if total < actual:
        raise FormatError(
            obj, total, f"{actual - total} trailing bytes after the {total}-byte index"
        )
    if data_length < 0:
        raise FormatError(obj, 8, f"negative data object length {data_length}")
    if header_length != HEADER_LEN:
        raise FormatError(
            obj, 16, f"data block header length {header_length}, expected {HEADER_LEN}"
        )


def locate(blocks: Sequence[IndexEntry], firsts: Sequence[int], entry_id: int) -> IndexEntry:
    """The block holding ``entry_id``, assuming the caller checked it is in range."""
    return blocks[bisect_right(firsts, entry_id) - 1]


def block_end(offsets: Sequence[int], data_object_length: int, offset: int) -> int:
    """Where the block starting at ``offset`` ends: the next block's offset or the data end."""
    i = bisect_right(offsets, offset)
    return offsets[i] if i < len(offsets) else data_object_length
