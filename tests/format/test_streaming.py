"""Streaming (PIP-76) objects: writer, index codec, reading back, junk.

A two-ledger object with a continuation run, block by block::

    offset 0     part 1  ledger 5, entries 0..1   (run 1)
    offset 300   part 2  ledger 5, entry  2       (run 2 continues ledger 5: a new block)
    offset 600   part 3  ledger 8, entries 0..1
"""

from __future__ import annotations

import contextlib
import random
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from offloadd._proto.mldataformats_pb2 import ManagedLedgerInfo
from offloadd.errors import FormatError, NotFound
from offloadd.format import (
    HEADER_LEN,
    IndexEntry,
    SectionInput,
    StreamingIndex,
    StreamingObjectBuilder,
    build_streaming_object,
    decode_index,
    decode_streaming_index,
    encode_streaming_index,
)
from offloadd.model import EntryRun
from tests.format._support import RELAXED, Entry, make_run, read_streaming


@st.composite
def objects(draw: st.DrawFn) -> tuple[list[EntryRun], list[Entry], int, int]:
    """Runs over 1..5 ledgers (some split into continuation runs), with entries of every kind of
    size: empty, small, exactly filling a block, oversize."""
    max_block = draw(st.integers(144, 1200))
    min_block = draw(st.integers(0, max_block))
    fill = max_block - HEADER_LEN - 4 - 12  # payload that fills a block to the byte
    size = st.one_of(
        st.just(0), st.integers(0, 40), st.just(fill), st.integers(max(0, fill - 3), fill + 3),
        st.integers(max_block, 2 * max_block),
    )
    ledger_ids = sorted(draw(st.sets(st.integers(0, 1 << 40), min_size=1, max_size=5)))
    rng = random.Random(draw(st.integers(0, 1 << 32)))
    runs: list[EntryRun] = []
    expected: list[Entry] = []
    for lid in ledger_ids:
        first = draw(st.integers(0, 50))
        payloads = [rng.randbytes(s) for s in draw(st.lists(size, min_size=1, max_size=12))]
        cuts = sorted(draw(st.sets(st.integers(1, len(payloads)), max_size=3)) | {len(payloads)})
        start = 0
        for cut in cuts:
            runs.append(make_run(lid, first + start, payloads[start:cut]))
            start = cut
        expected += [(lid, first + i, p) for i, p in enumerate(payloads)]
    return runs, expected, max_block, min_block


class TestRoundTrip:
    """Whatever goes in comes back identical, in order, in blocks obeying the writer rules."""

    @RELAXED
    @given(objects())
    def test_entries_come_back_and_every_rule_holds(
        self, case: tuple[list[EntryRun], list[Entry], int, int]
    ) -> None:
        runs, expected, max_block, min_block = case
        obj = build_streaming_object(runs, max_block_size=max_block, min_block_size=min_block)
        data = obj.data_bytes()
        assert obj.length == len(data)
        index = decode_index(obj.index, "o-index")
        assert isinstance(index, StreamingIndex)
        assert read_streaming(data, index) == expected
        for block in obj.blocks:
            assert block.length == sum(len(b) for b in block.buffers)
            assert block.length >= min_block
            assert block.length <= max_block or block.plan.entry_count == 1

    @RELAXED
    @given(objects())
    def test_locate_finds_the_block_holding_each_entry(
        self, case: tuple[list[EntryRun], list[Entry], int, int]
    ) -> None:
        runs, expected, max_block, min_block = case
        obj = build_streaming_object(runs, max_block_size=max_block, min_block_size=min_block)
        index = decode_streaming_index(obj.index, "o-index")
        by_offset = {b.offset: b.plan for b in obj.blocks}
        for lid, eid, _ in expected:
            block = by_offset[index.locate(lid, eid).offset]
            assert (block.ledger_id, block.first_entry_id <= eid <= block.last_entry_id) == (
                lid, True,
            )
        lid, eid, _ = expected[-1]
        with pytest.raises(NotFound):
            index.locate(lid, eid + 1)
        with pytest.raises(NotFound):
            index.locate(-1, 0)

    @RELAXED
    @given(objects())
    def test_index_reencodes_to_the_same_bytes(
        self, case: tuple[list[EntryRun], list[Entry], int, int]
    ) -> None:
        runs, _, max_block, min_block = case
        obj = build_streaming_object(
            runs, max_block_size=max_block, min_block_size=min_block,
            timestamps={r.ledger_id: r.ledger_id * 3 for r in runs},
        )
        index = decode_streaming_index(obj.index, "o-index")
        again = encode_streaming_index(
            index.data_object_length,
            [SectionInput(s.ledger_id, s.entries, s.size, s.timestamp, s.blocks)
             for s in index.sections],
        )
        assert again == obj.index
        assert [s.timestamp for s in index.sections] == [s.ledger_id * 3 for s in index.sections]


