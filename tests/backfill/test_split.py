"""The history splitter: properties over generated histories, with counted size look-ups.

A history of three ledgers cut at a 100-byte target (frame bytes; '|' = segment boundary)::

    ledger 10: [40][40][40] | [40][40]      ledger 11: [40] | [40][40][40] | ledger 12: [30]
               ^ 120 >= 100 ends segment 1            ^ 120 ends segment 2    last, smaller
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from offloadd.backfill.split import LedgerExtent, Split, split_history
from offloadd.model import Position
from offloadd.model.catalog import LedgerRange

FRAME = 12


@dataclass
class History:
    """Ledgers of payload sizes, with a counting ``size_at`` over them."""

    sizes: dict[int, list[int]]
    calls: int = 0
    asked: list[Position] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._base: dict[int, int] = {}
        self._cum: dict[int, list[int]] = {}
        total = 1000  # any base: the splitter uses differences only
        for lid, ps in self.sizes.items():
            self._base[lid] = total
            cum = [0]
            for p in ps:
                cum.append(cum[-1] + p + FRAME)
            self._cum[lid] = cum
            total += cum[-1]

    @property
    def extents(self) -> list[LedgerExtent]:
        return [LedgerExtent(lid, len(ps)) for lid, ps in self.sizes.items()]

    def size_at(self, pos: Position) -> int:
        self.calls += 1
        self.asked.append(pos)
        cum = self._cum[pos.ledger_id]
        assert 0 <= pos.entry_id < len(cum), f"asked outside the ledger: {pos}"
        return self._base[pos.ledger_id] + cum[pos.entry_id]

    def frame_bytes(self, r: LedgerRange) -> int:
        cum = self._cum[r.ledger_id]
        return cum[r.last + 1] - cum[r.first]

    def positions(self, start: Position | None = None) -> list[Position]:
        out = [Position(lid, e) for lid, ps in self.sizes.items() for e in range(len(ps))]
        return [p for p in out if start is None or p >= start]

    def frame(self, pos: Position) -> int:
        return self.sizes[pos.ledger_id][pos.entry_id] + FRAME


def streaming_reference(h: History, start: Position | None, target: int) -> list[list[Position]]:
    """The streaming roller's rule, one entry at a time: close once the frames reach target."""
    segs: list[list[Position]] = []
    cur: list[Position] = []
    acc = 0
    for pos in h.positions(start):
        cur.append(pos)
        acc += h.frame(pos)
        if acc >= target:
            segs.append(cur)
            cur, acc = [], 0
    if cur:
        segs.append(cur)
    return segs


def covered(splits: list[Split]) -> list[Position]:
    return [Position(r.ledger_id, e) for s in splits for r in s.ranges
            for e in range(r.first, r.last + 1)]


@st.composite
def histories(draw: st.DrawFn, max_payload: int, max_entries: int = 400) -> History:
    n_ledgers = draw(st.integers(1, 8))
    first_id = draw(st.integers(0, 1000))
    sizes: dict[int, list[int]] = {}
    lid = first_id
    for _ in range(n_ledgers):
        lid += draw(st.integers(1, 5))
        count = draw(st.sampled_from([0, 1, 2, draw(st.integers(0, max_entries))]))
        rng = random.Random(draw(st.integers(0, 2**32)))
        shape = draw(st.sampled_from(["uniform", "constant", "bimodal"]))
        if shape == "constant":
            c = rng.randint(0, max_payload)
            sizes[lid] = [c] * count
        elif shape == "bimodal":
            sizes[lid] = [rng.choice((0, max_payload)) for _ in range(count)]
        else:
            sizes[lid] = [rng.randint(0, max_payload) for _ in range(count)]
    return History(sizes)


