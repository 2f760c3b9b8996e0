"""The follower's commit budget: a bounded rate of table commits (pure, no I/O).

Every table commit costs about the same whatever it holds (a data file, a manifest, a manifest
list, a metadata file rewritten whole, the catalog's compare-and-set), and a table's metadata
grows with each snapshot until expiry. At a thousand tables, committing each one every pass
would cost more than the offload itself. So the follower spends at most
``[lakehouse] max_commits_per_s`` commits per second across all tables, refilled continuously
up to one pass's worth (``max_commits_per_s × interval_s``, at least one). A pass starts a
table only while a commit is in the budget; a table with a large backlog may take several
commits at once and leave the budget in debt, which later passes repay. The tables whose oldest
unprojected segment was committed longest ago go first, so every table waits about
``tables with new segments ÷ max_commits_per_s`` seconds and each commit carries the segments
that arrived meanwhile: batching follows from the bound.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CommitBudget"]


@dataclass
class CommitBudget:
    rate: float  # commits per second; 0: unbounded
    burst: float  # most commits saved up
    tokens: float
    at: float  # clock of the last refill

    @classmethod
    def create(cls, rate: float, interval_s: float, now: float) -> CommitBudget:
        burst = max(1.0, rate * interval_s)
        return cls(rate, burst, burst, now)

    def ready(self, now: float) -> bool:
        """Whether a table may start committing now."""
        if self.rate <= 0:
            return True
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        return self.tokens >= 1

    def spend(self) -> None:
        """One commit made (may go into debt)."""
        if self.rate > 0:
            self.tokens -= 1
