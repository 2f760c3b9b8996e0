"""``offloadd produce``: the embedded writer alone — history for backfill, a live writer for a
daemon started with ``run``, load for benchmarks.

Payloads are slices of one random pool (distinct per entry, no per-entry allocation), appended
in batches paced to the requested byte rate.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from offloadd.ledger.local import LocalLedgerWriter
from offloadd.model import TopicName

POOL_BYTES = 8 * 1024 * 1024


def topic_names(k: int, prefix: str = "persistent://public/default/topic-") -> list[TopicName]:
    return [TopicName.parse(f"{prefix}{i}") for i in range(k)]


class PayloadPool:
    """Distinct-looking payloads without allocating per entry."""

    def __init__(self, entry_size: int, seed_bytes: bytes | None = None) -> None:
        self.entry_size = entry_size
        size = max(POOL_BYTES, 2 * entry_size + 1)
        self._pool = memoryview(seed_bytes if seed_bytes is not None else os.urandom(size))
        self._span = len(self._pool) - entry_size
        self._next = 0

    def take(self, n: int) -> list[memoryview]:
        out = []
        step = 8191  # odd stride: consecutive entries differ
        for _ in range(n):
            off = self._next % (self._span + 1)
            out.append(self._pool[off:off + self.entry_size])
            self._next += step
        return out


@dataclass
class ProduceStats:
    entries: int = 0
    bytes: int = 0
    seconds: float = 0.0


async def produce(writer: LocalLedgerWriter, topics: Sequence[TopicName], *, entry_size: int,
                  total_bytes: int | None = None, rate: float | None = None,
                  duration: float | None = None, batch_bytes: int = 256 * 1024,
                  stop: asyncio.Event | None = None,
                  on_batch: Callable[[ProduceStats], None] | None = None,
                  clock: Callable[[], float] = time.monotonic) -> ProduceStats:
    """Append to ``topics`` round-robin until ``total_bytes`` or ``duration`` (paced at
    ``rate`` bytes/s when given) or ``stop`` is set."""
    pool = PayloadPool(entry_size)
    stats = ProduceStats()
    if rate:
        # at most 50 ms of the rate per batch: a slow rate must not wait for a whole batch's
        # worth of time before its first entry (nor write in bursts)
        batch_bytes = min(batch_bytes, int(rate / 20))
    per_batch = max(1, batch_bytes // max(entry_size, 1))
    t0 = clock()
    i = 0
    while True:
        now = clock()
        if stop is not None and stop.is_set():
            break
        if total_bytes is not None and stats.bytes >= total_bytes:
            break
        if duration is not None and now - t0 >= duration:
            break
        n = per_batch
        if total_bytes is not None:
            n = max(1, min(n, (total_bytes - stats.bytes + entry_size - 1) // max(entry_size, 1)))
        if rate:
            due = t0 + (stats.bytes + n * entry_size) / rate
            if due > now:
                await asyncio.sleep(min(due - now, 0.05))
                continue
        topic = topics[i % len(topics)]
        i += 1
        await writer.append(topic, pool.take(n))  # type: ignore[arg-type]
        stats.entries += n
        stats.bytes += n * entry_size
        await writer.roll_expired()
        if on_batch is not None:
            on_batch(stats)
    stats.seconds = clock() - t0
    return stats
