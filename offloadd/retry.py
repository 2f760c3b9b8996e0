"""THE backoff policy of offloadd: capped exponential backoff with full jitter.

Every retry in the product waits through a :class:`Backoff`: a failed topic attempt and its
recovery, every compare-and-set loop, cluster acquisition, the S3 driver's request retries. The
``n``-th consecutive retry (``n = 1, 2, ...``) waits a uniformly random time in::

    [0, ceiling(n)]    ceiling(n) = min(cap_s, base_s * 2 ** (n - 1))

Full jitter, not equal jitter (``ceiling / 2 + uniform(0, ceiling / 2)``) nor none: retriers
that failed together (every topic of a store that just went away, daemons racing on one znode)
spread over the whole window instead of bunching in its upper half, and the mean wait is half
the ceiling, so the load a retry storm puts on a recovering backend is the lowest of the three
for the same cap (AWS Architecture Blog, "Exponential Backoff And Jitter", 2015). The price is
that a single retry may come almost at once; callers that must not spin (a topic task) already
hold a cap that bounds their rate over many attempts, and the count keeps growing while they
fail.

Pure: no clock and no sleeping here. :class:`Retry` counts consecutive failures and hands out the
next wait; the caller sleeps however it sleeps (an injected clock, a stop event).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

__all__ = ["CAS", "Backoff", "Retry"]

# doubling stops here: 2 ** 62 times any sane base is past every cap
_MAX_DOUBLINGS = 62


@dataclass(frozen=True)
class Backoff:
    """Capped exponential backoff with full jitter (see the module docstring)."""

    base_s: float
    cap_s: float

    def __post_init__(self) -> None:
        if not self.base_s >= 0 or not self.cap_s >= self.base_s:
            raise ValueError(f"backoff needs 0 <= base_s <= cap_s, got base_s={self.base_s!r}, "
                             f"cap_s={self.cap_s!r}")

    def ceiling(self, attempt: int) -> float:
        """The longest wait before retry number ``attempt`` (1-based)."""
        if attempt < 1:
            raise ValueError(f"retry attempts count from 1, got {attempt}")
        doubled: float = self.base_s * 2.0 ** min(attempt - 1, _MAX_DOUBLINGS)
        return min(self.cap_s, doubled)

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """A wait for retry number ``attempt``: uniform in ``[0, ceiling(attempt)]``."""
        return (rng or _RNG).uniform(0.0, self.ceiling(attempt))


@dataclass
class Retry:
    """Consecutive failures of one thing and the wait before its next try.

    ``next_delay()`` after each failure (the first returns a wait for retry 1), ``reset()``
    after a success.
    """

    backoff: Backoff
    rng: random.Random | None = field(default=None, repr=False)
    attempts: int = 0

    def next_delay(self) -> float:
        self.attempts += 1
        return self.backoff.delay(self.attempts, self.rng)

    def reset(self) -> None:
        self.attempts = 0


# Compare-and-set races on one metadata node: the loser re-reads at once most of the time (the
# ceiling starts at 2 ms), and backs off to at most a quarter second when many writers collide.
CAS = Backoff(base_s=0.002, cap_s=0.25)

_RNG = random.Random()
