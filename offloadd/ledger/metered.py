"""A ledger source that reports how long each read took, per topic.

The offload pipeline reads through this wrapper, so ``brk_ledgeroffloader_read_ledger_latency``
and ``offloadd_source_read_duration_seconds`` measure every read the offloader makes, whatever
the source (embedded store or BookKeeper), without timing code in the pipeline itself. Only reads
that succeed are timed (a failed read counts as an offload error elsewhere).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from offloadd.ledger.base import LedgerSource, ReadArray
from offloadd.model import EntryRun, LedgerDesc, TopicName

__all__ = ["MeteredSource", "SourceReadProbe"]


class SourceReadProbe(Protocol):
    def ledger_read(self, seconds: float) -> None: ...


class MeteredSource:
    """Wraps ``inner``; ``probe(topic)`` gives the topic's probe (or None: not measured)."""

    def __init__(self, inner: LedgerSource,
                 probe: Callable[[TopicName], SourceReadProbe | None],
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.inner = inner
        self._probe = probe
        self._clock = clock

    async def list_topics(self) -> list[TopicName]:
        return await self.inner.list_topics()

    async def ledgers(self, topic: TopicName) -> list[LedgerDesc]:
        return await self.inner.ledgers(topic)

    async def read(self, topic: TopicName, ledger_id: int, first_entry_id: int,
                   last_entry_id: int, max_bytes: int | None = None, *,
                   into: ReadArray | None = None) -> EntryRun:
        t0 = self._clock()
        run = await self.inner.read(topic, ledger_id, first_entry_id, last_entry_id, max_bytes,
                                    into=into)
        probe = self._probe(topic)
        if probe is not None:
            probe.ledger_read(self._clock() - t0)
        return run

    def wait_for_entries(self, topic: TopicName, ledger_id: int, last_known_entry_id: int,
                         timeout: float) -> Coroutine[Any, Any, None]:
        # the inner source's wait itself, not a coroutine around it: an idle topic waits
        # here for hours, and each frame it holds is 10,000 frames at 10,000 topics
        return self.inner.wait_for_entries(topic, ledger_id, last_known_entry_id, timeout)

    async def close(self) -> None:
        await self.inner.close()
