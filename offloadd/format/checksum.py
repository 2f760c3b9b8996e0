"""offloadd's per-block checksum, carried in bytes Pulsar leaves zero (pure, no I/O).

Pulsar's block header is 128 bytes; after its fields (magic, header length, block length, first
entry id, and the ledger id in streaming blocks: bytes 0..35) the rest is zeros that Pulsar's
readers skip without looking. offloadd writes, at bytes 36..43 of the header::

    [int32 mark 0x4F464443 ("OFDC")][uint32 CRC32C of the block's bytes 128..block_len)]

so every block can be checked on its own by a ranged read, while Pulsar still reads the object.

The stamp costs no pass over the bytes when the source has already made one: a source that
checks what it reads against its store's checksums hands on the CRC32Cs it computed over the
bytes read (``EntryRun.sums``), and the block's CRC is *combined* from them
(:func:`crc32c_combine`, :func:`crc32c_of`); only the bytes no piece covers (at most a piece at
each end of a block, and the padding) are passed through CRC32C again. The stamp also gives
the whole block's CRC32C (``Block.crc32c``, the header combined with the rest), from which the
uploader combines each multipart part's (S3's ``x-amz-checksum-crc32c``) without a pass either.

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
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import replace
from functools import cache, lru_cache
from itertools import islice

import crc32c

from offloadd.errors import FormatError
from offloadd.format.block import HEADER_LEN
from offloadd.format.layout import Block
from offloadd.model.frames import PieceSums

CHECKSUM_MARK = 0x4F464443
CHECKSUM_OFFSET = 36
# The record, in an index's bytes, that every block of the pair carries the checksum
RECORD_KEY = "offloadd-block-checksum"
RECORD_VALUE = "crc32c"
RECORD_DRIVER = "offloadd"
_FIELD = struct.Struct(">II")

Buffer = bytes | bytearray | memoryview


# CRC32C combine, as zlib's crc32_combine: polynomials over GF(2) in CRC32C's reflected bit
# order (bit 31 is x^0), so the CRC of A+B is x^(8·len(B))·crc(A) + crc(B) mod P; the pre- and
# post-conditioning (0xFFFFFFFF) cancel out in that sum.
_POLY = 0x82F63B78  # the Castagnoli polynomial, reflected


def _multmodp(a: int, b: int) -> int:
    """a·b mod P (reflected)."""
    p = 0
    m = 1 << 31
    while m:
        if a & m:
            p ^= b
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1
    return p


def _powers() -> tuple[int, ...]:
    out = [1 << 30]  # x^1
    for _ in range(63):
        out.append(_multmodp(out[-1], out[-1]))
    return tuple(out)


# _X2N[k] = x^(2^k) mod P. Not wrapped at k = 32 as zlib does for CRC-32: for the Castagnoli
# polynomial x^(2^32) is not x mod P, so every power a length up to 2^61 bytes needs is kept.
_X2N = _powers()


def _x8nmodp(n: int) -> int:
    """x^(8·n) mod P: the factor that shifts a CRC past ``n`` bytes."""
    if n >= 1 << 61:
        raise ValueError(f"length {n} is past 2^61 bytes")
    p = 1 << 31  # x^0
    k = 3
    while n:
        if n & 1:
            p = _multmodp(_X2N[k], p)
        n >>= 1
        k += 1
    return p


def crc32c_combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC32C of ``A + B`` from ``crc1`` = CRC32C(A), ``crc2`` = CRC32C(B) and ``len2`` =
    len(B), without the bytes (one table step per set bit of ``len2``)."""
    if len2 < 0:
        raise ValueError(f"length must be >= 0, got {len2}")
    if len2 >= 1 << 61:
        raise ValueError(f"length {len2} is past 2^61 bytes")
    crc = crc1
    k = 0
    while len2:
        if len2 & 1:
            t0, t1, t2, t3 = _bit_tables(k)
            crc = t0[crc & 255] ^ t1[crc >> 8 & 255] ^ t2[crc >> 16 & 255] ^ t3[crc >> 24]
        len2 >>= 1
        k += 1
    return crc ^ crc2


