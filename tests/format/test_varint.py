"""Protobuf varints, written and read by hand in one place."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from offloadd._proto import pulsar_api_pb2 as pb
from offloadd.errors import FormatError
from offloadd.format.varint import decode_varint, encode_varint


class TestVarint:
    """Bytes as protobuf writes them; junk refused with the position named."""

    @given(st.integers(0, 2**64 - 1))
    def test_unsigned_values_match_protobuf_and_round_trip(self, value: int) -> None:
        raw = encode_varint(value)
        assert raw == pb.BrokerEntryMetadata(index=value).SerializeToString()[1:]
        assert decode_varint(raw + b"junk", 0, len(raw) + 4, "x") == (value, len(raw))

    @given(st.integers(-(2**63), -1))
    def test_negatives_are_ten_byte_twos_complement(self, value: int) -> None:
        raw = encode_varint(value)
        assert len(raw) == 10
        assert decode_varint(raw, 0, len(raw), "x") == (value + 2**64, 10)

    @pytest.mark.parametrize("raw", [b"", b"\x80", b"\xff\xff", b"\x80" * 11])
    def test_truncated_or_overlong_is_a_format_error(self, raw: bytes) -> None:
        with pytest.raises(FormatError, match="where"):
            decode_varint(raw, 0, len(raw), "where")

    def test_the_end_bound_is_respected(self) -> None:
        with pytest.raises(FormatError):
            decode_varint(b"\x96\x01", 0, 1, "x")  # complete, but past the given end
