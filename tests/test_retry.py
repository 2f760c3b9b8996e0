"""The one backoff policy: capped exponential ceilings, full jitter below them."""

from __future__ import annotations

import random
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from offloadd.retry import CAS, Backoff, Retry


class TestBackoff:
    """Ceilings double from the base up to the cap; each wait is uniform below its ceiling."""

    def test_ceilings_double_then_stay_at_the_cap(self) -> None:
        b = Backoff(0.5, 30.0)
        assert [b.ceiling(n) for n in range(1, 9)] == [0.5, 1, 2, 4, 8, 16, 30, 30]
        assert b.ceiling(10_000) == 30.0  # no overflow however long a failure lasts

    @given(base=st.floats(0, 10), extra=st.floats(0, 100), attempt=st.integers(1, 200),
           seed=st.integers(0, 2**32))
    def test_every_wait_lies_in_zero_to_its_ceiling(self, base: float, extra: float,
                                                     attempt: int, seed: int) -> None:
        b = Backoff(base, base + extra)
        d = b.delay(attempt, random.Random(seed))
        assert 0.0 <= d <= b.ceiling(attempt) <= b.cap_s

    def test_waits_spread_over_the_whole_window(self) -> None:
        # full jitter: as many waits in the lower half of the window as in the upper half
        rng = random.Random(7)
        waits = [Backoff(1.0, 1.0).delay(1, rng) for _ in range(4000)]
        assert min(waits) < 0.05 and max(waits) > 0.95
        assert 0.45 < statistics.mean(waits) < 0.55
        assert 0.45 < sum(w < 0.5 for w in waits) / len(waits) < 0.55

    @pytest.mark.parametrize(("base", "cap"), [(-1.0, 1.0), (2.0, 1.0), (float("nan"), 1.0)])
    def test_a_nonsensical_policy_is_refused(self, base: float, cap: float) -> None:
        with pytest.raises(ValueError, match="base_s"):
            Backoff(base, cap)

    def test_attempts_count_from_one(self) -> None:
        with pytest.raises(ValueError, match="from 1"):
            Backoff(1, 2).ceiling(0)


class TestRetry:
    """Consecutive failures raise the ceiling; a success starts over."""

    def test_failures_count_and_a_reset_starts_over(self) -> None:
        r = Retry(Backoff(1.0, 100.0), random.Random(1))
        waits = [r.next_delay() for _ in range(5)]
        assert r.attempts == 5
        assert all(0 <= w <= 2 ** i for i, w in enumerate(waits))
        r.reset()
        assert r.attempts == 0 and r.next_delay() <= 1.0

    def test_the_cas_policy_retries_quickly(self) -> None:
        assert CAS.ceiling(1) <= 0.01 and CAS.cap_s <= 0.5
