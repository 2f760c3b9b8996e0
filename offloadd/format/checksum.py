"""offloadd's per-block checksum, carried in bytes Pulsar leaves zero (pure, no I/O).

Pulsar's block header is 128 bytes; after its fields (magic, header length, block length, first
entry id, and the ledger id in streaming blocks: bytes 0..35) the rest is zeros that Pulsar's
readers skip without looking. offloadd writes, at bytes 36..43 of the header::

    [int32 mark 0x4F464443 ("OFDC")][uint32 CRC32C of the block's bytes 128..block_len)]

so every block can be checked on its own by a ranged read, while Pulsar still reads the object.

Whether a block must carry the mark is *not* decided by the mark: a damaged mark would otherwise
switch the check off for exactly the block whose bytes are suspect. The caller says so from
metadata it trusts (offloadd writes every block of its objects with the mark, and says so in the
objects' user metadata, see ``model/objects.py``): then a block without the mark is an error.
Only for objects nothing marks as ours (Pulsar's own, or the conformance vectors) is a block
without the mark accepted unchecked.

That trusted record is kept twice. In the objects' user metadata (``offloadd-block-checksum``,
``model/objects.py``), and in the index object's own bytes, where a copy cannot drop it apart from
the pair (``cp -r tier/*`` leaves the filesystem tier's hidden ``.meta`` sidecars behind; a tool
that copies objects without their metadata does the same on S3)::

    streaming index   the first section's LedgerInfo carries offloadContext.driverMetadata
                      {name: "offloadd", properties: [offloadd-block-checksum = crc32c]}
    ledger index      LedgerMetadataFormat.customMetadata offloadd-block-checksum = crc32c

Both are fields of the protobufs Pulsar already parses there (Pulsar reads ledgerId, entries and
size of the LedgerInfo, and copies the custom metadata), so Pulsar still reads the index.
Without either record (Pulsar's own objects; offloadd's older ones with their metadata lost) the
reader still refuses an object some of whose blocks carry the mark and one does not.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import replace

import crc32c

from offloadd.errors import FormatError
from offloadd.format.block import HEADER_LEN
from offloadd.format.layout import Part

CHECKSUM_MARK = 0x4F464443
CHECKSUM_OFFSET = 36
# The record, in an index's bytes, that every block of the pair carries the checksum
RECORD_KEY = "offloadd-block-checksum"
RECORD_VALUE = "crc32c"
RECORD_DRIVER = "offloadd"
_FIELD = struct.Struct(">II")

Buffer = bytes | bytearray | memoryview


def stamp_part(part: Part) -> Part:
    """The same part with the checksum written into its header (the payload is not copied)."""
    header = bytearray(part.buffers[0])
    if len(header) != HEADER_LEN:
        raise ValueError("a part's first buffer must be its 128-byte block header")
    crc = 0
    for b in part.buffers[1:]:
        crc = crc32c.crc32c(b, crc)
    _FIELD.pack_into(header, CHECKSUM_OFFSET, CHECKSUM_MARK, crc)
    return replace(part, buffers=(bytes(header), *part.buffers[1:]))


def stamp_parts(parts: Sequence[Part]) -> list[Part]:
    return [stamp_part(p) for p in parts]


def verify_block_checksum(buf: Buffer, block_offset: int, block_len: int, obj: str, *,
                          required: bool = False) -> bool:
    """Check a block's recorded CRC32C; FormatError on mismatch.

    ``required``: the object's trusted metadata says every block carries a checksum, so a block
    without the mark is damaged (FormatError). Otherwise such a block is accepted unchecked and
    the result is False.
    """
    mark, want = _FIELD.unpack_from(buf, block_offset + CHECKSUM_OFFSET)
    if mark != CHECKSUM_MARK:
        if required:
            raise FormatError(obj, block_offset + CHECKSUM_OFFSET,
                              f"block checksum mark damaged: header bytes 36..39 are "
                              f"{mark:08x}, not {CHECKSUM_MARK:08x}, and every block of this "
                              "object carries one (its metadata says so); the block cannot be "
                              "checked, so it is not trusted")
        return False
    body = memoryview(buf)[block_offset + HEADER_LEN:block_offset + block_len]
    got = crc32c.crc32c(body)
    if got != want:
        raise FormatError(obj, block_offset, f"block checksum mismatch: CRC32C {got:08x}, "
                          f"recorded {want:08x} (the stored bytes are corrupt)")
    return True
