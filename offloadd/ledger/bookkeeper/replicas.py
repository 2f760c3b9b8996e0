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

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from offloadd.ledger.bookkeeper.layout import LedgerMetadata

__all__ = [
    "BookieHealth",
    "Rank",
    "Runs",
    "order_replicas",
    "plan_retry",
    "plan_runs",
    "runs_of",
    "water_fill",
]

Rank = tuple[bool, bool, bool]  # (quarantined, slow, remote): False sorts first
Runs = dict[str, list[tuple[int, int]]]  # bookie → (first entry id, count), ascending


@dataclass
class BookieHealth:
    ewma_s: float | None = None
    down_until: float = 0.0
    failures: int = 0


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
