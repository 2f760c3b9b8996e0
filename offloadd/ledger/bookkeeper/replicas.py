"""Which bookie to ask for which entries (pure), in the spirit of BookKeeper's reorder-read.

A bookie is ranked by ``(quarantined, slow, remote)`` — failed or timed out within the
quarantine, latency well above the best bookie's, outside the local zone — and, between bookies
of the same rank, by reads in flight (:func:`order_replicas`).

A range of entries is cut into *runs*: consecutive entries asked of one bookie (one batched read
where the bookie supports it). Entry ``e`` lives on the ensemble positions ``(e + j) mod E`` for
``j < W`` (its write set), so the ``j``-th bookie of ``e``'s write set holds ``e .. e + j``: the
last one, at ``(e + W - 1) mod E``, holds the run ``e .. e + W - 1``. :func:`plan_runs` takes, for
each run start, the best-ranked bookie of the write set and, among equals, the longest run::

    E = 3, W = 2, all healthy          E = W (no striping): contiguous shares of
    0 1 | 2 3 | 4 5 | 6 7 ...          the equally best bookies, evened out by
    b1    b0    b2    b1               reads in flight (:func:`water_fill`)

so every bookie serves every third run. Reads in flight do not move a striped plan (they would
trade the runs' length for a balance the pattern already has); a bookie falling behind is caught
by its latency (``slow``). Entries that failed are planned one by one (:func:`plan_retry`): each
goes to the best bookie of its write set it was not tried on.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from offloadd.ledger.bookkeeper.layout import LedgerMetadata

__all__ = [
    "BookieHealth",
    "Rank",
    "ReplicaPolicy",
    "Replicas",
    "Runs",
    "ids_of",
    "order_replicas",
    "plan_retry",
    "plan_runs",
    "runs_of",
    "water_fill",
]

Rank = tuple[bool, bool, bool]  # (quarantined, slow, remote): False sorts first
Runs = dict[str, list[tuple[int, int]]]  # bookie → (first entry id, count), ascending
_EWMA_ALPHA = 0.2


@dataclass(frozen=True)
class ReplicaPolicy:
    quarantine_s: float = 10.0
    """A bookie that failed is asked last this long."""
    slow_factor: float = 4.0
    slow_floor_s: float = 0.05
    """Slow: a latency EWMA above ``slow_factor`` × the best bookie's and above this."""
    local_zone: str | None = None
    zones: Mapping[str, str] = field(default_factory=dict)
    """bookie → zone: bookies in ``local_zone`` are asked first."""


@dataclass
class BookieHealth:
    ewma_s: float | None = None
    down_until: float = 0.0
    failures: int = 0


