"""Store health: a circuit breaker on a store's recent error rate, with high/low watermarks.

A driver records the outcome of every request it makes (``record_success`` / ``record_failure``;
only *transient* failures count: a 404 or an access-denied answer proves the store is up). The
component keeps the outcomes of the last ``window_s`` seconds (at most ``max_samples`` of them, so
memory is bounded whatever the request rate) and moves between three states::

                    error rate >= high                    a probe succeeds
      HEALTHY ─────────────────────────────▶ PAUSED ─────────────────────────▶ RECOVERING
      (closed)     or a failure streak       (open)                            (half-open)
         ▲                                     ▲        error rate >= high          │
         │                                     └────────────────────────────────────┤
         └────────────────────── error rate <= low ─────────────────────────────────┘

Rates are judged only once the window holds ``min_samples`` outcomes; between the watermarks the
state does not change (hysteresis, so a store at the edge does not flap). A *failure streak* —
the window's last ``min_samples`` outcomes all failures — trips the circuit too, whatever the
rate: when a busy store goes down outright, the successes of the seconds before would otherwise
hold the rate under ``high`` for up to ``window_s`` while every request fails (and retrying
operations back off, so failures pile up slowly). Entering RECOVERING starts a fresh window so
old outage failures do not hold the circuit open.

While PAUSED, writers wait in :meth:`StoreHealth.wait_until_healthy` (bounded: a deadline turns
into ``Retriable``) instead of hammering a failing store, and only probes reach it:
:meth:`StoreHealth.run_prober` calls a driver-supplied cheap probe every ``probe_interval_s``
while the state is not HEALTHY, so the circuit closes by itself once the store answers again.
RECOVERING lets writers through; their outcomes (and further probes) decide the rest.

Stalls. A store that hangs instead of failing (accepts connections, answers nothing) produces
no failure until each request's own deadline passes, and a light load may never add up to
``min_samples`` of them. So the driver also tells the component when each request starts and
ends (:meth:`~StoreHealth.request_started` / :meth:`~StoreHealth.request_finished`), whether
a failure was an answer (an HTTP error) or silence (a reset, a timeout), and every missed
deadline (:meth:`~StoreHealth.record_stall`). While not PAUSED, the prober doubles as a
watchdog: once nothing at all was answered for ``stall_after_s`` while a request waited that
long or missed its deadline, it sends one probe, and if that is not answered either (the driver
bounds it by the same request deadline) the circuit trips at once. With ``stall_after_s`` equal
to the driver's request deadline, a frozen store with work under way trips the circuit within
two deadlines of the moment it stopped answering.

Refusals. A definite answer that says the store will not do this for us (no such bucket,
access denied, bad credentials...) proves the store is up, so it counts as a success for the
circuit; but nothing will work until an operator acts. The driver reports it with
:meth:`~StoreHealth.record_refused` (per operation); the next success of that operation clears
it. :meth:`~StoreHealth.readiness` folds both into the answer ``/readyz`` gives.

The component does no I/O and reads time only through the injected ``clock``; ``on_change(old,
new)`` is called synchronously on every transition (metrics, status), and every transition is
logged as ``store health <old> -> <new>: <name> ...`` (the trip to PAUSED at WARNING, the way
back at INFO). It knows nothing about S3: any driver can feed it.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from offloadd.aio import first_of
from offloadd.blobstore.base import StoreHealthView
from offloadd.errors import ConfigError, Retriable

__all__ = ["HealthPolicy", "HealthSnapshot", "HealthState", "StoreHealth"]

log = logging.getLogger(__name__)


class HealthState(enum.Enum):
    HEALTHY = "healthy"
    PAUSED = "degraded-paused"
    RECOVERING = "recovering"


@dataclass(frozen=True)
class HealthPolicy:
    window_s: float = 30.0  # how far back the error rate looks
    high: float = 0.5  # error rate at or above which writes pause
    low: float = 0.1  # error rate at or below which the store counts as healthy again
    min_samples: int = 10  # outcomes needed before a rate is trusted
    max_samples: int = 1024  # memory bound on the window
    probe_interval_s: float = 5.0  # time between probes while not HEALTHY
    pause_timeout_s: float = 60.0  # how long one operation may wait for the store in total
    # A request waiting this long while the store answered nothing for as long triggers a probe;
    # an unanswered probe trips the circuit. None: no watchdog (drivers set their deadline).
    stall_after_s: float | None = 30.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.low < self.high <= 1.0:
            raise ConfigError(
                f"store health: need 0 <= low < high <= 1, got low={self.low} high={self.high}"
            )
        if self.window_s <= 0 or self.probe_interval_s <= 0 or self.pause_timeout_s < 0:
            raise ConfigError(
                "store health: window_s and probe_interval_s must be > 0, pause_timeout_s >= 0"
            )
        if self.stall_after_s is not None and not self.stall_after_s > 0:
            raise ConfigError(f"store health: stall_after_s must be > 0, got {self.stall_after_s}")
        if not 1 <= self.min_samples <= self.max_samples:
            raise ConfigError(
                f"store health: need 1 <= min_samples <= max_samples, got {self.min_samples}"
                f" and {self.max_samples}"
            )


@dataclass(frozen=True)
class HealthSnapshot:
    state: HealthState
    error_rate: float  # over the current window; 0.0 when it is empty
    samples: int
    since: float  # clock() value at the last transition


class StoreHealth(StoreHealthView):
    """Error-rate circuit for one store; see the module docstring for the state machine."""

    def __init__(
        self,
        policy: HealthPolicy | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[HealthState, HealthState], None] | None = None,
        name: str | None = None,
    ) -> None:
        self.policy = policy or HealthPolicy()
        # For log lines only ("s3://bucket/prefix"); a driver names an unnamed one it is given.
        self.name = name
        self._clock = clock
        self._on_change = on_change
        self._samples: deque[tuple[float, bool]] = deque(maxlen=self.policy.max_samples)
        self._failures = 0
        self._streak = 0  # failures since the last success, window or not
        self._state = HealthState.HEALTHY
        self._since = clock()
        self._last_probe = self._since
        self._last_answer = self._since  # clock() when the store last answered anything
        self._last_stall = float("-inf")  # clock() of the last missed deadline
        self._outstanding: dict[int, float] = {}  # request ticket -> clock() at its start
        self._tickets = 0
        self._refused: dict[str, tuple[str, float]] = {}  # op -> (reason, wall time)
        # Two events, not one Condition: waiters and the prober wait on opposite edges.
        self._writable = asyncio.Event()
        self._writable.set()
        self._unhealthy = asyncio.Event()
        self._nudge = asyncio.Event()  # wakes the watchdog: a request started, a transition

    # -- recording ---------------------------------------------------------------------------

    @property
    def state(self) -> HealthState:
        return self._state

    def record_success(self, op: str | None = None) -> None:
        """A request was answered and did what was asked (or got a definite answer that proves
        the store up, such as 404). ``op``: a real success of that operation, which clears its
        refusal (:meth:`record_refused`)."""
        self._last_answer = self._clock()
        if op is not None and self._refused.pop(op, None) is not None:
            log.info("store health: %s accepts %s again", self.name or "the store", op)
        self._record(True)

    def clear_refusal(self, op: str) -> None:
        """Withdraw ``op``'s refusal without counting a request (the caller's success of another
        operation proved it lifted)."""
        if self._refused.pop(op, None) is not None:
            log.info("store health: %s accepts %s again", self.name or "the store", op)

    def record_failure(self, *, answered: bool = False) -> None:
        """A transient failure. ``answered``: the store sent an answer (a 5xx, a throttle);
        otherwise it was silence (a reset, a timeout, a missed deadline)."""
        if answered:
            self._last_answer = self._clock()
        self._record(False)

    def record_stall(self) -> None:
        """A request missed its deadline without an answer: a failure, and evidence for the
        stall watchdog even though the request no longer waits."""
        now = self._clock()
        self._last_stall = now
        self._nudge.set()
        self._record(False)

    def record_refused(self, op: str, reason: str) -> None:
        """A definite refusal that needs an operator (no such bucket, access denied...): the
        store is up, but ``op`` will keep failing until someone acts."""
        self._last_answer = self._clock()
        if op not in self._refused:
            log.warning("store health: %s refuses %s: %s", self.name or "the store", op, reason)
        self._refused[op] = (reason, time.time())
        self._record(True)

    def request_started(self) -> int:
        """Note a request going out; give the ticket to :meth:`request_finished`."""
        self._tickets += 1
        if not self._outstanding:
            self._nudge.set()  # the first one brings the watchdog's next check in from never
        self._outstanding[self._tickets] = self._clock()
        return self._tickets

    def request_finished(self, ticket: int) -> None:
        self._outstanding.pop(ticket, None)

    def record_probe(self, ok: bool) -> None:
        """A probe's outcome: the only way out of PAUSED."""
        now = self._clock()
        self._last_probe = now
        if ok:
            self._last_answer = now
        if self._state is HealthState.PAUSED:
            if not ok:
                return
            self._transition(HealthState.RECOVERING, now)  # starts a fresh window...
        self._record(ok)  # ...whose first outcome is this probe

    def _record(self, ok: bool) -> None:
        now = self._clock()
        if len(self._samples) == self._samples.maxlen and not self._samples[0][1]:
            self._failures -= 1  # the append below evicts this failure
        self._samples.append((now, ok))
        if not ok:
            self._failures += 1
        self._streak = 0 if ok else self._streak + 1
        self._evaluate(now)

    def _prune(self, now: float) -> None:
        horizon = now - self.policy.window_s
        while self._samples and self._samples[0][0] < horizon:
            _, ok = self._samples.popleft()
            if not ok:
                self._failures -= 1

    def _evaluate(self, now: float) -> None:
        self._prune(now)
        if len(self._samples) < self.policy.min_samples:
            return
        rate = self._failures / len(self._samples)
        # The streak's failures are the window's newest; those older than the window are gone.
        streak = min(self._streak, len(self._samples))
        if self._state is not HealthState.PAUSED and (
            rate >= self.policy.high or streak >= self.policy.min_samples
        ):
            self._transition(HealthState.PAUSED, now)
        elif self._state is HealthState.RECOVERING and rate <= self.policy.low:
            self._transition(HealthState.HEALTHY, now)

    def _transition(self, new: HealthState, now: float, why: str | None = None) -> None:
        rate, samples = self._failures / max(len(self._samples), 1), len(self._samples)
        old, self._state, self._since = self._state, new, now
        self._nudge.set()
        if new is HealthState.PAUSED:
            self._writable.clear()
            self._last_probe = now  # first probe one interval after the trip
        else:
            self._writable.set()
        if new is HealthState.HEALTHY:
            self._unhealthy.clear()
        else:
            self._unhealthy.set()
        if new is HealthState.RECOVERING:
            self._samples.clear()
            self._failures = 0
        # Operators grep for "store health"; the trip is a WARNING, the way back INFO.
        name = self.name or "the store"
        if new is HealthState.PAUSED and why is not None:
            log.warning("store health %s -> %s: %s %s; writes wait (at most %.0fs each), probing "
                        "every %.0fs", old.value, new.value, name, why,
                        self.policy.pause_timeout_s, self.policy.probe_interval_s)
        elif new is HealthState.PAUSED:
            log.warning(
                "store health %s -> %s: %s failed %.0f%% of the last %d requests (the last %d "
                "in a row); writes wait (at most %.0fs each), probing every %.0fs", old.value,
                new.value, name, 100 * rate, samples, min(self._streak, samples),
                self.policy.pause_timeout_s, self.policy.probe_interval_s)
        elif new is HealthState.RECOVERING:
            log.info("store health %s -> %s: %s answered a probe; writes resume", old.value,
                     new.value, name)
        else:
            log.info("store health %s -> %s: %s failed %.0f%% of the last %d requests",
                     old.value, new.value, name, 100 * rate, samples)
        if self._on_change is not None:
            try:
                self._on_change(old, new)
            except Exception:  # a broken metrics hook must not break the data path
                log.exception("store health on_change hook failed")

    # -- reading -----------------------------------------------------------------------------

    @property
    def error_rate(self) -> float:
        self._prune(self._clock())
        return self._failures / len(self._samples) if self._samples else 0.0

    def snapshot(self) -> HealthSnapshot:
        rate = self.error_rate
        return HealthSnapshot(self._state, rate, len(self._samples), self._since)

    def next_probe_in(self) -> float:
        """Seconds until a probe is due (0 when due now); ``inf`` while HEALTHY."""
        if self._state is HealthState.HEALTHY:
            return float("inf")
        return max(0.0, self._last_probe + self.policy.probe_interval_s - self._clock())

    def _paused(self) -> bool:
        return self._state is HealthState.PAUSED

    @property
    def waiting(self) -> int:
        """Requests under way right now."""
        return len(self._outstanding)

    def silent_for(self) -> float:
        """Seconds since the store last answered anything."""
        return max(0.0, self._clock() - self._last_answer)

    def stall_check_in(self) -> float:
        """Seconds until the watchdog's condition could hold (0: it holds now): nothing was
        answered for ``stall_after_s``, and a request has waited as long or one missed its
        deadline in that silence. ``inf``: neither, or there is no watchdog."""
        after = self.policy.stall_after_s
        if after is None:
            return float("inf")
        due = float("inf")
        if self._outstanding:
            due = max(min(self._outstanding.values()), self._last_answer) + after
        if self._last_stall > self._last_answer:
            due = min(due, self._last_answer + after)
        return max(0.0, due - self._clock()) if due != float("inf") else due

    def refusal(self) -> tuple[str, str, float] | None:
        """The latest refusal still standing: (operation, reason, wall time), or None."""
        if not self._refused:
            return None
        op, (reason, since) = max(self._refused.items(), key=lambda kv: kv[1][1])
        return op, reason, since

    def readiness(self) -> tuple[bool, str]:
        """What ``/readyz`` says about this store: not ready while the circuit is open or an
        operation is refused; RECOVERING is ready (writes flow again)."""
        name = self.name or "the store"
        if self._state is HealthState.PAUSED:
            return False, (f"blob store circuit is {self._state.value}: {name} failing or not "
                           f"answering for {self._clock() - self._since:.0f}s")
        refused = self.refusal()
        if refused is not None:
            op, reason, _ = refused
            return False, f"blob store refuses {op}: {reason}"
        return True, f"blob store circuit is {self._state.value}"

    # -- waiting -----------------------------------------------------------------------------

    async def wait_until_healthy(self, timeout_s: float | None = None) -> None:
        """Return at once unless PAUSED; otherwise wait for the circuit to let writes through.

        Raises ``Retriable`` if still paused after ``timeout_s`` (default: the policy's
        ``pause_timeout_s``).
        """
        if self._writable.is_set():
            return
        timeout = self.policy.pause_timeout_s if timeout_s is None else timeout_s
        try:
            async with asyncio.timeout(max(0.0, timeout)):  # (not wait_for: see recorder.py)
                await self._writable.wait()
        except TimeoutError:
            raise Retriable(
                f"store unavailable: writes paused since its error rate reached "
                f"{self.policy.high:.0%}; still paused after waiting {timeout:.1f}s"
            ) from None

    async def run_prober(
        self,
        probe: Callable[[], Awaitable[None]],
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """Probe the store while it is not HEALTHY, and watch for stalls; runs until cancelled.

        ``probe`` raises (anything) when the store does not answer properly; it must bound its
        own wait (the driver's request deadline).
        """
        while True:
            if self._state is not HealthState.PAUSED:
                due = self.stall_check_in()
                if self._state is HealthState.RECOVERING:  # regular probes as well
                    due = min(due, self.next_probe_in())
                if due > 0:
                    await self._sleep_or_nudge(due, sleep)
                    continue
                stalled = self.stall_check_in() == 0
                silent, waiting = self.silent_for(), self.waiting
                missed = self._last_stall > self._last_answer
                asked = self._clock()
                ok = await self._try(probe)
                # trip only if nothing at all answered meanwhile, and not tripped already
                if stalled and not ok and self._last_answer < asked and not self._paused():
                    self._record(False)
                    self._transition(
                        HealthState.PAUSED, self._clock(),
                        f"answered nothing for {silent:.1f}s ({waiting} request(s) waiting"
                        f"{', a deadline missed' if missed else ''}) and a probe got no answer "
                        "either (stalled)")
                    continue
                self.record_probe(ok)
                continue
            delay = self.next_probe_in()
            if delay > 0:
                await sleep(delay)
                continue
            self.record_probe(await self._try(probe))

    async def _try(self, probe: Callable[[], Awaitable[None]]) -> bool:
        try:
            await probe()
        except Exception as exc:  # any failure of the probe is the answer "not yet"
            log.debug("store probe failed: %s", exc)
            return False
        return True

    async def _sleep_or_nudge(self, delay: float,
                              sleep: Callable[[float], Awaitable[None]]) -> None:
        """Sleep ``delay`` (may be ``inf``), but wake early when a request starts or the state
        changes: either may bring the next check forward."""
        self._nudge.clear()
        waits: list[Awaitable[object]] = [self._nudge.wait()]
        if delay != float("inf"):
            waits.append(sleep(delay))
        await first_of(*waits)
