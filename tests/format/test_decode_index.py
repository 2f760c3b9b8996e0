"""One decoder for both index kinds, dispatching on the magic; the package's public surface."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

import offloadd.format as fmt
from offloadd.errors import FormatError
from offloadd.format import (
    IndexEntry,
    LedgerIndex,
    SectionInput,
    StreamingIndex,
    build_ledger_metadata,
    decode_index,
    encode_ledger_index,
    encode_streaming_index,
)
from tests.format._support import RELAXED


class TestDecodeIndex:
    """decode_index picks the decoder by magic and names unknown magics."""

    def test_streaming_magic(self) -> None:
        buf = encode_streaming_index(10, [SectionInput(1, 1, 0, 0, [IndexEntry(0, 1, 0)])])
        assert isinstance(decode_index(buf, "o"), StreamingIndex)

    def test_ledger_magic(self) -> None:
        meta = build_ledger_metadata(last_entry_id=0, length=0)
        buf = encode_ledger_index(10, meta, [IndexEntry(0, 1, 0)])
        assert isinstance(decode_index(buf, "o"), LedgerIndex)

    def test_unknown_magic_is_named(self) -> None:
        with pytest.raises(FormatError, match="o-index at byte 0: unknown index magic 0x12345678"):
            decode_index(b"\x12\x34\x56\x78" + bytes(40), "o-index")

    @pytest.mark.parametrize("buf", [b"", b"\x3d\x1f\xb0"])
    def test_too_short_for_a_magic(self, buf: bytes) -> None:
        with pytest.raises(FormatError, match="truncated index"):
            decode_index(buf, "o")

    @RELAXED
    @given(
        st.binary(max_size=200),
        st.sampled_from([b"\x3d\x1f\xb0\xbc", b"\xde\x47\xde\x47", b""]),
    )
    def test_random_bytes_only_raise_format_errors(self, junk: bytes, magic: bytes) -> None:
        with contextlib.suppress(FormatError):
            decode_index(magic + junk, "o")


def test_public_surface_is_listed_and_importable() -> None:
    assert sorted(fmt.__all__) == sorted(set(fmt.__all__))
    for name in fmt.__all__:
        assert getattr(fmt, name) is not None
    assert {"decode_index", "StreamingObjectBuilder", "build_ledger_object", "plan_blocks"} <= set(
        fmt.__all__
    )
