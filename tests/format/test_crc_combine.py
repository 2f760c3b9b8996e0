"""CRC32C combine (``format/checksum.py``): the CRC of a concatenation from the CRCs of its
parts, and a block stamp derived from piece CRCs equal to one made by reading every byte."""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from itertools import pairwise

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from offloadd.format import StreamingObjectBuilder
from offloadd.format.checksum import crc32c_combine, crc32c_of, stamp_block, stamp_blocks
from offloadd.format.ledger import LedgerObjectBuilder
from offloadd.model import EntryRun, PieceSums


class TestCombine:
    @given(st.binary(max_size=3000), st.binary(max_size=3000))
    def test_the_combine_is_the_crc_of_the_concatenation(self, a: bytes, b: bytes) -> None:
        assert crc32c_combine(crc32c.crc32c(a), crc32c.crc32c(b), len(b)) == crc32c.crc32c(a + b)

    @given(st.lists(st.binary(max_size=700), max_size=8))
    def test_folding_many_pieces_left_to_right(self, pieces: list[bytes]) -> None:
        crc = 0
        for p in pieces:
            crc = crc32c_combine(crc, crc32c.crc32c(p), len(p))
        assert crc == crc32c.crc32c(b"".join(pieces))

    @given(st.binary(max_size=64), st.integers(0, 3 * 2**20), st.integers(0, 255))
    def test_long_second_parts(self, a: bytes, n: int, fill: int) -> None:
        b = bytes([fill]) * n
        assert crc32c_combine(crc32c.crc32c(a), crc32c.crc32c(b), n) == crc32c.crc32c(a + b)

    def test_an_empty_second_part_changes_nothing_and_a_negative_length_is_refused(
            self) -> None:
        assert crc32c_combine(0xDEADBEEF, 0, 0) == 0xDEADBEEF
        with pytest.raises(ValueError, match="length must be >= 0"):
            crc32c_combine(1, 2, -1)


