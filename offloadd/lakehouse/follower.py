"""The projection as a task beside the offload daemon (``[lakehouse] enabled``).

It only reads what the daemon committed (the catalog and the tier), so it needs no coordination
with the offload pipeline: started after the daemon, stopped before the stores close. With the
daemon's metrics, a second task reports every table's lag, rows, files, last snapshot and held
entries (:mod:`offloadd.lakehouse.ops`) every ``interval_s`` from what the projector saw on its
last pass, and each pass's read-committed counts go to the namespace's counters.
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

__all__ = ["LakehouseFollower", "report_pass", "report_stats", "report_tables"]

log = logging.getLogger(__name__)


async def report_tables(settings: Settings, metadata: MetadataStore, metrics: Any) -> int:
    """One report of every projected table to ``metrics`` (:class:`offloadd.metrics.Metrics`),
    read from the catalog and the managed ledgers; how many tables were reported. The
    follower reports what its projector holds instead (:func:`report_stats`, no I/O)."""
    from offloadd.lakehouse.ops import TableStats, lakehouse_status

    names = [TopicName.from_managed_ledger(n) for n in await managed_ledger.list_names(metadata)]
    st = await lakehouse_status(settings, metadata, names, int(time.time() * 1000),
                                warehouse=False)
    fields = set(TableStats.__dataclass_fields__)
    return report_stats(metrics, [TableStats(**{k: v for k, v in t.items() if k in fields})
                                  for t in st["tables"]])


def report_stats(metrics: Any, tables: list[Any]) -> int:
    """Each table's figures (:class:`~offloadd.lakehouse.ops.TableStats`) to ``metrics``; per
    namespace when ``[metrics] topic_level`` is off (lag seconds and snapshot time: max; the
    others: sum). Held entries are per namespace only."""
    nan = math.nan
    for t in tables:
        topic = TopicName.parse(t.topic)
        probe = metrics.topic(topic.ns, str(topic))
        probe.lakehouse_table(
            nan if t.lag_entries is None else t.lag_entries,
            nan if t.lag_seconds is None else t.lag_seconds, t.rows, t.data_files,
            nan if t.last_snapshot_ms is None else t.last_snapshot_ms / 1000)
        probe.lakehouse_held(t.held_entries)
    return len(tables)


def report_pass(metrics: Any, reports: list[TopicReport]) -> None:
    """What one pass's read-committed kept out of each table, counted per namespace."""
    for r in reports:
        c = r.read_committed
        if any(c.__dict__.values()):
            topic = TopicName.parse(r.topic)
            metrics.topic(topic.ns, str(topic)).lakehouse_read_committed(
                c.markers, c.aborted_messages, c.timed_out_messages, c.transactions_committed,
                c.transactions_aborted, c.transactions_timed_out)


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
            on_pass = None if self.metrics is None else \
                (lambda reps: report_pass(self.metrics, reps))
            self._task = asyncio.create_task(self.projector.run(self._stop, on_pass),
                                             name="lakehouse")
            log.info("lakehouse: following the tier into Iceberg tables")
        if self.metrics is not None and self._reporter is None:
            self._reporter = asyncio.create_task(self._report(), name="lakehouse-metrics")

    async def _report(self) -> None:
        while not self._stop.is_set():
            # from what the projector holds after its last pass: no catalog or metadata read,
            # so a thousand tables cost a few milliseconds here (lag seconds aged to now)
            try:
                report_stats(self.metrics, await asyncio.to_thread(
                    self.projector.table_stats, int(time.time() * 1000)))
            except Exception as exc:  # a table being changed under it: next time
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
