"""The broker-wide offload byte-rate throttle (PIP-211).

One :class:`Throttle` is shared by every topic task in the process. Before a part of a data
object leaves for the store, its upload calls ``await throttle.acquire(nbytes, topic)``
(``offload/upload.py``; reads from the source are bounded by the offload buffer instead); the
call returns when the part may go, with the seconds it waited (for the ``throttle_wait``
probe).

Budget: a token bucket
----------------------
``rate`` bytes per second flow into a bucket that holds at most ``burst`` bytes (default: one
second of permits). A fresh throttle starts with an empty bucket, so the first second after
start never exceeds the limit. A request for ``n`` bytes is granted once the bucket holds
``min(n, burst)``; it then takes all ``n``, and the bucket may go negative (debt). A request
larger than the burst is therefore neither refused nor starved, and its excess is paid back by
the requests after it, so the long-run rate stays exact. Under sustained demand a one-second
window carries at most ``rate + largest request`` bytes; after an idle spell up to ``burst``
more can pass at once (that is what the burst is for). ``rate == 0`` means unlimited.

Order: per-topic FIFO, byte-fair across topics
----------------------------------------------
::

    topic A: a1 a2 a3 a4 ...   ─┐  each topic's requests wait in arrival order
    topic B: b1                 ├─▶ the head with the smallest start tag becomes "current",
    topic C: c1                ─┘   waits for its tokens, takes them, hands over to the next

A single global FIFO would let a topic with eight uploads in flight take 8/10 of the budget
from two topics with one each. Instead the heads are served by start-time fair queueing on
bytes: a topic's head gets the start tag ``max(V, finish of that topic's previous grant)``
where ``V`` is the start tag of the latest grant, and finishes at ``start + n``. Every topic
that wants more than its share gets an equal share of the bytes (1/3 each for three topics),
whatever its number of requests in flight or its chunk size; a topic that went idle rejoins at
``V`` instead of claiming credit for the time it was away. Within a topic, and between
topics whose tags tie, service is strictly in arrival order. ``fair=False`` turns the
cross-topic tags off (one global FIFO).

Only the current head ever sleeps, and it sleeps on the injected ``sleep`` while listening for
:meth:`Throttle.set_rate`, so a reload (SIGHUP) re-times it at once and no waiter is lost. A
cancelled waiter leaves its queue without taking tokens or its topic's turn.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

__all__ = ["Throttle"]

# Refill arithmetic is in floats; without a tolerance a head that slept exactly long enough can
# come up a rounding error short and sleep again for a nanosecond.
_EPSILON_BYTES = 1e-6

# Idle topics' finish tags are dropped once they can no longer matter (see _sweep); checking
# every grant would cost O(topics) per grant for nothing.
_SWEEP_EVERY = 256


@dataclass(eq=False)
class _Topic:
    name: str
    waiters: deque[_Waiter] = field(default_factory=deque)
    finish: int = 0


@dataclass(eq=False)
class _Waiter:
    nbytes: int
    topic: _Topic
    seq: int
    start: int = 0
    turn: asyncio.Event = field(default_factory=asyncio.Event)


class Throttle:
    """A byte-rate budget shared by all topics; see the module docstring for the contract."""

    def __init__(
        self,
        rate_bytes_per_s: float,
        burst_bytes: float | None = None,
        *,
        fair: bool = True,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        _check_rate(rate_bytes_per_s, burst_bytes)
        self._clock = clock
        self._sleep = sleep
        self._fair = fair
        self._rate = float(rate_bytes_per_s)
        self._burst = _burst_for(self._rate, burst_bytes)
        self._tokens = 0.0
        self._stamp = clock()
        self._topics: dict[str, _Topic] = {}
        self._active: dict[str, _Topic] = {}
        self._current: _Waiter | None = None
        self._queued = 0
        self._vtime = 0
        self._seq = 0
        self._grants = 0
        self._kick: asyncio.Future[None] | None = None

    @property
    def rate(self) -> float:
        """Bytes per second; 0 means unlimited."""
        return self._rate

    @property
    def burst(self) -> float:
        """Most bytes the bucket saves up while idle."""
        return self._burst

    @property
    def waiting(self) -> int:
        """Requests queued right now."""
        return self._queued

    def set_rate(self, rate_bytes_per_s: float, burst_bytes: float | None = None) -> None:
        """Change the budget now (config reload); queued waiters keep their places.

        ``burst_bytes=None`` means one second of the new rate. Permits earned so far at the old
        rate are kept (clamped to the new burst) and so is any debt; going to or from unlimited
        starts from an empty bucket.
        """
        _check_rate(rate_bytes_per_s, burst_bytes)
        now = self._clock()
        was_unlimited = self._rate == 0
        if not was_unlimited:
            self._refill(now)
        self._rate = float(rate_bytes_per_s)
        self._burst = _burst_for(self._rate, burst_bytes)
        if was_unlimited or self._rate == 0:
            self._tokens = 0.0
        else:
            self._tokens = min(self._tokens, self._burst)
        self._stamp = now
        self._wake_current()

    async def acquire(self, nbytes: int, topic: str) -> float:
        """Wait until ``nbytes`` of ``topic`` may go; return the seconds waited."""
        if nbytes < 0:
            raise ValueError(f"cannot acquire a negative byte count ({nbytes})")
        if self._rate == 0 or nbytes == 0:
            return 0.0
        started = self._clock()
        queue = self._topics.get(topic)
        if queue is None:
            queue = self._topics[topic] = _Topic(topic)
        if self._current is None:
            # Nobody is queued, so taking tokens now cannot overtake anyone.
            self._refill(started)
            if self._tokens + _EPSILON_BYTES >= min(nbytes, self._burst):
                self._charge(queue, self._start_tag(queue), nbytes)
                return 0.0
        waiter = self._enqueue(queue, nbytes)
        try:
            await waiter.turn.wait()
            while True:
                if self._rate == 0:
                    self._grant(waiter, charge=False)
                    return self._clock() - started
                now = self._clock()
                self._refill(now)
                missing = min(nbytes, self._burst) - self._tokens
                if missing <= _EPSILON_BYTES:
                    self._grant(waiter, charge=True)
                    return self._clock() - started
                await self._nap(missing / self._rate)
        except BaseException:
            # Only the two awaits above can raise, and the waiter is still queued at both.
            self._withdraw(waiter)
            raise

    # -- token bucket -------------------------------------------------------------------------

    def _refill(self, now: float) -> None:
        if now > self._stamp:
            self._tokens = min(self._burst, self._tokens + (now - self._stamp) * self._rate)
            self._stamp = now

    async def _nap(self, seconds: float) -> None:
        """Sleep on the injected clock, but wake early when set_rate kicks."""
        if self._kick is None or self._kick.done():
            self._kick = asyncio.get_running_loop().create_future()
        kick = self._kick
        sleeper = asyncio.ensure_future(self._sleep(seconds))
        try:
            await asyncio.wait((sleeper, kick), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if sleeper.done():
                if not sleeper.cancelled():
                    sleeper.result()
            else:
                sleeper.cancel()

    def _wake_current(self) -> None:
        if self._kick is not None and not self._kick.done():
            self._kick.set_result(None)
        self._kick = None
        if self._current is not None:
            self._current.turn.set()

    # -- queues and fairness ------------------------------------------------------------------

    def _start_tag(self, queue: _Topic) -> int:
        return max(self._vtime, queue.finish)

    def _charge(self, queue: _Topic, start: int, nbytes: int) -> None:
        self._tokens -= nbytes
        self._vtime = max(self._vtime, start)
        queue.finish = start + nbytes
        self._grants += 1
        if self._grants % _SWEEP_EVERY == 0:
            self._sweep()

    def _enqueue(self, queue: _Topic, nbytes: int) -> _Waiter:
        self._seq += 1
        waiter = _Waiter(nbytes, queue, self._seq)
        if not queue.waiters:
            waiter.start = self._start_tag(queue)
            self._active[queue.name] = queue
        queue.waiters.append(waiter)
        self._queued += 1
        if self._current is None:
            self._promote()
        return waiter

    def _dequeue(self, waiter: _Waiter) -> None:
        queue = waiter.topic
        was_head = queue.waiters[0] is waiter
        queue.waiters.remove(waiter)
        self._queued -= 1
        if not queue.waiters:
            del self._active[queue.name]
        elif was_head:
            queue.waiters[0].start = self._start_tag(queue)

    def _grant(self, waiter: _Waiter, *, charge: bool) -> None:
        if charge:
            self._charge(waiter.topic, waiter.start, waiter.nbytes)
        self._dequeue(waiter)
        self._current = None
        self._promote()

    def _withdraw(self, waiter: _Waiter) -> None:
        self._dequeue(waiter)
        if self._current is waiter:
            self._current = None
            self._promote()

    def _promote(self) -> None:
        """Make the next head current: smallest start tag, then earliest arrival."""
        if not self._active:
            return
        heads = (queue.waiters[0] for queue in self._active.values())
        if self._fair:
            nxt = min(heads, key=lambda w: (w.start, w.seq))
        else:
            nxt = min(heads, key=lambda w: w.seq)
        self._current = nxt
        nxt.turn.set()

    def _sweep(self) -> None:
        # An idle topic whose finish tag is behind V would get start tag V anyway, exactly as a
        # topic never seen before, so forgetting it changes nothing.
        stale = [
            name
            for name, queue in self._topics.items()
            if not queue.waiters and queue.finish <= self._vtime
        ]
        for name in stale:
            del self._topics[name]


def _check_rate(rate: float, burst: float | None) -> None:
    if not math.isfinite(rate) or rate < 0:
        raise ValueError(f"throttle rate must be a finite number >= 0 bytes/s, got {rate!r}")
    if burst is not None and (not math.isfinite(burst) or burst <= 0):
        raise ValueError(f"throttle burst must be a finite number > 0 bytes, got {burst!r}")


def _burst_for(rate: float, burst: float | None) -> float:
    return float(burst) if burst is not None else rate