@st.composite
def pieces(draw: st.DrawFn) -> tuple[bytes, PieceSums, int, int]:
    """Data, CRCs of consecutive pieces of it (not necessarily reaching either end, of equal
    or varied lengths), and a range to take the CRC of."""
    data = draw(st.binary(min_size=1, max_size=5000))
    n = len(data)
    if draw(st.booleans()):
        size = draw(st.integers(1, max(1, n // 3)))
        first = draw(st.integers(0, n))
        starts: Sequence[int] = range(first, draw(st.integers(first, n)) + 1, size)
    else:
        starts = sorted(set(draw(st.lists(st.integers(0, n), max_size=12))))
    crcs = [crc32c.crc32c(data[x:y]) for x, y in pairwise(starts)]
    if not crcs:
        starts = [0]
    a = draw(st.integers(0, n))
    b = draw(st.integers(a, n))
    return data, PieceSums(starts, crcs), a, b


class TestCrcOfARange:
    @settings(max_examples=300)
    @given(pieces())
    def test_derived_from_pieces_equals_reading_the_bytes(
            self, case: tuple[bytes, PieceSums, int, int]) -> None:
        data, sums, a, b = case
        assert crc32c_of(memoryview(data)[a:b], a, sums) == crc32c.crc32c(data[a:b])

    def test_the_pieces_are_used_not_the_bytes_under_them(self) -> None:
        data = os.urandom(10 * 4096)
        starts = range(0, len(data) + 1, 4096)
        crcs = [crc32c.crc32c(data[x:x + 4096]) for x in starts[:-1]]
        assert crc32c_of(data, 0, PieceSums(starts, crcs)) == crc32c.crc32c(data)
        crcs[3] ^= 1  # a piece CRC that does not match its bytes shows in the result
        assert crc32c_of(data, 0, PieceSums(starts, crcs)) != crc32c.crc32c(data)


def framed(sizes: list[int], first: int = 0) -> tuple[bytes, list[int]]:
    out, offsets = bytearray(), [0]
    for i, n in enumerate(sizes):
        out += struct.pack(">iq", n, first + i) + os.urandom(n)
        offsets.append(len(out))
    return bytes(out), offsets


def chunk_sums_of(data: bytes, chunk: int, at: int) -> PieceSums:
    """What a checking source hands on: CRCs of the whole chunks from ``at`` on."""
    starts = range(at, len(data) + 1, chunk)
    return PieceSums(starts, [crc32c.crc32c(data[x:x + chunk]) for x in starts[:-1]])


class TestStampFromPieces:
    """The stamped block bytes are the same whether the CRC is combined or read."""

    @settings(max_examples=80, deadline=None)
    @given(st.lists(st.integers(0, 3000), min_size=1, max_size=40), st.integers(300, 9000),
           st.integers(0, 4000), st.integers(1, 2048), st.integers(0, 2047))
    def test_streaming_blocks(self, sizes: list[int], max_block: int, min_block: int,
                              chunk: int, at: int) -> None:
        data, offsets = framed(sizes)
        run = EntryRun(9, 0, memoryview(data), offsets)
        sums = chunk_sums_of(data, chunk, min(at, len(data)))
        builder = StreamingObjectBuilder(max_block_size=max_block,
                                         min_block_size=min(min_block, max_block))
        blocks = builder.add_run(run)
        read = [b"".join(bytes(b) for b in p.buffers) for p in stamp_blocks(blocks)]
        combined = [b"".join(bytes(b) for b in p.buffers) for p in stamp_blocks(blocks, sums)]
        assert combined == read

    @settings(max_examples=40, deadline=None)
    @given(st.lists(st.integers(0, 3000), min_size=1, max_size=30), st.integers(300, 9000),
           st.integers(1, 2048), st.booleans())
    def test_ledger_blocks(self, sizes: list[int], max_block: int, chunk: int,
                           last: bool) -> None:
        data, offsets = framed(sizes)
        run = EntryRun(9, 0, memoryview(data), offsets)
        blocks = LedgerObjectBuilder(ledger_id=9, max_block_size=max_block).add_run(run,
                                                                                 last=last)
        sums = chunk_sums_of(data, chunk, 0)
        assert ([stamp_block(p, sums).buffers[0] for p in blocks]
                == [stamp_block(p).buffers[0] for p in blocks])


class TestLongLengths:
    """Lengths no test can hold in memory: the shift by ``m + n`` bytes must be the shift by
    ``m`` then by ``n`` (CRC32C's x^(2^32) is not x mod P: no exponent may wrap)."""

    @given(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1),
           st.integers(0, 2**44), st.integers(0, 2**44))
    def test_combining_is_associative_at_any_length(self, a: int, b: int, c: int, m: int,
                                                    n: int) -> None:
        left = crc32c_combine(crc32c_combine(a, b, m), c, n)
        assert left == crc32c_combine(a, crc32c_combine(b, c, n), m + n)


class TestWholeBlockCrc:
    """The stamp also gives each block's CRC32C over all its bytes, header included (what a
    store's part checksum is combined from), whether its payload CRC was read or combined."""

    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.integers(0, 3000), min_size=1, max_size=30), st.integers(300, 9000),
           st.integers(1, 2048), st.booleans())
    def test_streaming_and_ledger_blocks(self, sizes: list[int], max_block: int, chunk: int,
                                         ledger: bool) -> None:
        data, offsets = framed(sizes)
        run = EntryRun(9, 0, memoryview(data), offsets)
        parts = (LedgerObjectBuilder(ledger_id=9, max_block_size=max_block).add_run(run, last=True)
                 if ledger else StreamingObjectBuilder(max_block_size=max_block,
                                                       min_block_size=0).add_run(run))
        for sums in (None, chunk_sums_of(data, chunk, 0)):
            for p in stamp_blocks(parts, sums):
                assert p.crc32c == crc32c.crc32c(b"".join(bytes(b) for b in p.buffers))
        assert all(p.crc32c is None for p in parts)  # not stamped: not known