class Replicas:
    """What is known of each bookie — failures, latency EWMA, reads in flight — and the rank the
    policy gives it. ``clock``: monotonic seconds."""

    def __init__(self, policy: ReplicaPolicy | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy or ReplicaPolicy()
        self._clock = clock
        self.health: defaultdict[str, BookieHealth] = defaultdict(BookieHealth)
        self.pending: defaultdict[str, int] = defaultdict(int)

    def mark_down(self, addr: str) -> bool:
        """Ask ``addr`` last for ``quarantine_s``; True when that starts a quarantine (a failure
        while already quarantined only extends it)."""
        h = self.health[addr]
        h.failures += 1
        now = self._clock()
        starts = h.down_until <= now and self.policy.quarantine_s > 0
        h.down_until = now + self.policy.quarantine_s
        return starts

    def is_down(self, addr: str) -> bool:
        """Failed (error, timeout, refused connection) within the last ``quarantine_s``."""
        h = self.health.get(addr)
        return h is not None and h.down_until > self._clock()

    def is_slow(self, addr: str) -> bool:
        h = self.health.get(addr)
        p = self.policy
        if h is None or h.ewma_s is None or h.ewma_s <= p.slow_floor_s:
            return False
        best = min((x.ewma_s for x in self.health.values() if x.ewma_s is not None),
                   default=h.ewma_s)
        return h.ewma_s > p.slow_factor * best

    def observe(self, addr: str, latency: float) -> None:
        """A read answered after ``latency`` seconds."""
        h = self.health[addr]
        h.ewma_s = latency if h.ewma_s is None else \
            h.ewma_s + _EWMA_ALPHA * (latency - h.ewma_s)
        h.failures = 0

    def rank(self, b: str) -> Rank:
        p = self.policy
        return (self.is_down(b), self.is_slow(b),
                p.local_zone is not None and p.zones.get(b) != p.local_zone)

    def order(self, candidates: Sequence[str], pending: Mapping[str, int] | None = None
              ) -> list[str]:
        p = self.policy
        return order_replicas(candidates, now=self._clock(),
                              pending=self.pending if pending is None else pending,
                              health=self.health, slow=self.is_slow, local_zone=p.local_zone,
                              zones=p.zones)


def order_replicas(candidates: Sequence[str], *, now: float, pending: Mapping[str, int],
                   health: Mapping[str, BookieHealth], slow: Callable[[str], bool],
                   local_zone: str | None, zones: Mapping[str, str]) -> list[str]:
    """Rank a write set for one read: healthy before quarantined before slow, local zone before
    remote, then fewest reads in flight, then write-set order."""

    def key(item: tuple[int, str]) -> tuple[bool, bool, bool, int, int]:
        pos, b = item
        h = health.get(b)
        down = h is not None and h.down_until > now
        remote = local_zone is not None and zones.get(b) != local_zone
        return down, slow(b), remote, pending.get(b, 0), pos

    return [b for _, b in sorted(enumerate(candidates), key=key)]


def water_fill(n: int, bookies: Sequence[str], pend: Mapping[str, int]
               ) -> list[tuple[str, int]]:
    """Split ``n`` reads over equally good bookies so their reads in flight end up as even
    as possible (the least loaded get more)."""
    if len(bookies) == 1:
        return [(bookies[0], n)]
    loads = sorted((pend.get(b, 0), i, b) for i, b in enumerate(bookies))
    level, active, left = loads[0][0], 1, n
    while active < len(loads) and (loads[active][0] - level) * active < left:
        left -= (loads[active][0] - level) * active
        level = loads[active][0]
        active += 1
    q, r = divmod(left, active)
    out = []
    for j, (load, _, b) in enumerate(loads[:active]):
        out.append((b, level - load + q + (1 if j < r else 0)))
    return out


def _add(out: Runs, bookie: str, first: int, n: int) -> None:
    runs = out[bookie]
    if runs and runs[-1][0] + runs[-1][1] == first:
        runs[-1] = (runs[-1][0], runs[-1][1] + n)
    else:
        runs.append((first, n))


def plan_runs(meta: LedgerMetadata, first: int, last: int, rank: Callable[[str], Rank],
              pending: Mapping[str, int]) -> Runs:
    """Cut entries ``first..last`` into runs, each on one bookie of their write sets (see the
    module docstring). Every entry is in exactly one run; no bookie gets an empty run."""
    out: Runs = defaultdict(list)
    segs = meta.segments
    for k, (seg_first, ensemble) in enumerate(segs):
        lo = max(first, seg_first)
        hi = last + 1 if k + 1 == len(segs) else min(last + 1, segs[k + 1][0])
        if lo >= hi:
            continue
        size = len(ensemble)
        quorum = min(meta.write_quorum, size)
        ranks = [rank(b) for b in ensemble]
        if quorum >= size:  # every bookie holds every entry
            top = min(ranks)
            tops = [b for b, r in zip(ensemble, ranks, strict=True) if r == top]
            pos = lo
            for b, n in water_fill(hi - lo, tops, pending):
                if n:
                    _add(out, b, pos, n)
                    pos += n
            continue
        # the choice depends on the run start's position only: work it out once per position.
        # Among the best ranked of the write set, the last holds the longest run; the run
        # stops before an entry that a better ranked bookie holds.
        best = [min(ranks[(r + i) % size] for i in range(quorum)) for r in range(size)]
        choice: list[tuple[str, int]] = []
        for r in range(size):
            j = max(i for i in range(quorum) if ranks[(r + i) % size] == best[r])
            n = 1
            while n <= j and best[(r + n) % size] == best[r]:
                n += 1
            choice.append((ensemble[(r + j) % size], n))
        s = lo
        while s < hi:  # one pass per run: keep it tight
            b, n = choice[s % size]
            if s + n > hi:
                n = hi - s
            runs = out[b]
            if runs and runs[-1][0] + runs[-1][1] == s:
                runs[-1] = (runs[-1][0], runs[-1][1] + n)
            else:
                runs.append((s, n))
            s += n
    return dict(out)


def ids_of(runs: Sequence[tuple[int, int]]) -> list[int]:
    """The entry ids of runs, in order."""
    if len(runs) == 1:
        return list(range(runs[0][0], runs[0][0] + runs[0][1]))
    return [e for f, n in runs for e in range(f, f + n)]


def runs_of(entry_ids: Iterable[int]) -> list[tuple[int, int]]:
    """Ascending entry ids as runs of consecutive ids."""
    runs: list[tuple[int, int]] = []
    for e in entry_ids:
        if runs and runs[-1][0] + runs[-1][1] == e:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((e, 1))
    return runs


def plan_retry(meta: LedgerMetadata, entry_ids: Iterable[int],
               tried: Mapping[int, set[str]],
               order: Callable[[Sequence[str], Mapping[str, int]], list[str]],
               pending: Mapping[str, int]) -> tuple[Runs, list[int]]:
    """Each entry to the best bookie of its write set not tried for it yet (``order`` ranks
    candidates given reads in flight); also the entries left with no bookie to ask."""
    pend = dict(pending)
    chosen: dict[str, list[int]] = defaultdict(list)
    exhausted: list[int] = []
    for e in entry_ids:
        cands = [b for b in meta.bookies_for(e) if b not in tried.get(e, ())]
        if not cands:
            exhausted.append(e)
            continue
        b = order(cands, pend)[0]
        chosen[b].append(e)
        pend[b] = pend.get(b, 0) + 1
    return {b: runs_of(sorted(ids)) for b, ids in chosen.items()}, exhausted
