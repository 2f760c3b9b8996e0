"""The daemon: the process around the scheduler — signals, reload, discovery passes, and the
background duties (retention and gc, the read-back check, lag). The duties' loops are in
:mod:`offloadd.shell.duties`, the signal handlers in :mod:`offloadd.shell.signals`.

Lifecycle ``NEW → RUNNING → STOPPING → STOPPED`` (:class:`~offloadd.model.lifecycle.Lifecycle`).
Signals (installed by :meth:`Daemon.run`): ``SIGUSR1`` closes every open segment now, ``SIGHUP``
reloads the configuration (throttle, policies) without dropping work, ``SIGTERM``/``SIGINT``
stop gracefully: no new entries are taken, open segments are closed and committed, a few at a
time, for ``stop_close_budget_s``; then at most 64 closes under way are abandoned and the other
open segments are left as a crash leaves them (nothing half-committed; the next start commits
them), all within ``shutdown_deadline_s`` (:meth:`Scheduler.shutdown` has the rule). Which
topics run is the scheduler's (:mod:`offloadd.offload.scheduler`); this module reads the
configuration for it.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from offloadd import wiring
from offloadd.blobstore.base import StoreView
from offloadd.commit.batch import CommitBatcher
from offloadd.commit.ownership import Ownership
from offloadd.config import Settings
from offloadd.config.effective import EffectivePolicy
from offloadd.ledger.base import SourceView
from offloadd.ledger.metered import MeteredSource, SourceReadProbe
from offloadd.metadata.base import MetadataStore
from offloadd.metrics import Metrics
from offloadd.model import LedgerDesc, TopicName
from offloadd.model.lifecycle import Lifecycle
from offloadd.model.system_topics import is_system_topic
from offloadd.offload.buffer import OffloadBuffer
from offloadd.offload.lag import LagMonitor
from offloadd.offload.policy import PolicySource
from offloadd.offload.scheduler import Running, Scheduler
from offloadd.offload.throttle import Throttle
from offloadd.offload.topic import OffloadEnv, TopicProbe
from offloadd.retry import Backoff
from offloadd.shell import gctune, policies
from offloadd.shell.duties import Duties
from offloadd.shell.memtrim import MemoryTrim, malloc_trim
from offloadd.shell.offload_now import OffloadNow, Served, offload_now
from offloadd.shell.policies import PulsarPolicyView
from offloadd.shell.signals import Signals

log = logging.getLogger(__name__)


ProbeFactory = Callable[[TopicName], TopicProbe]


class Daemon(Duties, Signals):
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
        # what the pipeline reads of the configuration, in one object (offload/policy.py)
        self.policies = PolicySource(
            Throttle(off.flow_permits_per_second, off.burst_bytes),
            keys=lambda t: wiring.policy_keys(self.settings, self.effective(t).policy),
            scheduler=lambda: wiring.scheduler_settings(self.settings),
            on_wait=metrics.throttle_wait if metrics is not None else None)
        # the pipeline reads through a wrapper that times each read per topic
        piped = self.source if probe_factory is None else MeteredSource(self.source,
                                                                        self._source_probe)
        env = OffloadEnv(
            source=piped, metadata=metadata, blobstore=self.blobstore, buffer=self.buffer,
            acquire=self.policies.acquire, blocks_in_flight=off.blocks_in_flight,
            part_size=settings.blobstore.part_size_bytes,
            retry=Backoff(off.retry_base_s, off.retry_max_s),
            commits=CommitBatcher(metadata), on_progress=self._lag_woken_add,
            # a source that wakes its waiters when a topic changes needs no frequent look
            idle_poll_s=source.changes.idle_poll_s if source.changes is not None
            else OffloadEnv.idle_poll_s)
        self.scheduler = Scheduler(
            env, ownership=ownership or Ownership(), wanted=self.wanted, policies=self.policies,
            probe=probe_factory or (lambda topic: None), on_gone=self._forget,
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

    @property
    def topics(self) -> dict[TopicName, Running]:
        """The running topic tasks (the scheduler's)."""
        return self.scheduler.topics

    @property
    def throttle(self) -> Throttle:
        return self.policies.throttle

    @property
    def env(self) -> OffloadEnv:
        return self.scheduler.env

    def _source_probe(self, topic: TopicName) -> SourceReadProbe | None:
        r = self.topics.get(topic)
        return r.offloader.probe if r is not None else None

    def _forget(self, topic: TopicName) -> None:
        self._effective.forget(topic)
        self.policies.forget(topic)
        if self.metrics is not None:
            self.metrics.forget_topic(topic.ns, str(topic))

    # ---- configuration -------------------------------------------------------------------
    def effective(self, topic: TopicName) -> EffectivePolicy:
        """``topic``'s offload policy over offloadd's levels and Pulsar's, with sources."""
        return self._effective.get(self.settings, topic)

    def _wake_namespace(self, ns: str) -> None:
        for t, r in self.topics.items():  # idle topics sleep long: let them see it now
            if t.ns == ns:
                r.offloader.wake.set()

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
        if is_system_topic(topic):  # Pulsar never offloads them (__change_events, ...)
            return False
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
        return await offload_now(Served(lambda: self.topics, self.policies.policy, self.source,
                                        self.env.wall_ms), names, wait=wait,
                                 timeout_s=timeout_s, poll_s=poll_s)

    def request_stop(self) -> None:
        if self.state in (Lifecycle.NEW, Lifecycle.RUNNING):
            self.state = self.state.to(Lifecycle.STOPPING)
            stop = wiring.scheduler_settings(self.settings)
            log.info("stopping: no new entries; closing open segments for %.0fs, exiting "
                     "within %.0fs", stop.stop_close_budget(), stop.shutdown_deadline_s)
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
        with gctune.tuned():  # thousands of topics' objects: collections were 18-42 s
            await self._run(install_signals=install_signals, reload=reload, on_ready=on_ready,
                            trigger_file=trigger_file, on_stopping=on_stopping)

    async def _run(self, *, install_signals: bool,
                   reload: Callable[[], Settings] | None,
                   on_ready: Callable[[], Awaitable[None] | None] | None,
                   trigger_file: Path | None,
                   on_stopping: Callable[[], None] | None) -> None:
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
            log.info("stop: duties ended; stopping %d topic(s)", len(self.topics))
            await self.scheduler.shutdown()
            if self.env.commits is not None:  # the last status records' batch, if in flight
                await self.env.commits.close(timeout_s=5.0)
            log.info("stop: done")
        finally:
            for t in (*duties, lag_task):
                t.cancel()
            await asyncio.gather(*duties, lag_task, return_exceptions=True)
            for sig in installed:
                loop.remove_signal_handler(sig)
            self.state = self.state.to(Lifecycle.STOPPED)
            self.ready = False

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
