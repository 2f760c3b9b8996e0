"""Ledger-based (PIP-17) objects: metadata, writer, index codec, reading back, junk.

Block lengths for max_block_size=400 and five 100-byte entries (112-byte frames)::

    offset 0    part 1  [header][e0 e1][padding 40]  400  (full: padded to max)
    offset 400  part 2  [header][e2 e3][padding 40]  400
    offset 800  part 3  [header][e4]                 240  (last: exact, no padding)
"""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from offloadd._proto.bookkeeper_pb2 import LedgerMetadataFormat
from offloadd.errors import FormatError, NotFound
from offloadd.format import (
    HEADER_LEN,
    IndexEntry,
    LedgerIndex,
    build_ledger_metadata,
    build_ledger_object,
    decode_index,
    decode_ledger_index,
    encode_ledger_index,
)
from tests.format._support import RELAXED, make_run, read_ledger


def _meta(last_entry_id: int, length: int = 0) -> bytes:
    return build_ledger_metadata(last_entry_id=last_entry_id, length=length)


class TestLedgerMetadata:
    """build_ledger_metadata fills every field Pulsar's reader needs."""

    def test_defaults_are_a_valid_closed_single_bookie_ledger(self) -> None:
        meta = LedgerMetadataFormat.FromString(_meta(9, 123))
        assert meta.IsInitialized()
        assert (meta.ensembleSize, meta.quorumSize, meta.ackQuorumSize) == (1, 1, 1)
        assert (meta.lastEntryId, meta.length) == (9, 123)
        assert meta.state == LedgerMetadataFormat.CLOSED
        assert meta.digestType == LedgerMetadataFormat.CRC32C
        (segment,) = meta.segment
        assert (len(segment.ensembleMember), segment.firstEntryId) == (1, 0)
        assert not meta.HasField("ctime")
        assert not meta.HasField("password")

    def test_quorums_default_to_the_ensemble(self) -> None:
        meta = LedgerMetadataFormat.FromString(
            build_ledger_metadata(last_entry_id=0, length=1, ensemble_size=3, ack_quorum_size=2)
        )
        assert (meta.ensembleSize, meta.quorumSize, meta.ackQuorumSize) == (3, 3, 2)
        assert len(meta.segment[0].ensembleMember) == 3

    def test_custom_metadata_keeps_its_order_and_accepts_bytes(self) -> None:
        meta = LedgerMetadataFormat.FromString(
            build_ledger_metadata(
                last_entry_id=0, length=1, ctime_ms=5, custom_metadata={"z": "1", "a": b"\x00"}
            )
        )
        assert [(m.key, m.value) for m in meta.customMetadata] == [("z", b"1"), ("a", b"\x00")]
        assert meta.ctime == 5

    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [
            ({"ensemble_size": 2, "write_quorum_size": 3}, "write quorum"),
            ({"ensemble_size": 3, "write_quorum_size": 2, "ack_quorum_size": 3}, "ack quorum"),
            ({"ensemble_size": 2, "ensemble": ["b1:3181"]}, "1 members"),
        ],
    )
    def test_inconsistent_quorums_are_refused(self, kwargs: dict[str, object], match: str) -> None:
        with pytest.raises(ValueError, match=match):
            build_ledger_metadata(last_entry_id=0, length=0, **kwargs)  # type: ignore[arg-type]


@st.composite
def ledgers(draw: st.DrawFn) -> tuple[list[bytes], int]:
    max_block = draw(st.integers(144, 1200))
    fill = max_block - HEADER_LEN - 4 - 12
    size = st.one_of(
        st.just(0), st.integers(0, 40), st.just(fill), st.just(fill + 4),
        st.integers(max(0, fill - 3), fill + 3), st.integers(max_block, 2 * max_block),
    )
    rng = random.Random(draw(st.integers(0, 1 << 32)))
    return [rng.randbytes(s) for s in draw(st.lists(size, min_size=1, max_size=25))], max_block


class TestRoundTrip:
    """A ledger comes back identical; full blocks padded to max, the last one exact."""

    @RELAXED
    @given(ledgers(), st.integers(0, 1 << 40))
    def test_entries_come_back_and_every_rule_holds(
        self, case: tuple[list[bytes], int], ledger_id: int
    ) -> None:
        payloads, max_block = case
        obj = build_ledger_object(
            make_run(ledger_id, 0, payloads), max_block_size=max_block,
            ledger_metadata=_meta(len(payloads) - 1, sum(map(len, payloads))),
        )
        data = obj.data_bytes()
        assert obj.length == len(data)
        index = decode_index(obj.index, "o-ledger-index")
        assert isinstance(index, LedgerIndex)
        assert read_ledger(data, index, ledger_id) == [
            (ledger_id, i, p) for i, p in enumerate(payloads)
        ]
        for blk in obj.blocks[:-1]:
            assert blk.length == max_block or (
                blk.plan.entry_count == 1 and blk.length > max_block
            )
        for i in range(len(payloads)):
            block = index.locate(i)
            assert block.first_entry_id <= i
        with pytest.raises(NotFound):
            index.locate(len(payloads))
        assert encode_ledger_index(
            index.data_object_length, index.ledger_metadata, index.blocks
        ) == obj.index

    def test_layout_of_five_entries_in_400_byte_blocks(self) -> None:
        obj = build_ledger_object(
            make_run(3, 0, [bytes(100)] * 5), max_block_size=400, ledger_metadata=_meta(4, 500)
        )
        assert [(b.number, b.offset, b.length) for b in obj.blocks] == [
            (1, 0, 400), (2, 400, 400), (3, 800, 240),
        ]
        assert len(obj.blocks[-1].buffers) == 2, "the exact last block has no padding buffer"
        index = decode_ledger_index(obj.index, "o")
        assert index.blocks == (IndexEntry(0, 1, 0), IndexEntry(2, 2, 400), IndexEntry(4, 3, 800))
        assert index.block_end(index.blocks[1]) == 800
        assert index.block_end(index.blocks[2]) == 1040

    def test_oversize_last_entry_is_kept_exactly(self) -> None:
        big = b"\x01" * 1000
        obj = build_ledger_object(
            make_run(3, 0, [b"a", big]), max_block_size=300, ledger_metadata=_meta(1)
        )
        assert [b.length for b in obj.blocks] == [300, HEADER_LEN + 12 + 1000]
        index = decode_ledger_index(obj.index, "o")
        assert read_ledger(obj.data_bytes(), index, 3) == [(3, 0, b"a"), (3, 1, big)]

    @pytest.mark.parametrize(
        ("first", "payloads", "meta", "match"),
        [
            (0, [], _meta(-1), "at least one entry"),
            (1, [b"a"], _meta(1), "from entry 0"),
            (0, [b"a", b"b"], _meta(0), "lastEntryId 0 but the run ends at entry 1"),
        ],
    )
    def test_a_run_that_is_not_the_whole_ledger_is_refused(
        self, first: int, payloads: list[bytes], meta: bytes, match: str
    ) -> None:
        with pytest.raises(ValueError, match=match):
            build_ledger_object(make_run(3, first, payloads), max_block_size=300,
                                ledger_metadata=meta)


