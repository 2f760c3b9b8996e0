"""Block headers, padding, entry framing and reading one block back."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from offloadd.errors import FormatError
from offloadd.format import (
    HEADER_LEN,
    LEDGER_BLOCK_MAGIC,
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
from tests.format._support import RELAXED


def _block(payloads: list[bytes], first: int = 0, *, pad: int = 4, ledger: int = 9) -> bytes:
    framed, _ = frame_entries(first, payloads)
    block_len = HEADER_LEN + len(framed) + pad
    return pack_streaming_header(block_len, first, ledger) + framed + bytes(padding(pad))


class TestHeaders:
    """Headers are 128 bytes, big-endian, zero-filled past their fields."""

    def test_streaming_header_layout(self) -> None:
        h = pack_streaming_header(300, 5, 7)
        assert len(h) == HEADER_LEN
        assert h[:36] == struct.pack(">Iqqqq", 0x26A66D32, 128, 300, 5, 7)
        assert h[36:] == bytes(92)

    def test_ledger_header_has_no_ledger_id(self) -> None:
        h = pack_ledger_header(223, 0)
        assert h[:28] == struct.pack(">Iqqq", 0xFBDBABCB, 128, 223, 0)
        assert h[28:] == bytes(100)

    @RELAXED
    @given(
        st.integers(HEADER_LEN, 4096), st.integers(0, (1 << 63) - 1),
        st.integers(0, (1 << 63) - 1),
    )
    def test_headers_round_trip(self, block_len: int, first: int, ledger: int) -> None:
        buf = pack_streaming_header(block_len, first, ledger) + bytes(block_len - HEADER_LEN)
        assert parse_block_header(buf, 0, "o") == BlockHeader(
            STREAMING_BLOCK_MAGIC, block_len, first, ledger
        )
        buf = pack_ledger_header(block_len, first) + bytes(block_len - HEADER_LEN)
        assert parse_block_header(buf, 0, "o") == BlockHeader(
            LEDGER_BLOCK_MAGIC, block_len, first, None
        )

    def test_header_is_found_at_an_offset(self) -> None:
        buf = b"x" * 50 + pack_ledger_header(130, 3) + b"ab"
        assert parse_block_header(buf, 50, "o").first_entry_id == 3


class TestPadding:
    """Padding is the FE DC DE AD pattern cut to length, always starting at FE."""

    @pytest.mark.parametrize("n", [0, 1, 3, 4, 5, 7, 8, 301, 1 << 20])
    def test_pattern_cut_to_length(self, n: int) -> None:
        expected = (PADDING_PATTERN * (n // 4 + 1))[:n]
        assert bytes(padding(n)) == expected

    def test_larger_than_cache_still_correct(self) -> None:
        n = (1 << 19) * 4 + 3
        p = padding(n)
        assert len(p) == n
        assert bytes(p[-7:]) == b"\xfe\xdc\xde\xad\xfe\xdc\xde"
        assert bytes(padding(6)) == b"\xfe\xdc\xde\xad\xfe\xdc"

    def test_reads_negative_as_an_int32(self) -> None:
        # The reader's stop rule depends on this, and so do both block magics.
        assert struct.unpack(">i", padding(4))[0] < 0
        assert struct.unpack(">i", struct.pack(">I", STREAMING_BLOCK_MAGIC))[0] > 0
        assert struct.unpack(">i", struct.pack(">I", LEDGER_BLOCK_MAGIC))[0] < 0

    def test_negative_length_is_refused(self) -> None:
        with pytest.raises(ValueError, match="padding"):
            padding(-1)


class TestFraming:
    """frame_entries frames as blocks do and returns n + 1 frame starts."""

    def test_frames_and_offsets(self) -> None:
        data, offsets = frame_entries(10, [b"ab", b"", b"xyz"])
        assert data == (
            struct.pack(">iq", 2, 10) + b"ab" + struct.pack(">iq", 0, 11)
            + struct.pack(">iq", 3, 12) + b"xyz"
        )
        assert offsets == [0, 14, 26, 41]

    def test_no_entries(self) -> None:
        assert frame_entries(0, []) == (b"", [0])


class TestReadingABlock:
    """iter_block_entries yields each entry once, in order, as views, and stops at padding."""

    @RELAXED
    @given(st.lists(st.binary(max_size=40), min_size=1, max_size=20), st.integers(0, 9),
           st.integers(0, 1000))
    def test_entries_come_back_in_order(self, payloads: list[bytes], pad: int, first: int) -> None:
        # Fewer than 4 padding bytes at the very end is tolerated when reading.
        buf = _block(payloads, first, pad=pad) + pack_streaming_header(200, 99, 1)
        got = [(e, bytes(p)) for e, p in iter_block_entries(buf, 0, "o")]
        assert got == [(first + i, p) for i, p in enumerate(payloads)]

    def test_stops_at_the_next_blocks_magic_without_padding(self) -> None:
        framed, _ = frame_entries(0, [b"a"])
        nxt = pack_ledger_header(HEADER_LEN + 13, 1) + frame_entries(1, [b"b"])[0]
        buf = pack_ledger_header(HEADER_LEN + len(framed), 0) + framed + nxt
        assert [e for e, _ in iter_block_entries(buf, 0, "o")] == [0]

    def test_payloads_are_views_not_copies(self) -> None:
        buf = bytearray(_block([b"hello"]))
        (_, view), = list(iter_block_entries(buf, 0, "o"))
        buf[HEADER_LEN + 12] = ord("j")
        assert bytes(view) == b"jello"


class TestJunk:
    """Bytes that are not a valid block raise FormatError naming the object and offset."""

    def _raises(self, buf: bytes, offset: int, match: str, at: int = 0) -> FormatError:
        with pytest.raises(FormatError, match=match) as info:
            list(iter_block_entries(buf, at, "bucket/obj"))
        assert info.value.obj == "bucket/obj"
        assert info.value.offset == offset
        assert f"bucket/obj at byte {offset}" in str(info.value)
        return info.value

    def test_bad_magic(self) -> None:
        buf = bytearray(_block([b"a"]))
        buf[0] = 0x11
        self._raises(bytes(buf), 0, "bad block magic 0x11A66D32")

    def test_wrong_kind_of_block(self) -> None:
        with pytest.raises(FormatError, match="expected 0xFBDBABCB"):
            parse_block_header(_block([b"a"]), 0, "o", magic=LEDGER_BLOCK_MAGIC)

    @pytest.mark.parametrize("cut", [0, 1, 4, 127])
    def test_truncated_header(self, cut: int) -> None:
        self._raises(_block([b"a"])[:cut], 0, "truncated block header")

    def test_truncated_header_at_an_offset(self) -> None:
        buf = _block([b"a"])
        self._raises(buf + buf[:60], len(buf), "truncated block header", at=len(buf))

    def test_truncated_block(self) -> None:
        buf = _block([b"abc", b"def"])
        self._raises(buf[:-1], 12, "runs past the end")

    def test_header_length_not_128(self) -> None:
        buf = bytearray(_block([b"a"]))
        struct.pack_into(">q", buf, 4, 64)
        self._raises(bytes(buf), 4, "header length 64")

    def test_block_length_shorter_than_header(self) -> None:
        buf = bytearray(_block([b"a"]))
        struct.pack_into(">q", buf, 12, 100)
        self._raises(bytes(buf), 12, "shorter than its 128-byte header")

    def test_entry_length_past_block_end(self) -> None:
        buf = bytearray(_block([b"abc", b"def"]))
        second = HEADER_LEN + 15
        struct.pack_into(">i", buf, second, 1000)
        self._raises(bytes(buf), second, "entry 1 of length 1000 runs past the block end")

    def test_frame_header_past_block_end(self) -> None:
        framed, _ = frame_entries(0, [b"a"])
        tail = struct.pack(">iq", 5, 1)[:8]  # a positive length, then the block ends
        block_len = HEADER_LEN + len(framed) + len(tail)
        buf = pack_streaming_header(block_len, 0, 1) + framed + tail
        self._raises(buf, HEADER_LEN + len(framed), "frame header runs past the block end")

    def test_entry_ids_not_consecutive(self) -> None:
        buf = bytearray(_block([b"abc", b"def"], first=5))
        struct.pack_into(">q", buf, HEADER_LEN + 15 + 4, 7)
        self._raises(bytes(buf), HEADER_LEN + 15 + 4, "entry id 7 where 6 was expected")

    def test_first_entry_id_differs_from_header(self) -> None:
        buf = bytearray(_block([b"abc"], first=5))
        struct.pack_into(">q", buf, 20, 4)
        self._raises(bytes(buf), HEADER_LEN + 4, "entry id 5 where 4 was expected")

    def test_block_without_entries(self) -> None:
        buf = pack_streaming_header(HEADER_LEN + 8, 0, 1) + bytes(padding(8))
        self._raises(buf, 0, "block holds no entries")

    @RELAXED
    @given(st.binary(max_size=400), st.integers(0, 400))
    def test_random_bytes_only_raise_format_errors(self, junk: bytes, at: int) -> None:
        with contextlib.suppress(FormatError):
            list(iter_block_entries(junk, at, "o"))

    @RELAXED
    @given(st.data())
    def test_mutated_blocks_only_raise_format_errors(self, data: st.DataObject) -> None:
        buf = bytearray(_block([b"abc", b"", b"defgh"], pad=9))
        for _ in range(data.draw(st.integers(1, 4))):
            buf[data.draw(st.integers(0, len(buf) - 1))] = data.draw(st.integers(0, 255))
        with contextlib.suppress(FormatError):
            list(iter_block_entries(bytes(buf), 0, "o"))


def test_a_header_fetched_without_its_block_parses_only_when_asked() -> None:
    """A check that fetched only a block's head (the read-back check's 64 KiB of a 64 MiB
    block) parses its header with ``whole=False``; by default the whole block must be there."""
    head = pack_streaming_header(64 << 20, 7, 3) + b"\x00" * 1000
    with pytest.raises(FormatError, match="truncated block"):
        parse_block_header(head, 0, "obj")
    hdr = parse_block_header(head, 0, "obj", whole=False)
    assert (hdr.block_len, hdr.first_entry_id, hdr.ledger_id) == (64 << 20, 7, 3)
    with pytest.raises(FormatError, match="truncated block header"):
        parse_block_header(head[:100], 0, "obj", whole=False)
