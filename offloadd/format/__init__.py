"""Pulsar's tiered-storage byte formats, pure (no I/O): blocks, both data objects, both indexes.

=========================  ==========  =============================================
object                     magic       module
=========================  ==========  =============================================
streaming block (PIP-76)   0x26A66D32  ``block.py`` (layout), ``streaming.py`` (writer)
ledger block (PIP-17)      0xFBDBABCB  ``block.py`` (layout), ``ledger.py`` (writer)
streaming index            0x3D1FB0BC  ``streaming.py``
ledger-based index         0xDE47DE47  ``ledger.py``
Pulsar message (an entry)  0x0E01      ``message.py`` (+ ``compression.py`` codecs)
=========================  ==========  =============================================

Each module's docstring is the written spec of its layout; ``layout.py`` holds the block-cutting
rules. Indexes are read through one entry point, :func:`decode_index`, which dispatches on the
magic.
"""

from __future__ import annotations

import struct

from offloadd.errors import FormatError
from offloadd.format._index import IndexEntry
from offloadd.format.block import (
    HEADER_LEN,
    LEDGER_BLOCK_MAGIC,
    MIN_PADDING,
    PADDING_PATTERN,
    STREAMING_BLOCK_MAGIC,
    BlockHeader,
    frame_entries,
    iter_block_entries,
    pack_ledger_header,
    pack_streaming_header,
    padding,
    parse_block_header,
)
from offloadd.format.layout import Block, BlockPlan, plan_blocks
from offloadd.format.ledger import (
    LEDGER_INDEX_MAGIC,
    LedgerIndex,
    LedgerObject,
    LedgerObjectBuilder,
    build_ledger_metadata,
    build_ledger_object,
    decode_ledger_index,
    encode_ledger_index,
)
from offloadd.format.streaming import (
    STREAMING_INDEX_MAGIC,
    LedgerSection,
    SectionInput,
    StreamingIndex,
    StreamingObject,
    StreamingObjectBuilder,
    build_streaming_object,
    decode_streaming_index,
    encode_streaming_index,
)
from offloadd.model.frames import FRAME_OVERHEAD

__all__ = [
    "FRAME_OVERHEAD",
    "HEADER_LEN",
    "LEDGER_BLOCK_MAGIC",
    "LEDGER_INDEX_MAGIC",
    "MIN_PADDING",
    "PADDING_PATTERN",
    "STREAMING_BLOCK_MAGIC",
    "STREAMING_INDEX_MAGIC",
    "Block",
    "BlockHeader",
    "BlockPlan",
    "IndexEntry",
    "LedgerIndex",
    "LedgerObject",
    "LedgerObjectBuilder",
    "LedgerSection",
    "SectionInput",
    "StreamingIndex",
    "StreamingObject",
    "StreamingObjectBuilder",
    "build_ledger_metadata",
    "build_ledger_object",
    "build_streaming_object",
    "decode_index",
    "decode_ledger_index",
    "decode_streaming_index",
    "encode_ledger_index",
    "encode_streaming_index",
    "frame_entries",
    "iter_block_entries",
    "pack_ledger_header",
    "pack_streaming_header",
    "padding",
    "parse_block_header",
    "plan_blocks",
]

_MAGIC = struct.Struct(">I")


def decode_index(
    buf: bytes | bytearray | memoryview, obj: str
) -> StreamingIndex | LedgerIndex:
    """Decode either index kind, chosen by its 4-byte magic."""
    if len(buf) < _MAGIC.size:
        raise FormatError(obj, 0, f"truncated index: {len(buf)} bytes, no magic")
    (magic,) = _MAGIC.unpack_from(buf, 0)
    if magic == STREAMING_INDEX_MAGIC:
        return decode_streaming_index(buf, obj)
    if magic == LEDGER_INDEX_MAGIC:
        return decode_ledger_index(buf, obj)
    raise FormatError(
        obj, 0, f"unknown index magic 0x{magic:08X} (streaming is 0x{STREAMING_INDEX_MAGIC:08X}, "
        f"ledger-based 0x{LEDGER_INDEX_MAGIC:08X})"
    )
