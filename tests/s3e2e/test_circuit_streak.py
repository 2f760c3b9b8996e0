"""The store-health circuit trips on a streak of failures even when the window's error rate is
still low: a busy store that goes down outright is paused within ``min_samples`` requests."""

from __future__ import annotations

from offloadd.blobstore.health import HealthPolicy, HealthState, StoreHealth

POLICY = HealthPolicy(window_s=30.0, high=0.5, low=0.1, min_samples=10)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_streak_of_failures_after_many_successes_pauses_the_store() -> None:
    health = StoreHealth(POLICY, clock=Clock())
    for _ in range(100):
        health.record_success()
    for _ in range(POLICY.min_samples - 1):
        health.record_failure()
    assert health.state is HealthState.HEALTHY  # 9 of 109: far under the high watermark
    health.record_failure()
    snap = health.snapshot()  # (not .state again: mypy keeps the narrowing from above)
    assert snap.state is HealthState.PAUSED and snap.error_rate < POLICY.high


def test_a_success_inside_the_streak_starts_it_again() -> None:
    health = StoreHealth(POLICY, clock=Clock())
    for _ in range(100):
        health.record_success()
    for _ in range(3):
        for _ in range(POLICY.min_samples - 1):
            health.record_failure()
        health.record_success()
    assert health.state is HealthState.HEALTHY


def test_failures_older_than_the_window_do_not_count_in_the_streak() -> None:
    clock = Clock()
    health = StoreHealth(POLICY, clock=clock)
    for _ in range(POLICY.min_samples - 1):
        health.record_failure()
    clock.now += POLICY.window_s + 1
    health.record_failure()
    assert health.state is HealthState.HEALTHY
