"""A writer and a source over one directory, in one process (:class:`LocalLedgerStore`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from offloadd.ledger.local.notifier import LedgerNotifier
from offloadd.ledger.local.source import LocalLedgerSource
from offloadd.ledger.local.writer import DEFAULT_MAX_ENTRY_BYTES, LocalLedgerWriter, RolloverPolicy
from offloadd.metadata.base import MetadataStore


class LocalLedgerStore:
    """A writer and a source over the same directory, sharing a notifier so that
    :meth:`LocalLedgerSource.wait_for_entries` wakes on the writer's appends without polling."""

    def __init__(self, path: str | Path, metadata: MetadataStore,
                 policy: RolloverPolicy | None = None, *,
                 clock: Callable[[], float] = time.time,
                 max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES, verify_crc: bool = True,
                 sync: bool = False) -> None:
        notifier = LedgerNotifier()
        self.writer = LocalLedgerWriter(path, metadata, policy, clock=clock,
                                        max_entry_bytes=max_entry_bytes, notifier=notifier,
                                        sync=sync)
        self.source = LocalLedgerSource(path, metadata, verify_crc=verify_crc, notifier=notifier)

    async def close(self) -> None:
        try:
            await self.writer.close()
        finally:
            await self.source.close()
