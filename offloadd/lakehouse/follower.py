"""The projection as a task beside the offload daemon (``[lakehouse] enabled``).

It only reads what the daemon committed (the catalog and the tier), so it needs no coordination
with the offload pipeline: started after the daemon, stopped before the stores close. With the
daemon's metrics, a second task reports every table's lag, rows, files and last snapshot
(:mod:`offloadd.lakehouse.ops`) every ``interval_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from typing import Any

from offloadd.blobstore.base import BlobStore
from offloadd.config import Settings
from offloadd.lakehouse.projector import Projector, TopicReport
from offloadd.metadata import managed_ledger
from offloadd.metadata.base import MetadataStore
from offloadd.metadata.schemas import SchemaReader
from offloadd.model import TopicName

__all__ = ["LakehouseFollower", "report_tables"]

log = logging.getLogger(__name__)


async def report_tables(settings: Settings, metadata: MetadataStore, metrics: Any) -> int:
    """One report of every projected table to ``metrics`` (:class:`offloadd.metrics.Metrics`);
    how many tables were reported. Per namespace when ``[metrics] topic_level`` is off: the
    metrics aggregate (lag seconds and snapshot time: max; the others: sum)."""
    from offloadd.lakehouse.ops import lakehouse_status

    names = [TopicName.from_managed_ledger(n) for n in await managed_ledger.list_names(metadata)]
    st = await lakehouse_status(settings, metadata, names, int(time.time() * 1000),
                                warehouse=False)
    nan = math.nan
    for t in st["tables"]:
        topic = TopicName.parse(t["topic"])
        metrics.topic(topic.ns, str(topic)).lakehouse_table(
            nan if t["lag_entries"] is None else t["lag_entries"],
            nan if t["lag_seconds"] is None else t["lag_seconds"], t["rows"], t["data_files"],
            nan if t["last_snapshot_ms"] is None else t["last_snapshot_ms"] / 1000)
    return len(st["tables"])


class LakehouseFollower:
    def __init__(self, settings: Settings, metadata: MetadataStore,
                 blobstore: BlobStore, metrics: Any = None,
                 schemas: SchemaReader | None = None) -> None:
        self.settings = settings
        self.metadata = metadata
        self.metrics = metrics
        self.projector = Projector(settings, metadata, blobstore, schemas=schemas)
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._reporter: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.projector.run(self._stop), name="lakehouse")
            log.info("lakehouse: following the tier into Iceberg tables")
        if self.metrics is not None and self._reporter is None:
            self._reporter = asyncio.create_task(self._report(), name="lakehouse-metrics")

    async def _report(self) -> None:
        while not self._stop.is_set():
            try:
                await report_tables(self.settings, self.metadata, self.metrics)
            except Exception as exc:  # no catalog yet, a locked SQLite: next time
                log.debug("lakehouse: table metrics not updated: %r", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.settings.lakehouse.interval_s)

    async def catch_up(self) -> list[TopicReport]:
        """Stop following, then project whatever is committed now (a final pass)."""
        await self.stop()
        return await self.projector.sync()

    async def stop(self) -> None:
        """Let the pass under way finish its commit (a cancelled worker thread would go on
        regardless), then end."""
        self._stop.set()
        for task in (self._task, self._reporter):
            if task is not None:
                with contextlib.suppress(Exception):
                    await task
        self._task = self._reporter = None
