"""Pulsar's payload codecs, as Pulsar's producers write them (pure, no I/O).

==========  ==  ==========================================================================
codec       id  bytes
==========  ==  ==========================================================================
NONE        0   the payload itself
LZ4         1   one raw LZ4 *block*: no frame, no size prefix (the size is the metadata's
                ``uncompressed_size``)
ZLIB        2   a zlib stream (RFC 1950: deflate with the 2-byte header and Adler-32 trailer,
                as ``java.util.zip.Deflater`` writes by default)
ZSTD        3   one standard zstd frame
SNAPPY      4   one raw snappy block (not the framing format): a varint of the uncompressed
                length, then the compressed elements
==========  ==  ==========================================================================

Decompression is bounded: the output must be exactly ``uncompressed_size`` bytes and never more
than the caller's ``limit`` (a corrupt or hostile size must not exhaust memory). Every failure is
a :class:`CodecError` saying what is wrong; the message decoder turns it into a
:class:`~offloadd.errors.FormatError` naming the topic and position.

Libraries: ``lz4`` (its block decoder reports the exact output size; cramjam's pads the output to
the size it is given), ``zstandard`` (the frame's declared content size is checked against the
limit before anything is allocated), ``cramjam`` for raw snappy, the standard library for zlib.
Each is imported at its first use: a daemon whose entries are never decompressed (the embedded
default) does not load them (issue 22, "import heavy libraries only where used").

Thread safety: every function here may be called from several threads at once (the lakehouse
decodes in worker threads, two projectors side by side). A ``zstandard`` compressor or
decompressor object is *not* safe to share between threads: two calls at once on one object
mix their streams, and the output is either an error ("Destination buffer is too small") or,
worse, the right number of bytes with another frame's tail in them. So each thread gets its
own pair (:func:`_zstd_codecs`).
"""

from __future__ import annotations

import enum
import functools
import threading
import zlib
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import zstandard

__all__ = ["DEFAULT_LIMIT", "CodecError", "Compression", "compress", "decompress"]

Buffer = bytes | bytearray | memoryview

#: Largest uncompressed payload accepted by default: Pulsar's broker refuses messages above
#: ``maxMessageSize`` (5 MiB by default); this leaves room for brokers configured higher.
DEFAULT_LIMIT = 128 * 1024 * 1024


class Compression(enum.IntEnum):
    """``CompressionType`` of PulsarApi.proto."""

    NONE = 0
    LZ4 = 1
    ZLIB = 2
    ZSTD = 3
    SNAPPY = 4

    @classmethod
    def parse(cls, text: str) -> Compression:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise ValueError(f"unknown compression {text!r}: use one of "
                             f"{', '.join(c.name.lower() for c in cls)}") from None


class CodecError(ValueError):
    """Compressed bytes that do not decompress to what the metadata promises."""


def compress(codec: Compression, data: Buffer) -> bytes:
    """``data`` compressed the way a Pulsar producer using ``codec`` does."""
    if codec is Compression.NONE:
        return bytes(data)
    if codec is Compression.LZ4:
        packed: bytes = _lz4().compress(data, store_size=False)
        return packed
    if codec is Compression.ZLIB:
        return zlib.compress(data)
    if codec is Compression.ZSTD:
        return _zstd_codecs()[0].compress(data)
    if codec is Compression.SNAPPY:
        return bytes(_cramjam().snappy.compress_raw(data))
    raise CodecError(f"unknown compression {codec!r}")


def decompress(codec: int, data: Buffer, uncompressed_size: int,
               limit: int = DEFAULT_LIMIT) -> bytes:
    """Exactly ``uncompressed_size`` bytes, or :class:`CodecError`."""
    if uncompressed_size < 0 or uncompressed_size > limit:
        raise CodecError(f"uncompressed_size {uncompressed_size} is beyond the limit of "
                         f"{limit} bytes")
    if codec == Compression.NONE:
        out = bytes(data)
    elif codec == Compression.LZ4:
        lz4 = _lz4()
        out = _guard(lambda: lz4.decompress(data, uncompressed_size=uncompressed_size), "LZ4")
    elif codec == Compression.ZLIB:
        out = _zlib(data, uncompressed_size)
    elif codec == Compression.ZSTD:
        out = _zstd(data, uncompressed_size)
    elif codec == Compression.SNAPPY:
        stated = _snappy_length(data)
        if stated != uncompressed_size:
            raise CodecError(f"SNAPPY block says {stated} bytes, the metadata "
                             f"{uncompressed_size}")
        snappy = _cramjam().snappy
        out = _guard(lambda: bytes(snappy.decompress_raw(data)), "SNAPPY")
    else:
        raise CodecError(f"unknown compression type {codec} (Pulsar knows 0..4: "
                         "NONE, LZ4, ZLIB, ZSTD, SNAPPY)")
    if len(out) != uncompressed_size:
        raise CodecError(f"{Compression(codec).name} payload decompressed to {len(out)} bytes, "
                         f"the metadata says {uncompressed_size}")
    return out


def _guard(fn: Callable[[], bytes], name: str) -> bytes:
    try:
        out = fn()
    except Exception as exc:  # cramjam raises its own DecompressionError (and ValueErrors)
        raise CodecError(f"{name} payload does not decompress: {exc}") from None
    return out


@functools.cache
def _lz4() -> ModuleType:
    import lz4.block

    block: ModuleType = lz4.block
    return block


@functools.cache
def _cramjam() -> ModuleType:
    import cramjam

    return cramjam


class _PerThread(threading.local):
    zstd: tuple[zstandard.ZstdCompressor, zstandard.ZstdDecompressor] | None = None


_per_thread = _PerThread()


def _zstd_codecs() -> tuple[zstandard.ZstdCompressor, zstandard.ZstdDecompressor]:
    """This thread's zstd compressor and decompressor (created at its first use: they keep a
    context, reused call after call, that must never be used by two threads at once)."""
    codecs = _per_thread.zstd
    if codecs is None:
        import zstandard

        codecs = _per_thread.zstd = (zstandard.ZstdCompressor(), zstandard.ZstdDecompressor())
    return codecs


def _zstd(data: Buffer, size: int) -> bytes:
    import zstandard

    _, decompressor = _zstd_codecs()
    try:
        declared = zstandard.frame_content_size(data)
    except zstandard.ZstdError as exc:
        raise CodecError(f"ZSTD payload is not a zstd frame: {exc}") from None
    if declared > size:  # -1: not declared, then max_output_size bounds the output
        raise CodecError(f"ZSTD frame declares {declared} bytes, the metadata {size}")
    return _guard(lambda: decompressor.decompress(data, max_output_size=size), "ZSTD")


def _zlib(data: Buffer, size: int) -> bytes:
    d = zlib.decompressobj()
    try:
        out = d.decompress(data, size + 1)  # one byte more than allowed shows a lie
    except zlib.error as exc:
        raise CodecError(f"ZLIB payload does not decompress: {exc}") from None
    if len(out) > size:
        raise CodecError(f"ZLIB payload decompresses to more than the metadata's {size} bytes")
    if not d.eof:
        raise CodecError(f"ZLIB stream is truncated after {len(out)} of {size} bytes")
    return out


def _snappy_length(data: Buffer) -> int:
    """The uncompressed length a raw snappy block starts with (a little-endian base-128
    varint of at most 5 bytes)."""
    value = 0
    for i in range(min(len(data), 5)):
        byte = data[i]
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return value
    raise CodecError("SNAPPY block has no valid length prefix")
