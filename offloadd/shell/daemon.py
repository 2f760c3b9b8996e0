"""The daemon: the process around the scheduler — signals, reload, discovery passes, and the
background duties (retention and gc, the read-back check, lag).

Lifecycle ``NEW → RUNNING → STOPPING → STOPPED`` (:class:`~offloadd.model.lifecycle.Lifecycle`).
Signals (installed by :meth:`Daemon.run`): ``SIGUSR1`` closes every open segment now, ``SIGHUP``
reloads the configuration (throttle, policies) without dropping work, ``SIGTERM``/``SIGINT``
stop gracefully: no new entries are taken, open segments are closed and committed within
``shutdown_deadline_s``, and whatever is still in flight then is abandoned safely (nothing
half-committed; a later run redoes it). Which topics run is the scheduler's
(:mod:`offloadd.offload.scheduler`); this module reads the configuration for it.
"""

from __future__ import annotations

import asyncio
import fnmatch
import functools
import json
import logging
import os
import signal
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from offloadd import wiring
from offloadd.aio import first_of
from offloadd.blobstore.base import ConditionalWrites, StoreView, WriteFence
from offloadd.commit.batch import CommitBatcher
from offloadd.commit.ownership import Ownership
from offloadd.config import Settings
from offloadd.config.effective import EffectivePolicy
from offloadd.config.policy import OffloadPolicy
from offloadd.errors import OffloaddError
from offloadd.ledger.base import SourceView
from offloadd.ledger.metered import MeteredSource, SourceReadProbe
from offloadd.metadata import cas, managed_ledger
from offloadd.metadata.base import MetadataStore
from offloadd.metrics import Metrics
from offloadd.model import LedgerDesc, Position, TopicName, catalog
from offloadd.model.keys import CONDITIONAL_WRITES
from offloadd.model.lifecycle import Lifecycle
from offloadd.offload.buffer import OffloadBuffer
from offloadd.offload.context import OffloadMode
from offloadd.offload.lag import LagMonitor
from offloadd.offload.roller import RollPolicy
from offloadd.offload.scheduler import Running, Scheduler, SchedulerSettings
from offloadd.offload.threshold import Thresholds
from offloadd.offload.throttle import Throttle
from offloadd.offload.topic import OffloadEnv, TopicOffloader, TopicPolicy, TopicProbe
from offloadd.retry import Backoff
from offloadd.shell import policies
from offloadd.shell.memtrim import MemoryTrim, malloc_trim
from offloadd.shell.offload_now import OffloadNow, Served, offload_now
from offloadd.shell.policies import PulsarPolicyView

log = logging.getLogger(__name__)
MiB = 1024 * 1024
POLICY_MEMO = 4096  # TopicPolicy objects kept (one per namespace and per topic override)


ProbeFactory = Callable[[TopicName], TopicProbe]


