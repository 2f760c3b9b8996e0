"""A process's composition: the configured stores, source, daemon and metrics, opened and
closed together (used by ``run``, ``standalone`` and the tests)."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

from offloadd import wiring
from offloadd.blobstore.base import BlobStore
from offloadd.cluster import ClusterOwnership, check_owner_id
from offloadd.config import Settings
from offloadd.daemon import Daemon, Ownership, default_owner_id
from offloadd.ledger.base import LedgerSource
from offloadd.ledger.local import LocalLedgerStore
from offloadd.metadata.base import MetadataStore

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    settings: Settings
    metadata: MetadataStore
    blobstore: BlobStore
    source: LedgerSource
    daemon: Daemon
    local: LocalLedgerStore | None = None
    extras: list[Any] = field(default_factory=list)

    @classmethod
    async def open(cls, settings: Settings, *, with_writer: bool = False,
                   ownership: Ownership | None = None) -> Runtime:
        # A process that only tails (`offloadd run`) may share its topics with other daemons:
        # it joins the cluster (alone, it owns every topic). `standalone` writes its topics
        # itself and owns them all.
        owner_id = (check_owner_id(settings.daemon.owner_id or default_owner_id())
                    if ownership is None and not with_writer else None)
        metadata = await wiring.open_metadata(settings)
        try:
            blobstore = await wiring.open_blobstore(settings)
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
        daemon = Daemon(settings, source=source, metadata=metadata, blobstore=blobstore,
                        ownership=ownership)
        return cls(settings, metadata, blobstore, source, daemon, local)

    async def start_metrics(self) -> None:
        return None

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
