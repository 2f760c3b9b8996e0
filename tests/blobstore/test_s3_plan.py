"""The S3 retry plan, on numbers: when an operation tries again, after how long, and why not."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from offloadd.blobstore.s3.plan import GiveUp, RetryPlan
from offloadd.retry import Backoff


def plan(deadline: float = 100.0, attempts: int = 3, pause: float = 10.0) -> RetryPlan:
    return RetryPlan(deadline, attempts, pause, Backoff(0.1, 1.0), random.Random(7))


def test_healthy_failures_use_up_max_attempts() -> None:
    p = plan(attempts=3)
    assert isinstance(p.after_failure(0.0, degraded=False), float)
    assert isinstance(p.after_failure(1.0, degraded=False), float)
    assert p.after_failure(2.0, degraded=False) is GiveUp.ATTEMPTS
    assert p.attempts == 3


def test_degraded_failures_do_not_count_but_the_pause_timeout_ends_them() -> None:
    p = plan(attempts=2, pause=10.0)
    for now in (0.0, 3.0, 9.9):
        assert isinstance(p.after_failure(now, degraded=True), float)
    assert p.attempts == 0
    assert p.after_failure(10.0, degraded=True) is GiveUp.DEGRADED


class _Longest(random.Random):
    """Jitter that always waits the ceiling: the worst case for the deadline."""

    def uniform(self, a: float, b: float) -> float:
        return b


def test_a_wait_past_the_deadline_gives_up_now() -> None:
    p = RetryPlan(5.0, 10, 10.0, Backoff(1.0, 1.0), _Longest())
    assert p.after_failure(3.0, degraded=False) == 1.0
    assert p.after_failure(4.5, degraded=False) is GiveUp.DEADLINE


def test_pause_limit_starts_once_and_never_passes_the_deadline() -> None:
    p = plan(deadline=20.0, pause=10.0)
    assert p.pause_limit(2.0) == 10.0
    assert p.pause_limit(5.0) == 7.0  # the same pause window, not a new one
    q = plan(deadline=6.0, pause=10.0)
    assert q.pause_limit(1.0) == 5.0


@given(st.lists(st.tuples(st.floats(0, 0.5), st.booleans()), min_size=1, max_size=40),
       st.integers(1, 6))
def test_waits_stay_inside_the_backoff_and_the_deadline(steps: list[tuple[float, bool]],
                                                        max_attempts: int) -> None:
    p = plan(deadline=5.0, attempts=max_attempts, pause=2.0)
    now = 0.0
    for dt, degraded in steps:
        now += dt
        verdict = p.after_failure(now, degraded=degraded)
        if isinstance(verdict, GiveUp):
            if verdict is GiveUp.ATTEMPTS:
                assert p.attempts == max_attempts
            if verdict is GiveUp.DEADLINE:
                assert now + p.backoff.ceiling(max(p.attempts, 1)) >= 5.0
            return
        assert 0.0 <= verdict <= p.backoff.ceiling(max(p.attempts, 1))
        assert now + verdict < 5.0
        assert p.attempts < max_attempts
