"""Block planning: greedy cuts by bisection, block lengths for both formats.

A run of frames, offsets 0 = o0 < o1 < ... < on, is cut into blocks::

    block k = [128-byte header][frames i..j-1][padding >= 4]   with 128 + (oj - oi) + 4 <= max
"""

from __future__ import annotations

from itertools import accumulate
from typing import Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from offloadd.format import HEADER_LEN, MIN_PADDING, BlockPlan, plan_blocks
from tests.format._support import RELAXED


def _offsets(payload_sizes: list[int]) -> list[int]:
    return list(accumulate((12 + s for s in payload_sizes), initial=0))


def _reference(
    offsets: list[int], max_block: int, min_block: int, pad_to: Literal["min", "max"]
) -> list[tuple[int, int, int]]:
    """The rules written entry by entry: (first index, end index, block length) per block."""
    out = []
    i, n = 0, len(offsets) - 1
    while i < n:
        j = i + 1
        while j < n and HEADER_LEN + offsets[j + 1] - offsets[i] + MIN_PADDING <= max_block:
            j += 1
        payload = offsets[j] - offsets[i]
        if pad_to == "min":
            length = max(min_block, HEADER_LEN + payload + MIN_PADDING)
        elif j == n:
            length = HEADER_LEN + payload
        else:
            length = max(max_block, HEADER_LEN + payload + MIN_PADDING)
        out.append((i, j, length))
        i = j
    return out


class TestPlanBlocks:
    """plan_blocks matches the rules, entry for entry."""

    @RELAXED
    @given(
        st.lists(st.one_of(st.just(0), st.integers(0, 600)), max_size=60),
        st.integers(144, 1000),
        st.data(),
        st.sampled_from(["min", "max"]),
    )
    def test_matches_the_entry_by_entry_reference(
        self, sizes: list[int], max_block: int, data: st.DataObject, pad_to: Literal["min", "max"]
    ) -> None:
        min_block = data.draw(st.integers(0, max_block))
        offsets = _offsets(sizes)
        plans = plan_blocks(
            offsets, 40, 3, max_block_size=max_block, min_block_size=min_block, pad_to=pad_to
        )
        got = [(p.first_entry_id - 40, p.last_entry_id - 40 + 1, p.block_len) for p in plans]
        assert got == _reference(offsets, max_block, min_block, pad_to)
        for p in plans:
            assert p.ledger_id == 3
            first, end = p.first_entry_id - 40, p.last_entry_id - 40 + 1
            assert (p.start, p.end) == (offsets[first], offsets[end])

    def test_empty_run_plans_nothing(self) -> None:
        assert plan_blocks([0], 0, 1, max_block_size=300, pad_to="min") == []

    def test_entries_exactly_filling_a_block(self) -> None:
        # 128 + (12 + 156) + 4 == 300: each entry fills a block to the byte.
        plans = plan_blocks(_offsets([156, 156]), 0, 1, max_block_size=300, pad_to="min")
        assert [(p.first_entry_id, p.block_len, p.padding_len) for p in plans] == [
            (0, 300, 4), (1, 300, 4),
        ]

    def test_one_byte_more_than_fits_starts_a_new_block(self) -> None:
        # Room for frames: 300 - 128 - 4 = 168 = (12 + 70) + (12 + 74).
        plans = plan_blocks(_offsets([70, 74]), 0, 1, max_block_size=300, pad_to="min")
        assert [p.entry_count for p in plans] == [2]
        plans = plan_blocks(_offsets([70, 75]), 0, 1, max_block_size=300, pad_to="min")
        assert [p.entry_count for p in plans] == [1, 1]

    def test_oversize_entry_grows_its_own_block(self) -> None:
        plans = plan_blocks(_offsets([10, 1000, 10]), 0, 1, max_block_size=300, pad_to="min")
        assert [(p.first_entry_id, p.last_entry_id, p.block_len) for p in plans] == [
            (0, 0, 154), (1, 1, 128 + 1012 + 4), (2, 2, 154),
        ]

    def test_ledger_based_pads_full_blocks_to_max_and_sizes_the_last_exactly(self) -> None:
        plans = plan_blocks(_offsets([100] * 5), 0, 1, max_block_size=400, pad_to="max")
        assert [(p.entry_count, p.block_len) for p in plans] == [(2, 400), (2, 400), (1, 240)]
        assert plans[-1].padding_len == 0

    def test_ledger_based_grown_block_keeps_its_length(self) -> None:
        plans = plan_blocks(_offsets([1000, 1000]), 0, 1, max_block_size=400, pad_to="max")
        assert [p.block_len for p in plans] == [128 + 1012 + 4, 128 + 1012]

    def test_streaming_pads_up_to_min_block_size(self) -> None:
        plans = plan_blocks(
            _offsets([7] * 5), 0, 7, max_block_size=300, min_block_size=300, pad_to="min"
        )
        assert plans == [BlockPlan(7, 0, 4, 0, 95, 300)]

    def test_max_entries_caps_a_block(self) -> None:
        plans = plan_blocks(
            _offsets([1] * 7), 0, 1, max_block_size=10_000, pad_to="min", max_entries=3
        )
        assert [p.entry_count for p in plans] == [3, 3, 1]

    def test_offsets_not_starting_at_zero(self) -> None:
        offsets = [x + 1000 for x in _offsets([10, 10, 10])]
        plans = plan_blocks(offsets, 0, 1, max_block_size=128 + 44 + 4, pad_to="min")
        assert [(p.start, p.end) for p in plans] == [(1000, 1044), (1044, 1066)]

    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [
            ({"max_block_size": 143, "pad_to": "min"}, "below 144"),
            ({"max_block_size": 300, "min_block_size": 301, "pad_to": "min"}, "exceeds"),
            ({"max_block_size": 300, "pad_to": "both"}, "pad_to"),
            ({"max_block_size": 300, "pad_to": "min", "max_entries": 0}, "max_entries"),
        ],
    )
    def test_bad_settings_are_refused(self, kwargs: dict[str, object], match: str) -> None:
        with pytest.raises(ValueError, match=match):
            plan_blocks(_offsets([1]), 0, 1, **kwargs)  # type: ignore[arg-type]