class Daemon:
    def __init__(self, settings: Settings, *, source: SourceView, metadata: MetadataStore,
                 tier: StoreView, ownership: Ownership | None = None,
                 probe_factory: ProbeFactory | None = None,
                 on_buffer: Callable[[int, int], None] | None = None,
                 metrics: Metrics | None = None,
                 discovery_interval_s: float = 1.0,
                 pulsar_policies: PulsarPolicyView | None = None) -> None:
        self.settings = settings
        # Pulsar's namespace policies (sidecar mode), a level of each topic's policy
        self.pulsar_policies = pulsar_policies
        self._effective = policies.EffectivePolicies(pulsar_policies, wake=self._wake_namespace)
        self.source = source.source
        self.source_view = source
        self.metadata = metadata
        self.tier = tier
        self.blobstore = tier.store
        self.metrics = metrics
        self.fence_probe_interval_s = 30.0  # an unanswered conditional-write probe's retry
        if metrics is not None:
            metrics.throttle_limit(settings.offload.flow_permits_per_second)
        self.state = Lifecycle.NEW
        off = settings.offload
        self.buffer = OffloadBuffer(off.buffer_max_bytes, on_change=on_buffer)
        self._trim = MemoryTrim(self.buffer)
        self.throttle = Throttle(off.flow_permits_per_second, off.burst_bytes)
        # the pipeline reads through a wrapper that times each read per topic
        piped = self.source if probe_factory is None else MeteredSource(self.source,
                                                                        self._source_probe)
        env = OffloadEnv(
            source=piped, metadata=metadata, blobstore=self.blobstore, buffer=self.buffer,
            acquire=self._acquire, blocks_in_flight=off.blocks_in_flight,
            part_size=settings.blobstore.part_size_bytes,
            retry=Backoff(off.retry_base_s, off.retry_max_s),
            commits=CommitBatcher(metadata), on_progress=self._lag_woken_add,
            # a source that wakes its waiters when a topic changes needs no frequent look
            idle_poll_s=source.changes.idle_poll_s if source.changes is not None
            else OffloadEnv.idle_poll_s)
        self.scheduler = Scheduler(
            env, ownership=ownership or Ownership(), wanted=self.wanted, policy=self._policy_fn,
            probe=probe_factory or (lambda topic: None), settings=self._scheduler_settings,
            on_gone=self._forget,
            prepare=self._effective.prepare if pulsar_policies is not None else None)
        self._stop = asyncio.Event()
        self._discovery_interval = discovery_interval_s
        self.ready = False
        self.lag_monitor = LagMonitor(source.offsets)
        self._ledgers_seen: dict[TopicName, list[LedgerDesc]] = {}
        # topics whose committed position may have moved since the lag loop's last pass
        self._lag_woken: set[TopicName] = set()
        self._on_stopping: Callable[[], None] | None = None
        self._reloading: asyncio.Task[None] | None = None
        self._policies: dict[int, tuple[EffectivePolicy, Settings, TopicPolicy]] = {}

    @property
    def topics(self) -> dict[TopicName, Running]:
        """The running topic tasks (the scheduler's)."""
        return self.scheduler.topics

    @property
    def env(self) -> OffloadEnv:
        return self.scheduler.env

    def _source_probe(self, topic: TopicName) -> SourceReadProbe | None:
        r = self.topics.get(topic)
        return r.offloader.probe if r is not None else None

    def _forget(self, topic: TopicName) -> None:
        self._effective.forget(topic)
        if self.metrics is not None:
            self.metrics.forget_topic(topic.ns, str(topic))

    async def _acquire(self, nbytes: int, topic: str) -> float:
        """Take a block's bytes from the broker-wide budget in one request, reporting the wait
        per topic.

        One request, not pieces: a part goes to the store whole once its bytes are granted, and
        a topic has several parts waiting at once. Pieces of those parts would be served
        interleaved, so all of them would finish their pieces together and go to the store
        in one burst (4 MiB blocks at 1 MB/s: nothing for 50 s, then 50 MB). Whole requests
        leave the store one block at a time, evenly spaced; a block larger than the throttle's
        burst is granted on credit and paid back by the requests after it (throttle.py).
        """
        waited = await self.throttle.acquire(nbytes, topic)
        if self.metrics is not None:
            self.metrics.throttle_wait(topic, waited)
        return waited

    # ---- configuration -------------------------------------------------------------------
    def effective(self, topic: TopicName) -> EffectivePolicy:
        """``topic``'s offload policy over offloadd's levels and Pulsar's, with sources."""
        return self._effective.get(self.settings, topic)

    def _wake_namespace(self, ns: str) -> None:
        for t, r in self.topics.items():  # idle topics sleep long: let them see it now
            if t.ns == ns:
                r.offloader.wake.set()

    def policy(self, topic: TopicName) -> TopicPolicy:
        s = self.settings
        eff = self.effective(topic)
        # one TopicPolicy per effective policy (a namespace's, mostly), not one per topic and
        # step: an idle topic's task holds the one it last read (issue 22)
        hit = self._policies.get(id(eff))
        if hit is not None and hit[0] is eff and hit[1] is s:
            return hit[2]
        if len(self._policies) >= POLICY_MEMO:  # reloads and Pulsar policy changes
            self._policies.clear()
        made = self._make_policy(eff.policy)
        self._policies[id(eff)] = (eff, s, made)
        return made

    def _make_policy(self, p: OffloadPolicy) -> TopicPolicy:
        s = self.settings
        return TopicPolicy(RollPolicy(max_bytes=max(int(p.max_size_per_segment_mbytes * MiB), 1),
                                      max_age_s=p.max_segment_rollover_time_minutes * 60,
                                      max_block_size=p.max_block_size_bytes,
                                      min_block_size=min(s.min_block_size(p),
                                                         p.max_block_size_bytes)),
                           mode=OffloadMode(p.mode),
                           thresholds=Thresholds.from_config(p.threshold_bytes,
                                                             p.threshold_seconds))

    def _policy_fn(self, topic: TopicName) -> Callable[[], TopicPolicy]:
        return functools.partial(self.policy, topic)  # (smaller than a closure)

    def _scheduler_settings(self) -> SchedulerSettings:
        d = self.settings.daemon
        return SchedulerSettings(shutdown_deadline_s=d.shutdown_deadline_s,
                                 status_interval_s=d.status_interval_s)

    def reload(self, settings: Settings) -> None:
        """Apply a new configuration to running work (SIGHUP).

        Live: the throttle, every offload policy level (read on each roll decision), topic
        patterns, the log level. Keys that only take effect after a restart are named in a
        warning rather than silently ignored.
        """
        old, self.settings = self.settings, settings
        self.throttle.set_rate(settings.offload.flow_permits_per_second,
                               settings.offload.burst_bytes)
        if self.metrics is not None:
            self.metrics.throttle_limit(settings.offload.flow_permits_per_second)
        for r in self.topics.values():  # idle topics sleep long: let them see new policies
            r.offloader.wake.set()
        self.scheduler.rescan()  # the topic patterns may have changed
        logging.getLogger().setLevel(settings.daemon.log_level)
        later = [k for k in _restart_keys(old) if _dig(old, k) != _dig(settings, k)]
        if later:
            log.warning("SIGHUP: changed %s: takes effect after a restart", ", ".join(later))
        log.info("configuration reloaded: flow_permits_per_second=%s",
                 settings.offload.flow_permits_per_second)

    def wanted(self, topic: TopicName) -> bool:
        pats = self.settings.source.topics
        return not pats or any(fnmatch.fnmatchcase(str(topic), p) for p in pats)

    # ---- control -------------------------------------------------------------------------
    def trigger(self, topics: list[TopicName] | None = None) -> None:
        self.scheduler.trigger(topics)

    def default_trigger_topics(self) -> list[TopicName] | None:
        """What an offload-now naming no topic closes: ``[daemon] offload_now_topics`` (fnmatch
        patterns) of the running topics, or every topic (None) when that is empty."""
        pats = self.settings.daemon.offload_now_topics
        if not pats:
            return None
        return [t for t in self.topics if any(fnmatch.fnmatchcase(str(t), p) for p in pats)]

    async def offload_now(self, topics: list[TopicName] | None = None, *, wait: bool = False,
                          timeout_s: float = 300.0, poll_s: float = 0.1) -> list[OffloadNow]:
        """Close the open segments of ``topics`` (default: :meth:`default_trigger_topics`) at
        each topic's tail as it is now; with ``wait``, until that segment is committed, an
        attempt at it fails, or ``timeout_s`` passes (``offloadd offload-now --wait``, the
        control endpoint). Like ``pulsar-admin topics offload -w`` + ``offload-status -w``.
        """
        names = topics if topics is not None else self.default_trigger_topics()
        if names is None:
            names = list(self.topics)
        return await offload_now(Served(lambda: self.topics, self.policy, self.source,
                                        self.env.wall_ms), names, wait=wait,
                                 timeout_s=timeout_s, poll_s=poll_s)

    def request_stop(self) -> None:
        if self.state in (Lifecycle.NEW, Lifecycle.RUNNING):
            self.state = self.state.to(Lifecycle.STOPPING)
            log.info("stopping: no new entries; closing open segments within %.0fs",
                     self.settings.daemon.shutdown_deadline_s)
            if self._on_stopping is not None:
                self._on_stopping()
        self.scheduler.stopping = True  # a discovery pass under way starts no more topics
        self._stop.set()

    # ---- running -------------------------------------------------------------------------
    async def run(self, *, install_signals: bool = True,
                  reload: Callable[[], Settings] | None = None,
                  on_ready: Callable[[], Awaitable[None] | None] | None = None,
                  trigger_file: Path | None = None,
                  on_stopping: Callable[[], None] | None = None) -> None:
        loop = asyncio.get_running_loop()
        self._on_stopping = on_stopping
        installed = self._install_signals(trigger_file, reload) if install_signals else []
        if self.state is Lifecycle.NEW:
            self.state = self.state.to(Lifecycle.RUNNING)
        duties = self._start_duties()
        lag_task = asyncio.create_task(self._lag_loop(), name="lag")
        try:
            first = True
            while not self._stop.is_set():
                self.scheduler.wake.clear()
                await self.scheduler.step()
                if first:
                    first = False
                    self.ready = True
                    if on_ready is not None:
                        res = on_ready()
                        if res is not None:
                            await res
                if self._trim.due():  # quiet: give back what catching up pooled
                    await asyncio.to_thread(malloc_trim)
                await self._pause()
            for t in duties:
                t.cancel()
            await asyncio.gather(*duties, return_exceptions=True)
            await self.scheduler.shutdown()
            if self.env.commits is not None:  # the last status records' batch, if in flight
                await self.env.commits.close(timeout_s=5.0)
        finally:
            for t in (*duties, lag_task):
                t.cancel()
            await asyncio.gather(*duties, lag_task, return_exceptions=True)
            for sig in installed:
                loop.remove_signal_handler(sig)
            self.state = self.state.to(Lifecycle.STOPPED)
            self.ready = False

    def _install_signals(self, trigger_file: Path | None,
                         reload: Callable[[], Settings] | None) -> list[int]:
        """SIGUSR1 closes segments now, SIGTERM/SIGINT stop, SIGHUP reloads (with ``reload``);
        the signals installed, to remove at the end."""
        handlers: dict[int, Callable[[], None]] = {
            signal.SIGUSR1: lambda: self._signal_trigger(trigger_file),
            signal.SIGTERM: self.request_stop,
            signal.SIGINT: self.request_stop,
        }
        if reload is not None:
            handlers[signal.SIGHUP] = lambda: self._signal_reload(reload)
        loop = asyncio.get_running_loop()
        for sig, fn in handlers.items():
            loop.add_signal_handler(sig, fn)
        return list(handlers)

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
                    return await self._acquire(nbytes, name)

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
            if changed is None:  # anything may have moved: measure every topic
                restless |= quiet
                quiet = set()
            else:
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
            results = await asyncio.gather(*(self._measure_lag(t, off, limit)
                                             for t, off in running),
                                           return_exceptions=True)
            for (topic, _), res in zip(running, results, strict=True):
                if isinstance(res, Exception):  # a bug must not stop the figures for good
                    log.error("lag of %s not measured: %r", topic, res)
                elif res is True and changed is not None and topic in restless:
                    restless.discard(topic)
                    quiet.add(topic)

    async def _measure_lag(self, topic: TopicName, off: TopicOffloader,
                           limit: asyncio.Semaphore) -> bool:
        """Measure; True when the topic may be left quiet until something happens."""
        async with limit:
            interval = self.settings.daemon.lag_interval_s
            measured = True
            try:
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

    def _signal_trigger(self, trigger_file: Path | None) -> None:
        """SIGUSR1: all topics, or those ``offloadd offload-now --topic`` wrote down."""
        names: list[TopicName] | None = None
        if trigger_file is not None:
            try:
                text = trigger_file.read_text()
                trigger_file.unlink()
                names = [TopicName.parse(line.strip()) for line in text.splitlines()
                         if line.strip()] or None
            except FileNotFoundError:
                pass
            except (OSError, OffloaddError) as exc:
                log.warning("SIGUSR1: ignoring trigger file %s: %s", trigger_file, exc)
        if names is None:
            names = self.default_trigger_topics()
        log.info("SIGUSR1: closing open segments now (%s)",
                 "all topics" if names is None else ", ".join(map(str, names)) or "no topic")
        self.trigger(names)

    def _signal_reload(self, reload: Callable[[], Settings]) -> None:
        if self._reloading is not None and not self._reloading.done():
            log.warning("SIGHUP: a reload is already under way; ignoring this one")
            return
        self._reloading = asyncio.ensure_future(self._reload(reload))

    async def _reload(self, reload: Callable[[], Settings]) -> None:
        try:
            # reading and validating the file is blocking I/O: keep it off the event loop
            self.reload(await asyncio.to_thread(reload))
        except OffloaddError as exc:
            log.error("SIGHUP: configuration not reloaded, keeping the old one: %s", exc)

    async def _pause(self) -> None:
        """Until the next pass is due, a stop is requested or the ownership hook wakes us."""
        await first_of(self._stop.wait(), self.scheduler.wake.wait(),
                       timeout=self._discovery_interval)

    def status(self) -> dict[str, Any]:
        health = self.tier.health
        ready, reason = health.readiness() if health is not None else (True, "")
        return {
            "state": self.state.value,
            "pid": os.getpid(),
            "metadata": wiring.deployment(self.settings),
            "store_circuit": health.state.value if health is not None else "healthy",
            "store_ready": ready,
            "store_reason": reason,
            "conditional_writes": (self.tier.fence.conditional.to_json()
                                   if self.tier.fence is not None else None),
            "throttle": {"bytes_per_s": self.throttle.rate, "waiting": self.throttle.waiting},
            "buffer": {"used": self.buffer.used, "cap": self.buffer.cap},
            "topics": {str(t): dict(r.offloader.status()) for t, r in self.topics.items()},
            "source": wiring.source_status(self.settings, self.source),
        }


