"""Protobuf's base-128 varints, for the few places that read or write protobuf bytes by hand
(Pulsar's metadata envelope, entry metadata the embedded writer lays out itself).

Little-endian groups of 7 bits, the top bit of each byte set while more bytes follow. A negative
integer is written as its 64-bit two's complement (ten bytes), as protobuf writes int32/int64.
Pure: no I/O.
"""

from __future__ import annotations

from offloadd.errors import FormatError

__all__ = ["decode_varint", "encode_varint"]

_MAX_BYTES = 10  # 64 bits in 7-bit groups


def encode_varint(value: int) -> bytes:
    """The varint of ``value`` (``-2**63 <= value < 2**64``)."""
    if 0 <= value < 0x80:
        return bytes((value,))
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def decode_varint(data: bytes | memoryview, pos: int, end: int, where: str) -> tuple[int, int]:
    """The unsigned varint starting at ``data[pos]`` and the position after it; ``FormatError``
    naming ``where`` when it runs past ``end`` or past ten bytes."""
    value = shift = 0
    stop = min(end, pos + _MAX_BYTES)
    while pos < stop:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise FormatError(where, pos, "truncated or overlong varint")
