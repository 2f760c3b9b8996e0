"""The bytes of a ``/managed-ledgers/<name>`` znode: plain protobuf or Pulsar's compressed envelope.

A broker with ``managedLedgerInfoCompressionType`` set (anything but ``NONE``) writes the
``ManagedLedgerInfo`` inside an envelope (Pulsar ``MetaStoreImpl.compressLedgerInfo``); one
without writes the bare protobuf. Brokers read both, whatever their own setting, so a writer may
always write the bare protobuf back. All integers are big-endian::

    offset   size  field
    0        2     magic 0x4778 (int16)
    2        4     metadata length M (int32)
    6        M     ManagedLedgerInfoMetadata protobuf (proto2, MLDataFormats.proto):
                     required CompressionType compressionType = 1;   (varint)
                     required int32 uncompressedSize = 2;            (varint)
    6 + M    rest  the ManagedLedgerInfo protobuf, compressed with compressionType

    enum CompressionType { NONE = 0; LZ4 = 1; ZLIB = 2; ZSTD = 3; SNAPPY = 4; }

The codecs are Pulsar's message codecs (the enum is
:class:`offloadd.format.compression.Compression`, here also ``CompressionType``): ZLIB is
``java.util.zip.Deflater`` with its zlib header,
flushed with ``SYNC_FLUSH`` and never finished, so the stream has no final block and no Adler-32
trailer and a decoder must accept an unterminated stream; LZ4 is one raw LZ4 block (no frame);
SNAPPY is raw Snappy; ZSTD is one zstd frame. Only NONE and ZLIB decode with the standard library;
the others raise :class:`~offloadd.errors.FormatError` naming the compression type.

The magic cannot be confused with a bare protobuf: a protobuf's first byte is a field tag, and
``0x47`` would be field 8 with wire type 7, which does not exist.

Pure: no I/O.
"""

from __future__ import annotations

import struct
import zlib

from offloadd.errors import FormatError
from offloadd.format.compression import Compression as CompressionType  # the same enum
from offloadd.format.varint import decode_varint

MAGIC = 0x4778
HEADER = struct.Struct(">HI")  # magic, metadata length

# ZooKeeper's default jute.maxbuffer is 1 MiB; a metadata record claiming far more than that
# uncompressed is junk, and refusing it bounds the memory a corrupt header can make us allocate.
MAX_UNCOMPRESSED = 256 * 1024 * 1024


def is_envelope(data: bytes) -> bool:
    return len(data) >= 2 and data[0] == MAGIC >> 8 and data[1] == MAGIC & 0xFF


def unwrap(data: bytes, where: str = "ManagedLedgerInfo") -> bytes:
    """The bare ``ManagedLedgerInfo`` protobuf bytes inside ``data`` (``data`` itself if bare)."""
    if not is_envelope(data):
        return data
    if len(data) < HEADER.size:
        raise FormatError(where, len(data), "compressed envelope shorter than its 6-byte header")
    _, meta_len = HEADER.unpack_from(data)
    meta_end = HEADER.size + meta_len
    if meta_end > len(data):
        raise FormatError(where, 2, f"envelope metadata length {meta_len} runs past the end of "
                                    f"the {len(data)}-byte value")
    compression, size = _parse_metadata(data, HEADER.size, meta_end, where)
    body = data[meta_end:]
    if compression is CompressionType.NONE:
        payload = body
    elif compression is CompressionType.ZLIB:
        payload = _inflate(body, size, meta_end, where)
    else:
        raise FormatError(
            where, HEADER.size,
            f"ManagedLedgerInfo is compressed with {compression.name}, which this build cannot "
            "decode (only NONE and ZLIB are supported); set the broker's "
            "managedLedgerInfoCompressionType to NONE or ZLIB")
    if len(payload) != size:
        raise FormatError(where, meta_end, f"envelope body is {len(payload)} bytes uncompressed, "
                                           f"metadata says {size}")
    return payload


def _parse_metadata(data: bytes, start: int, end: int, where: str) -> tuple[CompressionType, int]:
    """Read ``ManagedLedgerInfoMetadata`` by hand: two varint fields, unknown fields skipped."""
    fields: dict[int, int] = {}
    pos = start
    while pos < end:
        tag, pos = decode_varint(data, pos, end, where)
        number, wire_type = tag >> 3, tag & 7
        if wire_type == 0:
            value, pos = decode_varint(data, pos, end, where)
            fields[number] = value
        elif wire_type == 1:
            pos += 8
        elif wire_type == 2:
            length, pos = decode_varint(data, pos, end, where)
            pos += length
        elif wire_type == 5:
            pos += 4
        else:
            raise FormatError(where, pos, f"envelope metadata has wire type {wire_type}")
        if pos > end:
            raise FormatError(where, end, "envelope metadata field runs past its length")
    if 1 not in fields or 2 not in fields:
        raise FormatError(where, start, "envelope metadata lacks compressionType or "
                                        "uncompressedSize (both required)")
    try:
        compression = CompressionType(fields[1])
    except ValueError:
        raise FormatError(where, start, f"unknown compression type {fields[1]} in envelope "
                                        "metadata") from None
    size = fields[2]
    if size >= 1 << 63:  # a negative int32 is sign-extended to ten bytes on the wire
        size -= 1 << 64
    if not 0 <= size <= MAX_UNCOMPRESSED:
        raise FormatError(where, start, f"envelope uncompressedSize {size} is out of range")
    return compression, size


def _inflate(body: bytes, size: int, offset: int, where: str) -> bytes:
    inflater = zlib.decompressobj()
    try:
        # One byte more than promised so an overlong stream is caught rather than cut.
        out = inflater.decompress(body, size + 1)
    except zlib.error as exc:
        raise FormatError(where, offset, f"ZLIB body does not inflate ({exc})") from exc
    return out
