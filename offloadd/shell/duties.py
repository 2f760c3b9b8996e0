"""The daemon's background duties beside the topic tasks: retention and gc, merging small
segments, the read-back check, the re-probe of the store's conditional writes, and each topic's
lag. A part of :class:`~offloadd.shell.daemon.Daemon`, which holds the state they read.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from offloadd import wiring
from offloadd.blobstore.base import BlobStore, ConditionalWrites, StoreView, WriteFence
from offloadd.config import Settings
from offloadd.config.effective import EffectivePolicy
from offloadd.errors import OffloaddError
from offloadd.ledger.base import LedgerSource, SourceView
from offloadd.metadata import cas, managed_ledger
from offloadd.metadata.base import MetadataStore
from offloadd.metrics import Metrics
from offloadd.model import LedgerDesc, Position, TopicName, catalog
from offloadd.model.keys import CONDITIONAL_WRITES
from offloadd.offload.lag import LagMonitor
from offloadd.offload.policy import PolicySource
from offloadd.offload.scheduler import Running, Scheduler
from offloadd.offload.topic import TopicOffloader

# the daemon's lines keep its logger name wherever its code lives (operators filter on it)
log = logging.getLogger("offloadd.shell.daemon")


class Duties:
    """The background loops of :class:`~offloadd.shell.daemon.Daemon` (a mixin)."""

    # what the loops read of the daemon
    settings: Settings
    metadata: MetadataStore
    tier: StoreView
    blobstore: BlobStore
    source: LedgerSource
    source_view: SourceView
    metrics: Metrics | None
    policies: PolicySource
    scheduler: Scheduler
    lag_monitor: LagMonitor
    fence_probe_interval_s: float
    _ledgers_seen: dict[TopicName, list[LedgerDesc]]
    _lag_woken: set[TopicName]
    effective: Callable[[TopicName], EffectivePolicy]
    if TYPE_CHECKING:
        @property
        def topics(self) -> dict[TopicName, Running]: ...

    def _start_duties(self) -> list[asyncio.Task[None]]:
        """The background loops beside the topic tasks (the lag loop apart: it runs until the
        very end, to keep the figures moving while the topics close)."""
        duties = [asyncio.create_task(self._gc_loop(), name="gc"),
                  asyncio.create_task(self._read_check_loop(), name="read check")]
        if self.settings.compact.enabled:
            duties.append(asyncio.create_task(self._compact_loop(), name="compact"))
        fence = self.tier.fence
        if fence is not None and not fence.conditional.answered and \
                self.settings.blobstore.conditional_writes != "off":
            duties.append(asyncio.create_task(self._fence_probe_loop(fence), name="fence probe"))
        return duties

    async def _gc_loop(self) -> None:
        """Retention and garbage collection every ``[retention] interval_s`` (docs/retention.md):
        deletions of fully deleted segments, their retries, the orphan sweep."""
        from offloadd.retention.gc import gc_pass

        while True:
            await asyncio.sleep(self.settings.retention.interval_s)
            log.debug("gc pass starting")
            try:
                gcs = replace(wiring.gc_settings(self.settings), deletion_lag_ms=lambda t: (
                    self.effective(t).policy.deletion_lag_ms))
                report = await gc_pass(self.metadata, self.tier, self.source_view,
                                       gcs, now=time.time(),
                                       probe=self.metrics)
                log.debug("gc pass done")
                if not report.ok:
                    log.warning("gc pass left work pending: %s", report.to_json())
            except OffloaddError as exc:
                log.error("gc pass failed (retried next interval): %s", exc)

    async def _fence_probe_loop(self, fence: WriteFence) -> None:
        """The store did not answer the start-up probe of its create-only writes (an outage,
        a bucket not created yet, credentials not granted yet): ask again every
        ``fence_probe_interval_s`` until it does (docs/s3.md, "Conditional writes")."""
        while not fence.conditional.answered:
            await asyncio.sleep(self.fence_probe_interval_s)
            try:
                async with asyncio.timeout(2 * self.settings.blobstore.request_timeout_s):
                    found = await fence.probe_conditional_writes()
            except TimeoutError:
                continue
            if found.answered:
                log.info("blob store: conditional writes %s", found.how)
                await record_conditional_writes(self.metadata, found, "daemon")
                if self.metrics is not None:
                    self.metrics.conditional_writes(found.on)

    async def _compact_loop(self) -> None:
        """Merge small segments of the topics this daemon runs, every ``[compact] interval_s``
        (docs/retention.md, "Merging small segments"): under each topic task's own fence and
        the broker-wide throttle, a few merges per topic per pass."""
        from offloadd.shell.compact import compact_once

        # each segment's index is read once, not every pass (8,640 segments a day per topic)
        sizes: dict[TopicName, dict[uuid.UUID, int]] = {}
        while True:
            await asyncio.sleep(self.settings.compact.interval_s)
            for gone in set(sizes) - set(self.topics):
                del sizes[gone]
            for topic, running in list(self.topics.items()):
                name = str(topic)

                async def acquire(nbytes: int, name: str = name) -> float:
                    return await self.policies.acquire(nbytes, name)

                try:
                    rep = await compact_once(
                        self.settings, topic, self.metadata, self.tier, running.offloader.fence,
                        acquire=acquire, max_groups=self.settings.compact.max_merges_per_pass,
                        sizes=sizes.setdefault(topic, {}),
                        deletion_lag_ms=self.effective(topic).policy.deletion_lag_ms)
                except OffloaddError as exc:  # Fenced included: the topic moved on
                    log.warning("topic %s: merge pass failed (tried again next interval): %s",
                                topic, exc)
                    continue
                if rep.merged:
                    log.info("topic %s: merged %d group(s) of small segments (%d -> %d)", topic,
                             len(rep.merged), rep.segments_before, rep.segments_after)

    async def _read_check_loop(self) -> None:
        """Read back what each topic committed since the last look (offloadd/read/check.py)."""
        from offloadd.read.check import read_back

        checked: dict[TopicName, Position] = {}
        while True:
            interval = self.settings.offload.read_check_interval_s
            await asyncio.sleep(interval if interval > 0 else 60.0)
            if interval <= 0:
                continue  # off; a reload may turn it on
            for topic, r in list(self.topics.items()):
                done = r.offloader.last_committed
                if done is None or checked.get(topic) == done:
                    continue
                try:
                    sink = r.offloader.status_sink
                    seg = await read_back(self.metadata, self.blobstore, topic,
                                          r.offloader.probe, on_requests=(
                                              sink.read_requests if sink is not None else None))
                except Exception as exc:  # the check must outlive any failure; retried
                    log.warning("topic %s: reading the newest committed segment back from the "
                                "tier failed (readers will fail the same way): %s", topic, exc)
                    continue
                checked[topic] = done
                if seg is not None:
                    log.debug("topic %s: segment %s reads back", topic, seg.uid)
            for gone in set(checked) - set(self.topics):
                del checked[gone]

    def _lag_woken_add(self, topic: TopicName) -> None:
        self._lag_woken.add(topic)

    async def _lag_loop(self) -> None:
        """Every ``[daemon] lag_interval_s``: the lag of each running topic something happened
        to, from its last committed position to the source's LAC (offload/lag.py).
        Independent of the topic tasks, so the figures keep moving while uploads fail or the
        store hangs.

        A topic is measured again only when something may have moved it: with a source that
        says which topics changed (the embedded store's journal: ``follow``), a measured,
        recovered topic is *quiet* until its source records a change or it commits; its lag
        stays what it was, seconds aged by the readers (``Lag.aged``). An idle daemon then
        does nothing per topic here, open segments or not. Without such a source (or when it
        lost track) every running topic is measured every interval."""
        limit = asyncio.Semaphore(16)  # source calls in flight at once
        changes = self.source_view.changes
        follow = changes.follow() if changes is not None else None
        quiet: set[TopicName] = set()  # measured; nothing happened to them since
        restless: set[TopicName] = set()  # running and not quiet: measured every pass
        version = -1  # the scheduler's topic set the two sets were derived from
        last_pass_ms: int | None = None  # when the previous pass took the changes

        while True:
            await asyncio.sleep(self.settings.daemon.lag_interval_s)
            topics = self.topics
            if version != self.scheduler.version:
                version = self.scheduler.version
                for gone in set(self._ledgers_seen) - set(topics):
                    del self._ledgers_seen[gone]
                    self.lag_monitor.forget(gone)
                quiet &= topics.keys()
                restless = topics.keys() - quiet
            now_ms = int(time.time() * 1000)
            changed = follow() if follow is not None else None
            woken, self._lag_woken = self._lag_woken, set()
            # quiet topics woken by their own commit alone: the ledger list last read is still
            # the source's (it would have named them), only the committed position moved
            known: set[TopicName] = set()
            if changed is None:  # anything may have moved: measure every topic
                restless |= quiet
                quiet = set()
            else:
                known = (woken & quiet) - changed
                for topic in (changed | woken) & quiet:
                    quiet.discard(topic)
                    restless.add(topic)
                    # nothing was recorded for it by the previous pass: its tail was the one
                    # last seen until then (a bound for the new entries' age)
                    if last_pass_ms is not None:
                        self.lag_monitor.still(topic, until_ms=last_pass_ms)
            last_pass_ms = now_ms
            running = [(t, r.offloader) for t in restless
                       if (r := topics.get(t)) is not None and not r.task.done()]
            if not running:
                continue
            if changes is not None:
                for t, _ in running:  # (so the journal names the topic from now on)
                    changes.generation(t)
            results = await asyncio.gather(*(self._measure_lag(t, off, limit, t in known)
                                             for t, off in running),
                                           return_exceptions=True)
            for (topic, _), res in zip(running, results, strict=True):
                if isinstance(res, Exception):  # a bug must not stop the figures for good
                    log.error("lag of %s not measured: %r", topic, res)
                elif res is True and changed is not None and topic in restless:
                    restless.discard(topic)
                    quiet.add(topic)

    async def _measure_lag(self, topic: TopicName, off: TopicOffloader,
                           limit: asyncio.Semaphore, known: bool = False) -> bool:
        """Measure (``known``: from the ledger list last read, the source having changed
        nothing of the topic since); True when the topic may be left quiet until something
        happens."""
        async with limit:
            interval = self.settings.daemon.lag_interval_s
            measured = True
            try:
                seen = self._ledgers_seen.get(topic) if known else None
                if seen is not None:
                    ledgers = seen
                else:
                    async with asyncio.timeout(max(interval * 5, 10.0)):
                        ledgers = await self.source.ledgers(topic)
                    self._ledgers_seen[topic] = ledgers
            except (OffloaddError, TimeoutError) as exc:
                # the last list we had still gives growing seconds: better than a freeze
                log.debug("lag of %s: source unavailable (%s)", topic, exc)
                ledgers = self._ledgers_seen.get(topic, [])
                measured = False
                if not ledgers:
                    return False
            committed = off.last_committed
            if not off.recovered:  # recovery may be stuck on the store: ask the catalog
                try:
                    info, _ = await managed_ledger.load(self.metadata, topic.managed_ledger)
                except OffloaddError as exc:
                    log.debug("lag of %s: catalog unreadable (%s)", topic, exc)
                    return False
                done = [seg for seg in catalog.segments(info) if seg.complete]
                committed = done[-1].end if done else None
            lag = await self.lag_monitor.sample(topic, ledgers, committed)
            off.lag = lag
            off.probe.lag(lag.entries, lag.bytes, lag.seconds)
            return measured and off.recovered


async def record_conditional_writes(metadata: MetadataStore, found: ConditionalWrites,
                                    owner: str) -> None:
    """Keep the start-up probe's answer where ``offloadd status`` reads it (best effort)."""
    doc = {**found.to_json(), "owner": owner, "probed_ms": int(time.time() * 1000)}
    try:
        await cas.update(metadata, CONDITIONAL_WRITES,
                         lambda node: json.dumps(doc, sort_keys=True).encode(), create=True)
    except OffloaddError as exc:
        log.warning("could not record the conditional-write probe: %s", exc)
