"""A process's composition: the configured stores, source, daemon and metrics, opened and
closed together (used by ``run``, ``standalone`` and the tests)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from offloadd import wiring
from offloadd.blobstore.base import BlobStore, StoreView
from offloadd.commit.cluster import ClusterOwnership, check_owner_id
from offloadd.commit.ownership import Ownership, process_owner_id
from offloadd.config import Settings
from offloadd.errors import ConfigError
from offloadd.ledger.base import LedgerSource, SourceView
from offloadd.ledger.local import LocalLedgerStore
from offloadd.metadata.base import MetadataStore, Sessions
from offloadd.metrics import Metrics
from offloadd.model import TopicName
from offloadd.shell import policies
from offloadd.shell.daemon import Daemon
from offloadd.shell.duties import record_conditional_writes
from offloadd.shell.httpserver import MetricsServer

log = logging.getLogger(__name__)

# the store-health states as the metrics' circuit-breaker vocabulary
_CIRCUIT = {"healthy": "closed", "degraded-paused": "open", "recovering": "half_open"}
# a ZooKeeper session as a circuit: requests flow only while connected
_SESSION = {"connected": "closed", "suspended": "open", "lost": "open"}


def _watch_circuits(metrics: Metrics, sessions: Sessions | None, tier: StoreView) -> None:
    """``offloadd_store_circuit_state`` for both stores from the start: a blob store without a
    circuit breaker (the in-memory one) is always closed; the metadata store follows its
    ZooKeeper session (the embedded store has none: always closed)."""
    if tier.health is None:
        metrics.store_circuit("closed")
    if sessions is None:
        metrics.store_circuit("closed", store="metadata")
        return
    metrics.store_circuit(_SESSION.get(sessions.session_state.value, "open"), store="metadata")
    sessions.add_session_listener(
        lambda s: metrics.store_circuit(_SESSION.get(s.value, "open"), store="metadata"))


@dataclass
class Runtime:
    settings: Settings
    metadata: MetadataStore
    blobstore: BlobStore
    source: LedgerSource
    daemon: Daemon
    local: LocalLedgerStore | None = None
    metrics: Metrics = field(default_factory=Metrics)
    extras: list[Any] = field(default_factory=list)
    server: MetricsServer | None = None
    lakehouse: Any = None  # a LakehouseFollower when [lakehouse] enabled
    tier: StoreView | None = None  # the blob store with its capabilities
    view: SourceView | None = None  # the source with its capabilities

    @classmethod
    async def open(cls, settings: Settings, *, with_writer: bool = False,
                   ownership: Ownership | None = None) -> Runtime:
        # A process that only tails (`offloadd run`) may share its topics with other daemons:
        # it joins the cluster (alone, it owns every topic). `standalone` writes its topics
        # itself and owns them all.
        owner_id = (check_owner_id(settings.daemon.owner_id or process_owner_id())
                    if ownership is None and not with_writer else None)
        level = settings.metrics.topic_level
        metrics = Metrics(topic_level=None if level == "auto" else level)
        conn = await wiring.connect_metadata(settings)
        metadata = conn.store
        try:
            tier = await wiring.open_tier(
                settings, on_circuit=lambda state: metrics.store_circuit(
                    _CIRCUIT.get(state, state)), on_request=metrics.blobstore_request,
                    probe_writes=True)
        except BaseException:
            await metadata.close()
            raise
        if tier.fence is not None:
            await record_conditional_writes(metadata, tier.fence.conditional,
                                            owner_id or "standalone")
            if settings.blobstore.conditional_writes != "off":
                metrics.conditional_writes(tier.fence.conditional.on)
        _watch_circuits(metrics, conn.sessions, tier)
        local: LocalLedgerStore | None = None
        if with_writer:
            local = wiring.open_local_store(settings, metadata)
            view = wiring.local_view(local.source)
        else:
            view = wiring.connect_source(settings, metadata)
        if owner_id is not None:
            ownership = ClusterOwnership(metadata, owner_id, sessions=conn.sessions)
        if view.metrics is not None:  # e.g. the BookKeeper client's
            metrics.adopt(view.metrics)
        pulsar = policies.open_pulsar_policies(settings, view.source, metadata)
        daemon = Daemon(settings, source=view, metadata=metadata, tier=tier,
                        ownership=ownership,
                        probe_factory=lambda t: metrics.topic(t.ns, str(t)),
                        on_buffer=metrics.buffer, metrics=metrics, pulsar_policies=pulsar)
        rt = cls(settings, metadata, tier.store, view.source, daemon, local, metrics,
                 tier=tier, view=view)
        if pulsar is not None:
            rt.extras.append(pulsar)
        return rt

    async def start_metrics(self) -> None:
        """Serve /metrics, /healthz, /readyz and /status when ``[metrics] enabled``."""
        if not self.settings.metrics.enabled or self.server is not None:
            return
        token = self.settings.metrics.control_token
        self.server = MetricsServer(self.settings.metrics.bind, metrics=self.metrics,
                                    ready=self.ready, status=self.daemon.status,
                                    offload_now=self.offload_now,
                                    control_token=token.get_secret_value() if token else None,
                                    bind_retry_s=self.settings.metrics.bind_retry_s)
        await self.server.start()
        self.extras.append(self.server)
        log.info("metrics on %s/metrics", self.server.url)

    async def offload_now(self, topics: list[str] | None, wait: bool,
                          timeout_s: float) -> list[Mapping[str, Any]]:
        """The control endpoint's offload-now (``ValueError`` for a bad topic name)."""
        names = None
        if topics is not None:
            try:
                names = [TopicName.parse(t) for t in topics]
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
        done = await self.daemon.offload_now(names, wait=wait, timeout_s=timeout_s)
        return [r.to_json() for r in done]

    async def start_lakehouse(self, *, optional: bool = False) -> None:
        """Follow the tier into Iceberg tables when ``[lakehouse] enabled`` (docs/lakehouse.md).
        ``optional``: without the lakehouse extra, say so and go on (the standalone demo)."""
        if not self.settings.lakehouse.enabled or self.lakehouse is not None:
            return
        from offloadd import lakehouse

        try:
            lakehouse.require()
        except ConfigError as exc:
            if not optional:
                raise
            log.warning("lakehouse projection off: %s", exc)
            return
        from offloadd.lakehouse.follower import LakehouseFollower

        self.lakehouse = LakehouseFollower(
            self.settings, self.metadata, self.blobstore, self.metrics,
            schemas=wiring.schema_reader(self.settings, self.metadata, self.source))
        self.lakehouse.start()
        self.extras.append(self.lakehouse)

    async def ready(self) -> tuple[bool, str]:
        """Ready: the daemon runs, the metadata store answers, the blob store's circuit is not
        open (it opens within two request deadlines of the store going silent) and the store
        refuses nothing (no such bucket, access denied...: see StoreHealth.readiness)."""
        if not self.daemon.ready:
            return False, f"daemon is {self.daemon.state.value}"
        try:
            await self.metadata.exists("/")
        except Exception as exc:
            return False, f"metadata store unreachable: {exc}"
        health = self.tier.health if self.tier is not None else None
        if health is not None:
            ok, why = health.readiness()
            if not ok:
                return False, why
        return True, f"offloading {len(self.daemon.topics)} topic(s)"

    async def close(self) -> None:
        for extra in reversed(self.extras):
            with contextlib.suppress(Exception):
                await extra.stop()
        with contextlib.suppress(Exception):
            if self.local is not None:
                await self.local.close()
            else:
                await self.source.close()
        with contextlib.suppress(Exception):
            await self.blobstore.close()
        with contextlib.suppress(Exception):
            await self.metadata.close()

