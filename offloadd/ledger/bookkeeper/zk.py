"""Read-only access to the ZooKeeper of a Pulsar cluster (Pulsar's and BookKeeper's trees).

Sidecar rule: offloadd never writes Pulsar's metadata — a compare-and-set race with the broker
would fence the broker's managed ledger. :class:`PulsarZooKeeper` therefore offers reads and
watches only. It opens its session *without* a chroot (so that opening can never create one)
and prefixes Pulsar's chroot itself; the session carries no ACL of its own, so even a bug could
not create nodes Pulsar would then be unable to change. Reads need ``READ`` on the nodes (Pulsar's
default ACL is open); ``digest`` credentials can be supplied for secured clusters.

Errors are those of :mod:`offloadd.metadata.zookeeper` (``NotFound``, ``Retriable``, ``Fatal``);
the session reconnects by itself after a loss and its watches are re-armed and re-read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from offloadd import errors
from offloadd.metadata.base import Versioned
from offloadd.metadata.zookeeper import (
    SessionListener,
    SessionState,
    Watch,
    ZooKeeperMetadataStore,
    ZooKeeperUrl,
)

log = logging.getLogger(__name__)

__all__ = ["PulsarZooKeeper"]


class PulsarZooKeeper:
    """Reads and watches under Pulsar's chroot. Open with :meth:`open`."""

    def __init__(self, store: ZooKeeperMetadataStore, chroot: str) -> None:
        self._store = store
        self._chroot = chroot

    @classmethod
    async def open(cls, url: str, *, session_timeout_s: float = 10.0,
                   connect_timeout_s: float = 15.0,
                   auth: Sequence[tuple[str, str]] = ()) -> PulsarZooKeeper:
        try:
            parsed = ZooKeeperUrl.parse(url)
        except ValueError as exc:
            raise errors.ConfigError(f"[source] pulsar_zk: {exc}") from None
        store = await ZooKeeperMetadataStore.open(
            f"zk://{parsed.connect_string}", session_timeout_s=session_timeout_s,
            connect_timeout_s=connect_timeout_s, auth=auth)
        return cls(store, parsed.chroot)

    def _abs(self, path: str) -> str:
        return self._chroot + path if self._chroot else path

    async def get(self, path: str) -> Versioned:
        return await self._store.get(self._abs(path))

    async def children(self, path: str) -> list[str]:
        return await self._store.children(self._abs(path))

    async def watch_data(self, path: str, callback: Callable[[Versioned | None], object]
                         ) -> Watch:
        return await self._store.watch_data(self._abs(path), callback)

    async def watch_children(self, path: str, callback: Callable[[list[str] | None], object]
                             ) -> Watch:
        return await self._store.watch_children(self._abs(path), callback)

    def add_session_listener(self, listener: SessionListener) -> Callable[[], None]:
        return self._store.add_session_listener(listener)

    @property
    def session_state(self) -> SessionState:
        return self._store.session_state

    @property
    def session_id(self) -> int | None:
        return self._store.session_id

    async def close(self) -> None:
        await self._store.close()

    def __repr__(self) -> str:
        return f"PulsarZooKeeper({self._store!r}, chroot={self._chroot or '/'!r}, read-only)"
