"""A process's composition: the configured stores, source, daemon and metrics, opened and
closed together (used by ``run``, ``standalone`` and the tests)."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

from offloadd import wiring
from offloadd.blobstore.base import BlobStore
from offloadd.blobstore.health import StoreHealth
from offloadd.cluster import ClusterOwnership, check_owner_id
from offloadd.config import Settings
from offloadd.daemon import Daemon, Ownership, default_owner_id
from offloadd.httpserver import MetricsServer
from offloadd.ledger.base import LedgerSource
from offloadd.ledger.local import LocalLedgerStore
from offloadd.metadata.base import MetadataStore
from offloadd.metrics import Metrics

log = logging.getLogger(__name__)

# the store-health states as the metrics' circuit-breaker vocabulary
_CIRCUIT = {"healthy": "closed", "degraded-paused": "open", "recovering": "half_open"}


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

    @classmethod
    async def open(cls, settings: Settings, *, with_writer: bool = False,
                   ownership: Ownership | None = None) -> Runtime:
        # A process that only tails (`offloadd run`) may share its topics with other daemons:
        # it joins the cluster (alone, it owns every topic). `standalone` writes its topics
        # itself and owns them all.
        owner_id = (check_owner_id(settings.daemon.owner_id or default_owner_id())
                    if ownership is None and not with_writer else None)
        metrics = Metrics()
        metadata = await wiring.open_metadata(settings)
        try:
            blobstore = await wiring.open_blobstore(
                settings, on_circuit=lambda state: metrics.store_circuit(
                    _CIRCUIT.get(state, state)))
        except BaseException:
            await metadata.close()
            raise
        local: LocalLedgerStore | None = None
        if with_writer:
            local = wiring.open_local_store(settings, metadata)
            source: LedgerSource = local.source
        else:
            source = wiring.open_source(settings, metadata)
        if owner_id is not None:
            ownership = ClusterOwnership(metadata, owner_id)
        source_metrics = getattr(source, "metrics", None)  # e.g. the BookKeeper source's
        if source_metrics is not None and hasattr(source_metrics, "register"):
            source_metrics.register(metrics.registry)
        daemon = Daemon(settings, source=source, metadata=metadata, blobstore=blobstore,
                        ownership=ownership,
                        probe_factory=lambda t: metrics.topic(t.ns, str(t)),
                        on_buffer=metrics.buffer, metrics=metrics)
        return cls(settings, metadata, blobstore, source, daemon, local, metrics)

    async def start_metrics(self) -> None:
        """Serve /metrics, /healthz, /readyz and /status when ``[metrics] enabled``."""
        if not self.settings.metrics.enabled or self.server is not None:
            return
        self.server = MetricsServer(self.settings.metrics.bind, metrics=self.metrics,
                                    ready=self.ready, status=self.daemon.status)
        await self.server.start()
        self.extras.append(self.server)
        log.info("metrics on %s/metrics", self.server.url)

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
        health = getattr(self.blobstore, "health", None)
        if isinstance(health, StoreHealth):
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
