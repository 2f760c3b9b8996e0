"""The broker-wide byte-rate throttle: accuracy, burst, debt, fairness, reload, cancellation.

Every test but the last runs on a fake clock: the throttle's ``sleep`` registers a deadline and
``FakeTime.run_until`` jumps from deadline to deadline, so nothing really sleeps and every
number below is exact arithmetic, not a timing measurement.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections import defaultdict
from collections.abc import Iterable

import pytest

from offloadd.offload.throttle import Throttle

# pytest-timeout's default (signal) method cannot interrupt an idle uvloop, so every await here
# that depends on the throttle finishing something is bounded with a real timeout instead.


class FakeTime:
    """A virtual clock; sleepers wake when :meth:`run_until` moves time past their deadline."""

    def __init__(self) -> None:
        self.now = 0.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self.sleeps = 0

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.now + max(seconds, 0.0), next(self._seq), fut))
        await fut

    @staticmethod
    async def settle() -> None:
        # Enough loop turns for a grant to hand over to the next waiter and for that waiter to
        # start its own sleep; deterministic, so a shortfall would fail every run alike.
        for _ in range(50):
            await asyncio.sleep(0)

    async def run_until(self, t: float) -> None:
        while True:
            await self.settle()
            while self._sleepers and self._sleepers[0][2].done():
                heapq.heappop(self._sleepers)
            if not self._sleepers or self._sleepers[0][0] > t:
                self.now = max(self.now, t)
                await self.settle()
                return
            deadline, _, fut = heapq.heappop(self._sleepers)
            self.now = max(self.now, deadline)
            fut.set_result(None)


Grant = tuple[float, str, int]  # (time granted, topic, bytes)


async def at_once(throttle: Throttle, nbytes: int, topic: str) -> float:
    """An acquire expected to return without fake time passing; a real bound instead of a hang."""
    return await asyncio.wait_for(throttle.acquire(nbytes, topic), timeout=5)


def make(
    rate: float, burst: float | None = None, *, fair: bool = True
) -> tuple[Throttle, FakeTime]:
    ft = FakeTime()
    return Throttle(rate, burst, fair=fair, clock=ft.clock, sleep=ft.sleep), ft


async def pump(
    throttle: Throttle, topic: str, nbytes: int, grants: list[Grant], ft: FakeTime
) -> None:
    """One in-flight request stream: acquire, record, acquire again, forever."""
    while True:
        await throttle.acquire(nbytes, topic)
        grants.append((ft.now, topic, nbytes))


def start(
    throttle: Throttle, ft: FakeTime, streams: Iterable[tuple[str, int]], grants: list[Grant]
) -> list[asyncio.Task[None]]:
    return [asyncio.create_task(pump(throttle, t, n, grants, ft)) for t, n in streams]


async def stop(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=5)


def bytes_between(grants: list[Grant], t0: float, t1: float) -> int:
    return sum(n for t, _, n in grants if t0 <= t < t1)


def max_window(grants: list[Grant], width: float = 1.0) -> int:
    """Most bytes granted in any window [t, t + width) that starts at a grant."""
    times = sorted((t, n) for t, _, n in grants)
    best = total = lo = 0
    for hi in range(len(times)):
        total += times[hi][1]
        while times[hi][0] >= times[lo][0] + width:
            total -= times[lo][1]
            lo += 1
        best = max(best, total)
    return best


def shares(grants: list[Grant], t0: float, t1: float) -> dict[str, float]:
    per: dict[str, int] = defaultdict(int)
    for t, topic, n in grants:
        if t0 <= t < t1:
            per[topic] += n
    total = sum(per.values())
    return {topic: n / total for topic, n in per.items()}


class TestUnlimited:
    """Rate 0 means no limit: acquire returns at once and never sleeps."""

    async def test_zero_rate_never_waits(self) -> None:
        throttle, ft = make(0)
        waits = [await at_once(throttle, 64 << 20, "t") for _ in range(100)]
        assert waits == [0.0] * 100
        assert ft.sleeps == 0

    async def test_zero_bytes_never_wait(self) -> None:
        throttle, ft = make(1000)
        assert await at_once(throttle, 0, "t") == 0.0
        assert ft.sleeps == 0

    async def test_rejects_bad_arguments(self) -> None:
        with pytest.raises(ValueError, match="rate"):
            Throttle(-1)
        with pytest.raises(ValueError, match="burst"):
            Throttle(10, 0)
        throttle, _ = make(10)
        with pytest.raises(ValueError, match="negative"):
            await at_once(throttle, -5, "t")


class TestAccuracy:
    """Under sustained demand the granted rate matches the limit and no second runs hot."""

    async def test_long_run_rate_within_two_percent(self) -> None:
        rate = 1_000_000
        throttle, ft = make(rate)
        grants: list[Grant] = []
        streams = [("a", 65536), ("a", 65536), ("b", 100_000), ("c", 4096), ("c", 4096)]
        tasks = start(throttle, ft, streams, grants)
        await ft.run_until(60.0)
        await stop(tasks)
        achieved = bytes_between(grants, 0.0, 60.0) / 60.0
        assert abs(achieved / rate - 1) <= 0.02
        assert max_window(grants) <= 1.25 * rate

    async def test_empty_bucket_at_start_keeps_first_second_under_limit(self) -> None:
        throttle, ft = make(1000)
        grants: list[Grant] = []
        tasks = start(throttle, ft, [("a", 100)] * 4, grants)
        await ft.run_until(1.0)
        await stop(tasks)
        assert 0 < bytes_between(grants, 0.0, 1.0) <= 1000

    async def test_grants_are_spaced_by_size_over_rate(self) -> None:
        throttle, ft = make(1000)
        grants: list[Grant] = []
        tasks = start(throttle, ft, [("a", 250)], grants)
        await ft.run_until(2.0)
        await stop(tasks)
        assert [t for t, _, _ in grants] == pytest.approx(
            [0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0]
        )


class TestBurst:
    """An idle throttle saves up at most ``burst`` bytes; default burst is one second."""

    async def test_saved_burst_passes_without_waiting_then_limit_applies(self) -> None:
        throttle, ft = make(1000, 4000)
        await ft.run_until(10.0)  # idle long enough to save 10 000, capped at 4 000
        waits = [await at_once(throttle, 1000, "t") for _ in range(4)]
        assert waits == [0.0] * 4
        fifth = asyncio.create_task(throttle.acquire(1000, "t"))
        await ft.run_until(20.0)
        assert fifth.result() == pytest.approx(1.0)

    async def test_default_burst_is_one_second_of_permits(self) -> None:
        throttle, ft = make(5000)
        assert throttle.burst == 5000
        await ft.run_until(30.0)
        assert await at_once(throttle, 5000, "t") == 0.0
        later = asyncio.create_task(throttle.acquire(1, "t"))
        await ft.run_until(31.0)
        assert later.done()
        assert later.result() > 0


class TestDebt:
    """Requests larger than the burst go through and are paid back by the ones after them."""

    async def test_oversized_request_goes_into_debt(self) -> None:
        throttle, ft = make(1000, 1000)
        await ft.run_until(1.0)  # bucket full: 1000
        assert await at_once(throttle, 5000, "t") == 0.0  # bucket now at -4000
        nxt = asyncio.create_task(throttle.acquire(500, "t"))
        await ft.run_until(10.0)
        assert nxt.result() == pytest.approx(4.5)

    async def test_oversized_requests_keep_exact_long_run_rate(self) -> None:
        throttle, ft = make(1000, 1000)
        grants: list[Grant] = []
        tasks = start(throttle, ft, [("big", 5000)], grants)
        await ft.run_until(101.0)
        await stop(tasks)
        # first grant at t=1 (bucket reaches the burst), then one every 5 s
        assert [t for t, _, _ in grants] == pytest.approx([1.0 + 5 * k for k in range(21)])

    async def test_oversized_request_is_not_starved_by_small_ones(self) -> None:
        throttle, ft = make(1000, 1000)
        grants: list[Grant] = []
        tasks = start(throttle, ft, [("small", 100)] * 5, grants)
        await ft.run_until(5.0)
        big = asyncio.create_task(throttle.acquire(10_000, "big"))
        await ft.run_until(8.0)
        assert big.done()
        await stop(tasks)


class TestFairness:
    """Topics that all want more than the budget each get an equal share of the bytes."""

    async def test_topic_with_many_requests_does_not_dominate(self) -> None:
        throttle, ft = make(10_000)
        grants: list[Grant] = []
        streams = [("many", 1000)] * 8 + [("one", 1000), ("other", 1000)]
        tasks = start(throttle, ft, streams, grants)
        await ft.run_until(100.0)
        await stop(tasks)
        share = shares(grants, 0.0, 100.0)
        assert set(share) == {"many", "one", "other"}
        assert all(s >= 0.25 for s in share.values()), share

    async def test_plain_fifo_lets_the_busy_topic_dominate(self) -> None:
        # Why fairness is on by default: the same load with one global FIFO.
        throttle, ft = make(10_000, fair=False)
        grants: list[Grant] = []
        streams = [("many", 1000)] * 8 + [("one", 1000), ("other", 1000)]
        tasks = start(throttle, ft, streams, grants)
        await ft.run_until(100.0)
        await stop(tasks)
        share = shares(grants, 0.0, 100.0)
        assert share["many"] >= 0.7
        assert share["one"] < 0.25

    async def test_shares_are_in_bytes_not_requests(self) -> None:
        throttle, ft = make(10_000)
        grants: list[Grant] = []
        tasks = start(throttle, ft, [("big", 8000), ("small", 500), ("small", 500)], grants)
        await ft.run_until(100.0)
        await stop(tasks)
        share = shares(grants, 0.0, 100.0)
        assert share["big"] == pytest.approx(0.5, abs=0.05)
        assert share["small"] == pytest.approx(0.5, abs=0.05)

    async def test_topic_returning_from_idle_gets_a_share_not_a_backlog(self) -> None:
        # 'early' runs alone for 50 s; 'late' then arrives. A scheduler that favoured whoever
        # had been served least would hand 'late' the whole budget for ~50 s.
        throttle, ft = make(10_000)
        grants: list[Grant] = []
        tasks = start(throttle, ft, [("early", 1000)] * 2, grants)
        await ft.run_until(50.0)
        tasks += start(throttle, ft, [("late", 1000)] * 2, grants)
        await ft.run_until(70.0)
        await stop(tasks)
        share = shares(grants, 50.5, 70.0)
        assert share["early"] == pytest.approx(0.5, abs=0.05)
        assert share["late"] == pytest.approx(0.5, abs=0.05)

    async def test_requests_of_one_topic_are_served_in_arrival_order(self) -> None:
        throttle, ft = make(1000)
        order: list[int] = []

        async def one(i: int) -> None:
            await throttle.acquire(100 * (5 - i), "t")  # sizes differ; order must not
            order.append(i)

        tasks = [asyncio.create_task(one(i)) for i in range(5)]
        await ft.run_until(10.0)
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=5)
        assert order == [0, 1, 2, 3, 4]


class TestSetRate:
    """A reload changes the budget at once and keeps every queued waiter."""

    async def test_raising_the_rate_wakes_the_current_waiter_early(self) -> None:
        throttle, ft = make(100, 1000)
        waiting = asyncio.create_task(throttle.acquire(1000, "t"))  # 10 s at 100 B/s
        await ft.run_until(1.0)
        throttle.set_rate(1000, 1000)  # 100 saved at the old rate; 900 more at 1000 B/s
        await ft.run_until(5.0)
        assert waiting.result() == pytest.approx(1.9)

    async def test_lowering_the_rate_applies_to_the_next_period(self) -> None:
        throttle, ft = make(10_000)
        grants: list[Grant] = []
        tasks = start(throttle, ft, [("a", 500), ("b", 500), ("b", 500)], grants)
        await ft.run_until(10.0)
        throttle.set_rate(2000)
        await ft.run_until(30.0)
        await stop(tasks)
        assert bytes_between(grants, 10.0, 30.0) / 20.0 == pytest.approx(2000, rel=0.02)
        assert throttle.rate == 2000
        assert throttle.burst == 2000

    async def test_switching_to_unlimited_releases_every_waiter(self) -> None:
        throttle, ft = make(10)
        tasks = [asyncio.create_task(throttle.acquire(1000, f"t{i % 3}")) for i in range(6)]
        await ft.run_until(0.5)
        assert throttle.waiting == 6
        throttle.set_rate(0)
        await ft.settle()
        assert all(t.done() for t in tasks)
        assert throttle.waiting == 0
        assert ft.now == 0.5

    async def test_switching_from_unlimited_starts_limiting(self) -> None:
        throttle, ft = make(0)
        assert await at_once(throttle, 10_000, "t") == 0.0
        throttle.set_rate(1000)
        task = asyncio.create_task(throttle.acquire(500, "t"))
        await ft.run_until(5.0)
        assert task.result() == pytest.approx(0.5)

    async def test_waiters_queued_across_a_reload_are_all_granted(self) -> None:
        throttle, ft = make(100)
        tasks = [asyncio.create_task(throttle.acquire(100, f"t{i % 2}")) for i in range(10)]
        await ft.run_until(2.5)
        throttle.set_rate(50)
        await ft.run_until(10.0)
        throttle.set_rate(1000)
        await ft.run_until(20.0)
        assert all(t.done() and not t.cancelled() for t in tasks)


class TestCancellation:
    """A cancelled waiter leaves the queue and takes no tokens."""

    async def test_cancelled_head_leaves_its_tokens_to_the_next(self) -> None:
        throttle, ft = make(1000, 1000)
        head = asyncio.create_task(throttle.acquire(1000, "a"))
        nxt = asyncio.create_task(throttle.acquire(500, "b"))
        await ft.run_until(0.5)
        head.cancel()
        await ft.run_until(5.0)
        assert head.cancelled()
        assert nxt.result() == pytest.approx(0.5)  # 500 saved while 'a' waited; not consumed
        assert throttle.waiting == 0

    async def test_cancelled_queued_waiter_is_skipped(self) -> None:
        throttle, ft = make(1000)
        order: list[str] = []

        async def one(name: str) -> None:
            await throttle.acquire(1000, "t")
            order.append(name)

        tasks = {n: asyncio.create_task(one(n)) for n in "abc"}
        await ft.settle()
        assert throttle.waiting == 3
        tasks["b"].cancel()
        await ft.run_until(10.0)
        assert order == ["a", "c"]
        assert ft.now == 10.0
        # 'c' went at t=2: 'b' consumed nothing
        assert tasks["b"].cancelled()

    async def test_cancelling_everything_leaves_a_clean_throttle(self) -> None:
        throttle, ft = make(100)
        tasks = [asyncio.create_task(throttle.acquire(1000, f"t{i}")) for i in range(5)]
        await ft.run_until(0.5)
        for task in tasks:
            task.cancel()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=5)
        assert throttle.waiting == 0
        # the 50 bytes saved during the half second are still there for the next caller
        assert await at_once(throttle, 50, "fresh") == 0.0


@pytest.mark.timeout(15)
async def test_real_clock_rate_is_roughly_the_limit() -> None:
    """The default clock and sleep work; bounds are generous (shared CI cores)."""
    rate = 2_000_000
    throttle = Throttle(rate)
    grants: list[tuple[float, int]] = []

    async def run(topic: str, nbytes: int) -> None:
        while True:
            await throttle.acquire(nbytes, topic)
            grants.append((time.monotonic(), nbytes))

    tasks = [asyncio.create_task(run(t, 65536)) for t in ("a", "a", "b", "c")]
    await asyncio.sleep(2.0)
    for task in tasks:
        task.cancel()
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=5)
    assert len(grants) > 10
    span = grants[-1][0] - grants[0][0]
    achieved = sum(n for _, n in grants[1:]) / span
    assert 0.8 * rate <= achieved <= 1.2 * rate