# ---- reload ----------------------------------------------------------------------------------
def _restart_keys(settings: Settings) -> list[str]:
    """Configuration read once at start: a SIGHUP that changes these says so."""
    keys = [f"{sec}.{k}" for sec in ("metadata", "blobstore", "metrics", "lakehouse")
            for k in type(getattr(settings, sec)).model_fields]
    return [*keys, "source.kind", "source.path", "source.pulsar_policies",
            "source.pulsar_configuration_zk", "daemon.pid_file", "daemon.log_format",
            "offload.buffer_max_bytes", "offload.blocks_in_flight", "offload.retry_base_s",
            "offload.retry_max_s"]


def _dig(settings: Settings, key: str) -> object:
    section, _, name = key.partition(".")
    return getattr(getattr(settings, section), name)

async def record_conditional_writes(metadata: MetadataStore, found: ConditionalWrites,
                                    owner: str) -> None:
    """Keep the start-up probe's answer where ``offloadd status`` reads it (best effort)."""
    doc = {**found.to_json(), "owner": owner, "probed_ms": int(time.time() * 1000)}
    try:
        await cas.update(metadata, CONDITIONAL_WRITES,
                         lambda node: json.dumps(doc, sort_keys=True).encode(), create=True)
    except OffloaddError as exc:
        log.warning("could not record the conditional-write probe: %s", exc)