class TestSplitProperties:
    """Splits are contiguous, complete, sized to the target, and cheap to find."""

    @settings(max_examples=300, deadline=None)
    @given(data=st.data(), target=st.integers(1000, 200_000))
    def test_splits_tile_the_history_within_two_percent_with_logarithmic_lookups(
            self, data: st.DataObject, target: int) -> None:
        # Entries no larger than 2% of the target (frame included): the crossing entry is the
        # only overshoot, so every segment but the last lands in [target, target * 1.02].
        h = data.draw(histories(max_payload=target * 2 // 100 - FRAME))
        everything = h.positions()
        start = data.draw(st.sampled_from([None, *everything[:: max(len(everything) // 7, 1)]]))
        splits = split_history(h.extents, start, target, h.size_at)

        want = h.positions(start)
        got = covered(splits)
        assert got == want  # contiguous, non-overlapping, complete, in log order
        for s in splits:
            assert all(r.count > 0 for r in s.ranges)
            assert s.nbytes == sum(h.frame_bytes(r) for r in s.ranges)
        for s in splits[:-1]:
            assert target <= s.nbytes <= target * 1.02
        if splits:
            assert 0 < splits[-1].nbytes <= target * 1.02

        n = len(everything)
        bound = 2 + len(splits) * max(math.ceil(math.log2(n + 1)), 1)
        assert h.calls <= bound, f"{h.calls} look-ups for {len(splits)} splits of {n} entries"

    @settings(max_examples=300, deadline=None)
    @given(data=st.data(), target=st.integers(1, 400))
    def test_boundaries_are_where_the_streaming_roller_would_close(
            self, data: st.DataObject, target: int) -> None:
        # Any entry sizes here, including entries larger than the whole target.
        h = data.draw(histories(max_payload=300, max_entries=40))
        everything = h.positions()
        start = data.draw(st.sampled_from([None, *everything[:5]]))
        splits = split_history(h.extents, start, target, h.size_at)
        assert [covered([s]) for s in splits] == streaming_reference(h, start, target)


class TestSplitExamples:
    """Hand-made histories: the drawing in the module docstring, and the edges."""

    def test_the_documented_three_ledger_example(self) -> None:
        h = History({10: [28] * 5, 11: [28] * 4, 12: [18]})
        splits = split_history(h.extents, None, 100, h.size_at)
        assert [s.ranges for s in splits] == [
            (LedgerRange(10, 0, 2),),
            (LedgerRange(10, 3, 4), LedgerRange(11, 0, 0)),
            (LedgerRange(11, 1, 3),),
            (LedgerRange(12, 0, 0),),
        ]
        assert [s.nbytes for s in splits] == [120, 120, 120, 30]

    def test_an_entry_larger_than_the_target_is_a_segment_on_its_own(self) -> None:
        h = History({1: [10, 5000, 10]})
        splits = split_history(h.extents, None, 100, h.size_at)
        assert [s.ranges for s in splits] == [(LedgerRange(1, 0, 1),), (LedgerRange(1, 2, 2),)]

    def test_a_start_past_the_end_of_its_ledger_moves_to_the_next_ledger(self) -> None:
        h = History({1: [10, 10], 2: [], 3: [10]})
        splits = split_history(h.extents, Position(1, 2), 1000, h.size_at)
        assert [s.ranges for s in splits] == [(LedgerRange(3, 0, 0),)]

    def test_nothing_left_after_the_start_gives_no_segment_and_no_lookup(self) -> None:
        h = History({1: [10, 10]})
        assert split_history(h.extents, Position(1, 2), 1000, h.size_at) == []
        assert split_history([], None, 1000, h.size_at) == []
        assert h.calls == 0

    def test_lookups_only_ask_for_positions_inside_ledgers_or_at_their_ends(self) -> None:
        h = History({5: [100] * 50, 6: [100] * 7, 9: [1] * 300})
        split_history(h.extents, None, 1000, h.size_at)
        assert all(0 <= p.entry_id <= len(h.sizes[p.ledger_id]) for p in h.asked)

    def test_ledgers_out_of_log_order_are_refused(self) -> None:
        h = History({2: [1], 1: [1]})
        with pytest.raises(ValueError, match="log order"):
            split_history(h.extents, None, 10, h.size_at)

    def test_a_target_below_one_byte_is_refused(self) -> None:
        h = History({1: [1]})
        with pytest.raises(ValueError, match="at least one byte"):
            split_history(h.extents, None, 0, h.size_at)