def _index_bytes(blocks: list[IndexEntry] | None = None, *, data_length: int = 1000,
                 meta: bytes | None = None) -> bytes:
    return encode_ledger_index(
        data_length,
        meta if meta is not None else _meta(4),
        blocks if blocks is not None else [IndexEntry(0, 1, 0), IndexEntry(2, 2, 400)],
    )


class TestIndexJunk:
    """A damaged ledger index raises FormatError naming the object and the byte offset."""

    def _raises(self, buf: bytes, offset: int, match: str) -> None:
        with pytest.raises(FormatError, match=match) as info:
            decode_ledger_index(buf, "b/x-ledger-3-index")
        assert (info.value.obj, info.value.offset) == ("b/x-ledger-3-index", offset)
        assert f"b/x-ledger-3-index at byte {offset}:" in str(info.value)

    def test_sample_is_valid(self) -> None:
        index = decode_ledger_index(_index_bytes(), "o")
        assert (index.locate(3), index.last_entry_id) == (IndexEntry(2, 2, 400), 4)

    def test_bad_magic(self) -> None:
        buf = bytearray(_index_bytes())
        buf[0:4] = b"\x3d\x1f\xb0\xbc"
        self._raises(bytes(buf), 0, "bad index magic 0x3D1FB0BC")

    def test_every_truncation_is_refused(self) -> None:
        buf = _index_bytes()
        for cut in range(len(buf)):
            with pytest.raises(FormatError, match="truncated"):
                decode_ledger_index(buf[:cut], "o")

    def test_trailing_bytes(self) -> None:
        buf = _index_bytes()
        self._raises(buf + b"\0\0", len(buf), "2 trailing bytes")

    def test_trailing_bytes_inside_the_declared_length(self) -> None:
        buf = bytearray(_index_bytes() + b"\0" * 3)
        struct.pack_into(">i", buf, 4, len(buf))
        self._raises(bytes(buf), len(buf) - 3, "3 trailing bytes after the block table")

    def test_block_count_past_the_end(self) -> None:
        buf = bytearray(_index_bytes())
        struct.pack_into(">i", buf, 24, 3)
        self._raises(bytes(buf), 24, "truncated index: 3 blocks")

    def test_offset_past_the_data_object(self) -> None:
        buf = _index_bytes(data_length=400)
        self._raises(buf, len(buf) - 8, "block offset 400 is outside the data object")

    def test_part_id_zero(self) -> None:
        buf = _index_bytes([IndexEntry(0, 0, 0)])
        self._raises(buf, len(buf) - 12, "part id 0")

    def test_offsets_out_of_order(self) -> None:
        buf = _index_bytes([IndexEntry(0, 1, 400), IndexEntry(2, 2, 0)])
        self._raises(buf, len(buf) - 8, "block offset 0 is not above")

    def test_block_past_the_last_entry(self) -> None:
        buf = _index_bytes([IndexEntry(0, 1, 0), IndexEntry(5, 2, 400)])
        self._raises(buf, 32, "lastEntryId 4 but a block starts at entry 5")

    def test_metadata_missing_required_fields(self) -> None:
        meta = LedgerMetadataFormat(quorumSize=1, ensembleSize=1, lastEntryId=4)
        buf = _index_bytes(meta=meta.SerializePartialToString())
        self._raises(buf, 32, "lacks required length, state")

    def test_metadata_that_does_not_parse(self) -> None:
        self._raises(_index_bytes(meta=b"\xff\xff\xff"), 32, "does not parse")

    @RELAXED
    @given(st.data())
    def test_mutated_indexes_only_raise_format_errors(self, data: st.DataObject) -> None:
        buf = bytearray(_index_bytes())
        for _ in range(data.draw(st.integers(1, 4))):
            buf[data.draw(st.integers(0, len(buf) - 1))] = data.draw(st.integers(0, 255))
        try:
            index = decode_ledger_index(bytes(buf), "o")
        except FormatError:
            return
        assert index.last_entry_id >= index.blocks[-1].first_entry_id
