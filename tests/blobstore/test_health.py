"""StoreHealth: the error-rate circuit, driven by an injected clock (nothing here sleeps)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from offloadd.blobstore.health import HealthPolicy, HealthState, StoreHealth
from offloadd.errors import ConfigError, Retriable

pytestmark = pytest.mark.timeout(10)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


POLICY = HealthPolicy(window_s=10.0, high=0.5, low=0.2, min_samples=4, probe_interval_s=2.0)


def make(
    policy: HealthPolicy = POLICY,
) -> tuple[StoreHealth, FakeClock, list[tuple[HealthState, HealthState]]]:
    clock = FakeClock()
    changes: list[tuple[HealthState, HealthState]] = []
    health = StoreHealth(policy, clock=clock, on_change=lambda old, new: changes.append((old, new)))
    return health, clock, changes


def trip(health: StoreHealth) -> None:
    for _ in range(POLICY.min_samples):
        health.record_failure()


class TestWatermarks:
    """The circuit opens at the high watermark and closes at the low one, with hysteresis."""

    def test_failures_at_the_high_watermark_pause_the_store(self) -> None:
        health, _, changes = make()
        health.record_success()
        health.record_success()
        health.record_failure()
        assert health.state is HealthState.HEALTHY
        health.record_failure()  # 2 of 4 = 50%
        assert health.snapshot().state is HealthState.PAUSED
        assert changes == [(HealthState.HEALTHY, HealthState.PAUSED)]

    def test_too_few_samples_never_trip_the_circuit(self) -> None:
        health, _, _ = make()
        for _ in range(POLICY.min_samples - 1):
            health.record_failure()
        assert health.state is HealthState.HEALTHY

    def test_a_rate_below_the_high_watermark_keeps_the_store_healthy(self) -> None:
        health, _, _ = make()
        for i in range(40):
            (health.record_failure if i % 3 == 2 else health.record_success)()  # <= 33%
        assert health.state is HealthState.HEALTHY
        assert 0.3 < health.error_rate < 0.4

    def test_old_failures_leave_the_window(self) -> None:
        health, clock, _ = make()
        for _ in range(3):
            health.record_failure()
        clock.now += POLICY.window_s + 1
        health.record_failure()
        assert health.state is HealthState.HEALTHY
        assert health.snapshot().samples == 1

    def test_recovering_closes_only_at_the_low_watermark(self) -> None:
        health, _, changes = make()
        trip(health)
        health.record_probe(True)
        assert health.state is HealthState.RECOVERING
        for outcome in (True, False, True):  # with the probe: 25%, between the watermarks
            (health.record_success if outcome else health.record_failure)()
        assert health.state is HealthState.RECOVERING
        health.record_success()  # 20%
        assert health.snapshot().state is HealthState.HEALTHY
        assert changes == [
            (HealthState.HEALTHY, HealthState.PAUSED),
            (HealthState.PAUSED, HealthState.RECOVERING),
            (HealthState.RECOVERING, HealthState.HEALTHY),
        ]

    def test_failures_while_recovering_pause_again(self) -> None:
        health, _, _ = make()
        trip(health)
        health.record_probe(True)
        trip(health)
        assert health.state is HealthState.PAUSED

    def test_requests_finishing_while_paused_do_not_close_the_circuit(self) -> None:
        health, _, _ = make()
        trip(health)
        for _ in range(20):
            health.record_success()
        assert health.state is HealthState.PAUSED

    def test_a_failed_probe_keeps_the_circuit_open(self) -> None:
        health, _, _ = make()
        trip(health)
        health.record_probe(False)
        assert health.state is HealthState.PAUSED

    def test_memory_is_bounded_by_max_samples(self) -> None:
        policy = HealthPolicy(window_s=1e9, min_samples=2, max_samples=8, high=0.9, low=0.1)
        health, _, _ = make(policy)
        for _ in range(100):
            health.record_failure()
            health.record_success()
        snap = health.snapshot()
        assert snap.samples == 8
        assert snap.error_rate == pytest.approx(0.5)

    def test_a_failing_on_change_hook_does_not_break_recording(self) -> None:
        def hook(old: HealthState, new: HealthState) -> None:
            raise RuntimeError("metrics down")

        health = StoreHealth(POLICY, clock=FakeClock(), on_change=hook)
        trip(health)
        assert health.state is HealthState.PAUSED

    @pytest.mark.parametrize(
        "kwargs",
        [{"high": 0.2, "low": 0.3}, {"high": 1.5}, {"window_s": 0}, {"min_samples": 0}],
    )
    def test_inconsistent_policies_are_refused(self, kwargs: dict[str, float]) -> None:
        with pytest.raises(ConfigError):
            HealthPolicy(**kwargs)  # type: ignore[arg-type]


class TestWaiting:
    """Writers wait while the circuit is open and are released when it lets writes through."""

    async def test_waiting_returns_at_once_when_healthy(self) -> None:
        health, _, _ = make()
        await health.wait_until_healthy(0)

    async def test_waiting_while_paused_times_out_as_retriable(self) -> None:
        health, _, _ = make()
        trip(health)
        with pytest.raises(Retriable, match="paused"):
            await health.wait_until_healthy(0)

    async def test_a_successful_probe_releases_waiting_writers(self) -> None:
        health, _, _ = make()
        trip(health)
        waiters = [asyncio.create_task(health.wait_until_healthy(30)) for _ in range(3)]
        await asyncio.sleep(0)
        assert not any(w.done() for w in waiters)
        health.record_probe(True)
        await asyncio.wait_for(asyncio.gather(*waiters), 5)


class TestProber:
    """The prober probes only while the store is unhealthy, once per interval."""

    async def test_probes_every_interval_until_the_store_answers(self) -> None:
        health, clock, _ = make()
        probes: list[float] = []
        answers = iter([False, False, True, True, True, True])

        async def probe() -> None:
            probes.append(clock.now)
            if not next(answers):
                raise OSError("connection refused")

        tripped_at = clock.now
        trip(health)
        task = asyncio.create_task(health.run_prober(probe, sleep=clock.sleep))
        try:
            for _ in range(200):
                if health.state is HealthState.HEALTHY:
                    break
                await asyncio.sleep(0)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert health.state is HealthState.HEALTHY
        interval = POLICY.probe_interval_s
        assert probes == [tripped_at + interval * i for i in range(1, 7)]

    async def test_no_probes_while_healthy(self) -> None:
        health, clock, _ = make()
        calls = 0

        async def probe() -> None:
            nonlocal calls
            calls += 1

        task = asyncio.create_task(health.run_prober(probe, sleep=clock.sleep))
        for _ in range(20):
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert calls == 0


STALL = HealthPolicy(window_s=10.0, high=0.5, low=0.2, min_samples=4, probe_interval_s=2.0,
                     stall_after_s=3.0)


async def spin_until(cond: Callable[[], bool], rounds: int = 500) -> None:
    for _ in range(rounds):
        if cond():
            return
        await asyncio.sleep(0)


class TestStallWatchdog:
    """A store that stops answering trips the circuit although no request has failed yet."""

    async def test_silence_with_a_request_waiting_and_an_unanswered_probe_trips(self) -> None:
        health, clock, changes = make(STALL)
        probes: list[float] = []

        async def probe() -> None:
            probes.append(clock.now)
            raise TimeoutError("no answer")

        start = clock.now
        health.request_started()  # ...and never finishes: the store is frozen
        task = asyncio.create_task(health.run_prober(probe, sleep=clock.sleep))
        try:
            await spin_until(lambda: health.state is HealthState.PAUSED)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert changes == [(HealthState.HEALTHY, HealthState.PAUSED)]
        # the first probe went out once the request had waited stall_after_s in silence
        assert STALL.stall_after_s is not None
        assert probes and probes[0] == start + STALL.stall_after_s
        ok, why = health.readiness()
        assert not ok and "degraded-paused" in why

    async def test_a_slow_request_on_a_store_that_answers_probes_does_not_trip(self) -> None:
        health, clock, changes = make(STALL)
        probes = 0

        async def probe() -> None:
            nonlocal probes
            probes += 1

        health.request_started()  # a big upload that takes its time
        task = asyncio.create_task(health.run_prober(probe, sleep=clock.sleep))
        try:
            await spin_until(lambda: probes >= 3)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert probes >= 3 and changes == []
        assert health.state is HealthState.HEALTHY and health.readiness()[0]

    async def test_answers_keep_the_watchdog_quiet(self) -> None:
        health, clock, _ = make(STALL)
        probes = 0

        async def probe() -> None:
            nonlocal probes
            probes += 1

        async def tick(seconds: float) -> None:  # time moves only as the loop below says
            await asyncio.sleep(0)

        health.request_started()
        task = asyncio.create_task(health.run_prober(probe, sleep=tick))
        try:
            for i in range(20):  # something answers every second: never silent for 3 s
                clock.now += 1.0
                for _ in range(5):
                    await asyncio.sleep(0)  # the watchdog looks before the next answer
                if i % 4 == 0:
                    health.record_failure(answered=True)  # a 503 SlowDown is an answer too
                else:
                    health.record_success()
                await asyncio.sleep(0)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert probes == 0 and health.state is HealthState.HEALTHY

    async def test_no_request_waiting_means_no_watchdog_probe(self) -> None:
        health, clock, _ = make(STALL)
        calls = 0

        async def probe() -> None:
            nonlocal calls
            calls += 1

        t = health.request_started()
        health.request_finished(t)
        clock.now += 100
        task = asyncio.create_task(health.run_prober(probe, sleep=clock.sleep))
        for _ in range(50):
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert calls == 0 and health.waiting == 0

    def test_unanswered_failures_count_like_any_failure(self) -> None:
        health, _, _ = make(STALL)
        for _ in range(STALL.min_samples):
            health.record_failure()  # missed deadlines
        assert health.state is HealthState.PAUSED


class TestRefusals:
    """A refusal that needs an operator makes the store not ready until that operation works."""

    def test_a_refusal_is_not_a_circuit_failure_but_makes_the_store_not_ready(self) -> None:
        health, _, changes = make()
        for _ in range(10):
            health.record_refused("PutObject", "S3 PutObject s3://b/k: NoSuchBucket (HTTP 404)")
        assert health.state is HealthState.HEALTHY and changes == []
        ok, why = health.readiness()
        assert not ok and "refuses PutObject" in why and "NoSuchBucket" in why

    def test_success_of_another_operation_does_not_clear_it(self) -> None:
        health, _, _ = make()
        health.record_refused("PutObject", "AccessDenied")
        health.record_success("HeadObject")
        health.record_success()
        assert not health.readiness()[0]

    def test_success_of_the_refused_operation_clears_it(self) -> None:
        health, _, _ = make()
        health.record_refused("PutObject", "AccessDenied")
        health.record_refused("UploadPart", "AccessDenied")
        health.record_success("PutObject")
        assert health.refusal() is not None and health.refusal()[0] == "UploadPart"  # type: ignore[index]
        health.record_success("UploadPart")
        assert health.readiness() == (True, "blob store circuit is healthy")
