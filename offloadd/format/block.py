"""Data blocks: the unit both Pulsar data-object formats are made of.

A data object is a sequence of blocks laid end to end. Every block is::

    +--------------------+----------------------------------+---------------------+
    | header (128 bytes) | framed entries (the payload)     | padding             |
    +--------------------+----------------------------------+---------------------+
    0                    128                                              block_len

Header, all integers big-endian::

    offset size field
    0      4    magic: 0x26A66D32 streaming (PIP-76) / 0xFBDBABCB ledger-based (PIP-17)
    4      8    header length, always 128
    12     8    block length, header included
    20     8    id of the first entry in the block
    28     8    streaming only: ledger id of every entry in the block (zero-filled otherwise)
    36     92   zeros (ledger-based blocks: zeros from offset 28)

Payload: consecutive entries of one ledger, each framed ``[int32 length][int64 entryId][bytes]``.
Padding: ``FE DC DE AD`` repeated and cut to fit, starting right after the last entry.

A reader stops a block at the first negative length: padding starts with 0xFE, so the int32
where the next frame would start reads negative. That is why writers end every block with at
least :data:`MIN_PADDING` padding bytes (the one exception, the ledger-based format's exact-size
last block, is the end of the object). The next block's magic is no such guard: the ledger-based
one (0xFBDBABCB) reads negative, but the streaming one (0x26A66D32) is positive, so a streaming
block without padding would have its reader take the next header for a frame.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate

from offloadd.errors import FormatError
from offloadd.model.frames import FRAME as _FRAME
from offloadd.model.frames import FRAME_OVERHEAD

Buffer = bytes | bytearray | memoryview

HEADER_LEN = 128
STREAMING_BLOCK_MAGIC = 0x26A66D32
LEDGER_BLOCK_MAGIC = 0xFBDBABCB
PADDING_PATTERN = b"\xFE\xDC\xDE\xAD"
MIN_PADDING = 4

_STREAMING_HEADER = struct.Struct(">Iqqqq92x")
_LEDGER_HEADER = struct.Struct(">Iqqq100x")
# The fields common to both headers; the streaming ledger id is read separately.
_HEADER_PREFIX = struct.Struct(">Iqqq")
_LEDGER_ID = struct.Struct(">q")

assert _STREAMING_HEADER.size == _LEDGER_HEADER.size == HEADER_LEN

_KNOWN_MAGICS = frozenset((STREAMING_BLOCK_MAGIC, LEDGER_BLOCK_MAGIC))

# Grow-only cache of the padding pattern; a request is served by slicing it, so padding a block
# costs one slice, and the cache never exceeds the largest padding asked for (at most a block).
_padding_cache = PADDING_PATTERN * (1 << 16)


def pack_streaming_header(block_len: int, first_entry_id: int, ledger_id: int) -> bytes:
    """The 128-byte header of a streaming (PIP-76) block."""
    return _STREAMING_HEADER.pack(
        STREAMING_BLOCK_MAGIC, HEADER_LEN, block_len, first_entry_id, ledger_id
    )


def pack_ledger_header(block_len: int, first_entry_id: int) -> bytes:
    """The 128-byte header of a ledger-based (PIP-17) block."""
    return _LEDGER_HEADER.pack(LEDGER_BLOCK_MAGIC, HEADER_LEN, block_len, first_entry_id)


def padding(n: int) -> memoryview:
    """``n`` bytes of the padding pattern, starting at its first byte (a read-only view)."""
    global _padding_cache
    if n < 0:
        raise ValueError(f"padding length must be >= 0, got {n}")
    if n > len(_padding_cache):
        _padding_cache = PADDING_PATTERN * (-(-n // len(PADDING_PATTERN)))
    return memoryview(_padding_cache)[:n]


@dataclass(frozen=True)
class BlockHeader:
    """A parsed block header; ``ledger_id`` is None for ledger-based blocks."""

    magic: int
    block_len: int
    first_entry_id: int
    ledger_id: int | None


def parse_block_header(
    buf: Buffer, offset: int, obj: str, *, magic: int | None = None, whole: bool = True
) -> BlockHeader:
    """Parse the block header at ``buf[offset:]``; the whole block must lie inside ``buf``.

    ``magic`` restricts the accepted block kind; by default either kind is accepted.
    ``whole=False`` parses a header fetched without its block (a check that reads only the
    head of a block): then only the 128 header bytes must lie inside ``buf``.
    Raises :class:`FormatError` naming ``obj`` and the offending byte offset.
    """
    if offset < 0 or offset + HEADER_LEN > len(buf):
        raise FormatError(
            obj, offset, f"truncated block header: need {HEADER_LEN} bytes, "
            f"{max(0, len(buf) - offset)} available"
        )
    found, header_len, block_len, first_entry_id = _HEADER_PREFIX.unpack_from(buf, offset)
    if found not in _KNOWN_MAGICS or (magic is not None and found != magic):
        wanted = f"0x{magic:08X}" if magic is not None else "a block magic"
        raise FormatError(obj, offset, f"bad block magic 0x{found:08X}, expected {wanted}")
    if header_len != HEADER_LEN:
        raise FormatError(
            obj, offset + 4, f"block header length {header_len}, expected {HEADER_LEN}"
        )
    if block_len < HEADER_LEN:
        raise FormatError(
            obj, offset + 12,
            f"block length {block_len} is shorter than its {HEADER_LEN}-byte header",
        )
    if whole and offset + block_len > len(buf):
        raise FormatError(
            obj, offset + 12, f"truncated block: length {block_len} runs past the end of the "
            f"data at byte {len(buf)}"
        )
    ledger_id: int | None = None
    if found == STREAMING_BLOCK_MAGIC:
        (ledger_id,) = _LEDGER_ID.unpack_from(buf, offset + 28)
    return BlockHeader(found, block_len, first_entry_id, ledger_id)


def frame_entries(first_entry_id: int, payloads: Sequence[bytes]) -> tuple[bytes, list[int]]:
    """Frame ``payloads`` as blocks frame entries; returns the bytes and the n + 1 frame starts.

    For sources that do not store framed entries (and for tests); this is per-entry work.
    """
    pack = _FRAME.pack
    pieces: list[bytes] = []
    for i, payload in enumerate(payloads):
        pieces.append(pack(len(payload), first_entry_id + i))
        pieces.append(payload)
    offsets = list(accumulate((FRAME_OVERHEAD + len(p) for p in payloads), initial=0))
    return b"".join(pieces), offsets


def iter_block_entries(
    buf: Buffer, block_offset: int, obj: str
) -> Iterator[tuple[int, memoryview]]:
    """Yield ``(entry_id, payload)`` for every entry of the block at ``buf[block_offset:]``.

    Stops at the first negative length or when fewer than 4 bytes are left in the block.
    Raises :class:`FormatError` for an entry running past the block end, entry ids that are not
    consecutive from the header's first entry id, or a block holding no entry at all.
    """
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    header = parse_block_header(view, block_offset, obj)
    end = block_offset + header.block_len
    pos = block_offset + HEADER_LEN
    expected = header.first_entry_id
    unpack_frame = _FRAME.unpack_from
    while end - pos >= 4:
        if end - pos < FRAME_OVERHEAD:
            # 4..11 bytes left: only padding can sit here, so the length must read negative.
            (length,) = struct.unpack_from(">i", view, pos)
            if length < 0:
                break
            raise FormatError(obj, pos, f"entry frame header runs past the block end at byte {end}")
        length, entry_id = unpack_frame(view, pos)
        if length < 0:
            break
        if entry_id != expected:
            raise FormatError(
                obj, pos + 4, f"entry id {entry_id} where {expected} was expected "
                "(entries in a block must be consecutive)"
            )
        start = pos + FRAME_OVERHEAD
        if start + length > end:
            raise FormatError(
                obj, pos,
                f"entry {entry_id} of length {length} runs past the block end at byte {end}",
            )
        yield entry_id, view[start : start + length]
        pos = start + length
        expected += 1
    if expected == header.first_entry_id:
        raise FormatError(obj, block_offset, "block holds no entries")
