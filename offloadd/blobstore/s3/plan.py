"""The retry plan of one S3 operation: pure, on numbers, so every rule is tested without a store.

:class:`~offloadd.blobstore.s3.calls.Requests` executes an operation; this says, after each
failed try of the primary endpoint, whether to try again and after how long:

- a failure while the store's circuit is not HEALTHY does not use up ``max_attempts`` (the store
  is known to be in trouble; counting those would give up on an outage the circuit rides out):
  ``pause_timeout_s`` from the first such failure bounds them instead;
- any other transient failure counts; the ``max_attempts``-th ends the operation;
- the wait is the product's one backoff (:class:`offloadd.retry.Backoff`), and a wait that would
  pass the operation's deadline ends it now rather than failing after a useless sleep.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass, field

from offloadd.retry import Backoff

__all__ = ["GiveUp", "RetryPlan"]


class GiveUp(enum.Enum):
    """Why an operation stops retrying."""

    DEGRADED = "store degraded for the whole pause timeout"
    ATTEMPTS = "max_attempts used up"
    DEADLINE = "another try would pass the deadline"


@dataclass
class RetryPlan:
    """The retry state of one operation; ``deadline`` is on the caller's clock."""

    deadline: float
    max_attempts: int
    pause_timeout_s: float
    backoff: Backoff
    rng: random.Random = field(default_factory=random.Random)
    attempts: int = 0  # failures that count against max_attempts
    paused_until: float | None = None  # set once the store's health holds this operation up

    def pause_limit(self, now: float) -> float:
        """How long a write may still wait for a paused circuit (never past the deadline)."""
        if self.paused_until is None:
            self.paused_until = now + self.pause_timeout_s
        return min(self.paused_until, self.deadline) - now

    def after_failure(self, now: float, *, degraded: bool) -> float | GiveUp:
        """The wait before the next try, or why not to make one. ``degraded``: a write failed
        while the store's circuit was not HEALTHY."""
        if degraded:
            if self.paused_until is None:
                self.paused_until = now + self.pause_timeout_s
            elif now >= self.paused_until:
                return GiveUp.DEGRADED
        else:
            self.attempts += 1
            if self.attempts >= self.max_attempts:
                return GiveUp.ATTEMPTS
        delay = self.backoff.delay(max(self.attempts, 1), self.rng)
        if now + delay >= self.deadline:
            return GiveUp.DEADLINE
        return delay