class TestBuilder:
    """The incremental builder plans per run, numbers blocks across runs and never copies."""

    def _three_blocks(self) -> tuple[StreamingObjectBuilder, list[list[int]]]:
        b = StreamingObjectBuilder(max_block_size=300, min_block_size=300)
        shape = [
            [p.number for p in b.add_run(make_run(5, 0, [b"a", b"b"]))],
            [p.number for p in b.add_run(make_run(5, 2, [b"c"]))],
            [p.number for p in b.add_run(make_run(8, 0, [b"d", b"e"]))],
        ]
        return b, shape

    def test_blocks_are_numbered_across_runs_and_a_continuation_starts_a_block(self) -> None:
        b, shape = self._three_blocks()
        assert shape == [[1], [2], [3]]
        assert (b.length, b.block_count) == (900, 3)
        index = decode_streaming_index(b.finish(), "o-index")
        assert [(s.ledger_id, s.entries, s.size, s.blocks) for s in index.sections] == [
            (5, 3, 3, (IndexEntry(0, 1, 0), IndexEntry(2, 2, 300))),
            (8, 2, 2, (IndexEntry(0, 3, 600),)),
        ]
        assert [s.timestamp for s in index.sections] == [0, 0]
        assert index.block_end(IndexEntry(2, 2, 300)) == 600
        assert index.block_end(IndexEntry(0, 3, 600)) == 900

    def test_payload_buffers_are_views_of_the_run(self) -> None:
        data = b"".join(struct.pack(">iq", 3, i) + b"xyz" for i in range(4))
        run = EntryRun(1, 0, memoryview(data), [0, 15, 30, 45, 60])
        (block,) = StreamingObjectBuilder(max_block_size=300, min_block_size=0).add_run(run)
        header, payload, pad = block.buffers
        assert isinstance(payload, memoryview)
        assert payload.obj is data
        assert (len(header), len(payload), len(pad)) == (HEADER_LEN, 60, 4)

    def test_empty_run_adds_nothing(self) -> None:
        b = StreamingObjectBuilder(max_block_size=300, min_block_size=0)
        assert b.add_run(make_run(1, 0, [])) == []
        with pytest.raises(ValueError, match="at least one entry"):
            b.finish()

    def test_runs_out_of_log_order_are_refused(self) -> None:
        b = StreamingObjectBuilder(max_block_size=300, min_block_size=0)
        b.add_run(make_run(5, 0, [b"a"]))
        with pytest.raises(ValueError, match="expected entry 1"):
            b.add_run(make_run(5, 2, [b"c"]))
        with pytest.raises(ValueError, match="after ledger 5"):
            b.add_run(make_run(4, 0, [b"c"]))

    def test_bad_block_sizes_are_refused_up_front(self) -> None:
        with pytest.raises(ValueError, match="exceeds"):
            StreamingObjectBuilder(max_block_size=300, min_block_size=301)
        with pytest.raises(ValueError, match="below 144"):
            StreamingObjectBuilder(max_block_size=100, min_block_size=0)

    def test_no_run_after_finish(self) -> None:
        b = StreamingObjectBuilder(max_block_size=300, min_block_size=0)
        b.add_run(make_run(5, 0, [b"a"]))
        b.finish()
        with pytest.raises(ValueError, match="after finish"):
            b.add_run(make_run(5, 1, [b"b"]))

    def test_oversize_entry_is_kept_in_a_grown_block(self) -> None:
        big = bytes(range(256)) * 8
        obj = build_streaming_object(
            [make_run(2, 0, [b"s", big, b"t"])], max_block_size=300, min_block_size=300
        )
        assert [b.length for b in obj.blocks] == [300, HEADER_LEN + 12 + len(big) + 4, 300]
        index = decode_streaming_index(obj.index, "o-index")
        assert read_streaming(obj.data_bytes(), index) == [(2, 0, b"s"), (2, 1, big), (2, 2, b"t")]


def _index_bytes(*, data_length: int = 1000, sections: list[SectionInput] | None = None) -> bytes:
    return encode_streaming_index(
        data_length,
        sections if sections is not None else [
            SectionInput(5, 3, 30, 7, [IndexEntry(0, 1, 0), IndexEntry(2, 2, 300)]),
            SectionInput(8, 2, 20, 7, [IndexEntry(0, 3, 600)]),
        ],
    )