def _tables(factor: int) -> tuple[tuple[int, ...], ...]:
    """Four byte-indexed tables of ``crc ↦ factor·crc mod P`` (linear in ``crc``), so one
    product costs four look-ups, not 32 shift-and-add steps.

    Built by doubling (a quarter of the time of an entry-by-entry loop): a fresh daemon builds
    tables for every bit of the block and part lengths it combines over (~25 of them) within
    the first blocks it stamps."""
    # basis[i] = factor·(1 << i): bit 31 is x^0, so basis[31] is factor itself and each lower
    # bit is one more multiplication by x (a shift right, reduced)
    basis = [0] * 32
    b = factor
    for i in range(31, -1, -1):
        basis[i] = b
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1
    tables = []
    for j in range(4):
        # by linearity t[v] is the sum of the basis of v's set bits: each bit doubles the table
        t = [0]
        for i in range(8 * j, 8 * j + 8):
            bi = basis[i]
            t += [x ^ bi for x in t]
        tables.append(tuple(t))
    return tuple(tables)


@cache
def _bit_tables(k: int) -> tuple[tuple[int, ...], ...]:
    """The tables of x^(8·2^k): shifting past any length is one step per set bit (built on
    first use, at most 61 of them)."""
    return _tables(_X2N[k + 3])


@lru_cache(maxsize=8)
def _shift_tables(n: int) -> tuple[tuple[int, ...], ...]:
    """The tables of x^(8n): folding many pieces of one length costs four look-ups each."""
    return _tables(_x8nmodp(n))


def crc32c_of(view: Buffer, at: int, sums: PieceSums | None) -> int:
    """CRC32C of ``view``, which holds bytes ``at .. at + len(view)`` of the data ``sums``
    describes: the pieces lying wholly inside are combined from their CRCs, only the bytes
    outside them are read."""
    mv = memoryview(view)
    end = at + len(mv)
    if sums is None:
        return crc32c.crc32c(mv)
    starts, crcs = sums.starts, sums.crcs
    k0 = bisect_left(starts, at)
    k1 = min(bisect_right(starts, end) - 1, len(crcs))
    if k1 <= k0:
        return crc32c.crc32c(mv)
    crc = crc32c.crc32c(mv[:starts[k0] - at])
    if isinstance(starts, range):  # pieces of one length (chunks): no length to look up
        t0, t1, t2, t3 = _shift_tables(starts.step)
        for c in islice(crcs, k0, k1):
            crc = t0[crc & 255] ^ t1[crc >> 8 & 255] ^ t2[crc >> 16 & 255] ^ t3[crc >> 24] ^ c
        return crc32c.crc32c(mv[starts[k1] - at:], crc)
    size = -1
    for k in range(k0, k1):
        n = starts[k + 1] - starts[k]
        if n != size:
            size = n
            t0, t1, t2, t3 = _shift_tables(n)
        crc = t0[crc & 255] ^ t1[crc >> 8 & 255] ^ t2[crc >> 16 & 255] ^ t3[crc >> 24] ^ crcs[k]
    return crc32c.crc32c(mv[starts[k1] - at:], crc)


def stamp_block(block: Block, sums: PieceSums | None = None) -> Block:
    """The same block with the checksum written into its header (the payload is not copied)
    and its whole CRC32C (``Block.crc32c``).

    ``sums``: CRC32Cs of pieces of the run the block's payload is a view of (``EntryRun.sums``):
    the payload's CRC is combined from them (:func:`crc32c_of`) instead of read again.
    """
    header = bytearray(block.buffers[0])
    if len(header) != HEADER_LEN:
        raise ValueError("a block's first buffer must be its 128-byte header")
    rest = block.buffers[1:]
    crc = 0
    if sums is not None and rest and block.plan.payload_len:
        crc = crc32c_of(rest[0], block.plan.start, sums)
        rest = rest[1:]
    for b in rest:
        crc = crc32c.crc32c(b, crc)
    _FIELD.pack_into(header, CHECKSUM_OFFSET, CHECKSUM_MARK, crc)
    # the whole block's CRC (what a store checks a part against) from the stamped header's
    # and the rest's: 128 bytes read, not the block
    whole = crc32c_combine(crc32c.crc32c(header), crc, block.length - HEADER_LEN)
    return replace(block, buffers=(bytes(header), *block.buffers[1:]), crc32c=whole)


def stamp_blocks(blocks: Sequence[Block], sums: PieceSums | None = None) -> list[Block]:
    return [stamp_block(b, sums) for b in blocks]


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
