"""The projection as a task beside the offload daemon (``[lakehouse] enabled``).

It only reads what the daemon committed (the catalog and the tier), so it needs no coordination
with the offload pipeline: started after the daemon, stopped before the stores close.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from offloadd.blobstore.base import BlobStore
from offloadd.config import Settings
from offloadd.lakehouse.projector import Projector, TopicReport
from offloadd.metadata.base import MetadataStore

__all__ = ["LakehouseFollower"]

log = logging.getLogger(__name__)


class LakehouseFollower:
    def __init__(self, settings: Settings, metadata: MetadataStore,
                 blobstore: BlobStore) -> None:
        self.projector = Projector(settings, metadata, blobstore)
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.projector.run(self._stop), name="lakehouse")
            log.info("lakehouse: following the tier into Iceberg tables")

    async def catch_up(self) -> list[TopicReport]:
        """Stop following, then project whatever is committed now (a final pass)."""
        await self.stop()
        return await self.projector.sync()

    async def stop(self) -> None:
        """Let the pass under way finish its commit (a cancelled worker thread would go on
        regardless), then end."""
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task
            self._task = None