class TestIndexJunk:
    """A damaged streaming index raises FormatError naming the object and the byte offset."""

    def _raises(self, buf: bytes, offset: int, match: str) -> None:
        with pytest.raises(FormatError, match=match) as info:
            decode_streaming_index(buf, "b/x-index")
        assert (info.value.obj, info.value.offset) == ("b/x-index", offset)
        assert f"b/x-index at byte {offset}:" in str(info.value)

    def test_sample_is_valid(self) -> None:
        index = decode_streaming_index(_index_bytes(), "b/x-index")
        assert index.locate(5, 2) == IndexEntry(2, 2, 300)

    def test_bad_magic(self) -> None:
        buf = bytearray(_index_bytes())
        buf[0:4] = b"\xde\x47\xde\x47"
        self._raises(bytes(buf), 0, "bad index magic 0xDE47DE47")

    def test_every_truncation_is_refused(self) -> None:
        buf = _index_bytes()
        for cut in range(len(buf)):
            with pytest.raises(FormatError, match="truncated"):
                decode_streaming_index(buf[:cut], "b/x-index")

    def test_truncated_index_names_the_length_field(self) -> None:
        self._raises(_index_bytes()[:-1], 4, "truncated index")

    def test_trailing_bytes(self) -> None:
        buf = _index_bytes()
        self._raises(buf + b"\0", len(buf), "1 trailing bytes")

    def test_trailing_bytes_inside_the_declared_length(self) -> None:
        buf = bytearray(_index_bytes() + b"\0" * 10)
        struct.pack_into(">i", buf, 4, len(buf))
        self._raises(bytes(buf), len(buf) - 10, "truncated ledger section header")

    def test_offset_past_the_data_object(self) -> None:
        buf = _index_bytes(data_length=600)
        self._raises(buf, len(buf) - 8, "block offset 600 is outside the data object")

    def test_part_id_zero(self) -> None:
        sections = [SectionInput(5, 3, 30, 7, [IndexEntry(0, 0, 0)])]
        buf = _index_bytes(sections=sections)
        self._raises(buf, len(buf) - 12, "part id 0")

    def test_blocks_out_of_entry_order(self) -> None:
        sections = [SectionInput(5, 3, 30, 7, [IndexEntry(2, 1, 0), IndexEntry(1, 2, 300)])]
        buf = _index_bytes(sections=sections)
        self._raises(buf, len(buf) - 20, "not above the previous block's 2")

    def test_entries_not_covering_the_last_block(self) -> None:
        sections = [SectionInput(5, 2, 30, 7, [IndexEntry(0, 1, 0), IndexEntry(2, 2, 300)])]
        buf = _index_bytes(sections=sections)
        self._raises(buf, 24 + 16, "has 2 entries but a block starts at entry 2")

    def test_sections_out_of_ledger_order(self) -> None:
        one = SectionInput(8, 1, 1, 0, [IndexEntry(0, 1, 0)])
        two = SectionInput(5, 1, 1, 0, [IndexEntry(0, 2, 300)])
        buf = _index_bytes(sections=[one, two])
        self._raises(buf, len(buf) - 16 - 8 - 20, "ledger 5 follows ledger 8")  # 8-byte LedgerInfo

    def test_section_without_blocks(self) -> None:
        buf = _index_bytes(sections=[SectionInput(5, 1, 1, 0, [])])
        self._raises(buf, 24 + 8, "lists 0 blocks")

    def test_ledger_info_of_another_ledger(self) -> None:
        buf = bytearray(_index_bytes(sections=[SectionInput(5, 1, 1, 0, [IndexEntry(0, 1, 0)])]))
        struct.pack_into(">q", buf, 24, 6)
        self._raises(bytes(buf), 24 + 16, "LedgerInfo names ledger 5 in the section of ledger 6")

    def test_ledger_info_that_does_not_parse(self) -> None:
        buf = bytearray(_index_bytes(sections=[SectionInput(5, 1, 1, 0, [IndexEntry(0, 1, 0)])]))
        buf[24 + 16] = 0xFF
        self._raises(bytes(buf), 24 + 16, "does not parse")

    def test_ledger_info_without_its_ledger_id(self) -> None:
        info = ManagedLedgerInfo.LedgerInfo(entries=1).SerializePartialToString()
        rows = struct.pack(">qiq", 0, 1, 0)
        body = struct.pack(">qii", 5, 1, len(info)) + info + rows
        header = struct.pack(">Iiqq", 0x3D1FB0BC, 24 + len(body), 1000, 128)
        self._raises(header + body, 24 + 16, "lacks required field ledgerId")

    def test_index_length_shorter_than_its_header(self) -> None:
        buf = bytearray(_index_bytes())
        struct.pack_into(">i", buf, 4, -5)
        self._raises(bytes(buf), 4, "index length -5 is shorter than its header")

    def test_header_length_not_128(self) -> None:
        buf = bytearray(_index_bytes())
        struct.pack_into(">q", buf, 16, 64)
        self._raises(bytes(buf), 16, "header length 64")

    @RELAXED
    @given(st.data())
    def test_mutated_indexes_only_raise_format_errors(self, data: st.DataObject) -> None:
        buf = bytearray(_index_bytes())
        for _ in range(data.draw(st.integers(1, 4))):
            buf[data.draw(st.integers(0, len(buf) - 1))] = data.draw(st.integers(0, 255))
        with contextlib.suppress(FormatError):
            decode_streaming_index(bytes(buf), "o")
