"""Pulsar's namespace offload policies, watched in its metadata store (sidecar mode).

One data watch per namespace of a topic this daemon offloads, on
``/admin/policies/<tenant>/<namespace>`` (kazoo watch: no polling; a change, or a reconnect,
re-reads that one node). :meth:`NamespacePolicies.prepare` arms it before the namespace's first
topic starts, so the topic's first decision already sees the policy;
:meth:`NamespacePolicies.get` is what the daemon asks on every roll decision (no I/O).

A node that does not parse (:func:`~offloadd.metadata.pulsar_policies.parse_namespace_policies`)
is logged at WARNING naming the node, and the last good policy of the namespace stays in force
(none if it never parsed); a node that does not exist sets nothing. Neither stops anything.

Topic-level policies are not here: Pulsar keeps them in each namespace's ``__change_events``
system topic (Avro records, compacted), not in the metadata store; they are followed by
:mod:`offloadd.ledger.change_events` (docs/sidecar.md, "Topic policies").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from offloadd.errors import ConfigError, FormatError, NotFound, OffloaddError
from offloadd.ledger.bookkeeper.zk import PulsarZooKeeper
from offloadd.metadata.base import Versioned
from offloadd.metadata.pulsar_policies import (
    PulsarOffloadPolicy,
    namespace_policies_path,
    parse_namespace_policies,
)
from offloadd.metadata.zookeeper import Watch, ZooKeeperUrl

log = logging.getLogger(__name__)

__all__ = ["ConfigurationStore", "NamespacePolicies", "NamespacePolicy", "read_namespace_policy"]

RETRY_S = 5.0  # a watch that could not be armed (session down) is tried again this often


@dataclass(frozen=True)
class NamespacePolicy:
    """A namespace's Pulsar policy as last read: ``policy`` in force (None: none), ``error``
    why the node's current bytes were not used."""

    path: str
    policy: PulsarOffloadPolicy | None = None
    error: str | None = None


def _state(path: str, node: Versioned | None, last: PulsarOffloadPolicy | None
           ) -> NamespacePolicy:
    if node is None:
        return NamespacePolicy(path)
    try:
        return NamespacePolicy(path, parse_namespace_policies(node.data, path))
    except FormatError as exc:
        kept = "keeping its last good policy" if last is not None else "ignoring it"
        return NamespacePolicy(path, last, f"{exc.problem} ({kept})")


async def read_namespace_policy(zk: PulsarZooKeeper, ns: str) -> NamespacePolicy:
    """One read of ``ns``'s node, no watch (the read-only commands: ``status``)."""
    path = namespace_policies_path(ns)
    try:
        node: Versioned | None = await zk.get(path)
    except NotFound:
        node = None
    return _state(path, node, None)


class ConfigurationStore:
    """A read-only session of its own to Pulsar's configuration store, for when it is not the
    ZooKeeper of ``[source] pulsar_zk`` (``[source] pulsar_configuration_zk``): opened on first
    use; :meth:`close` ends it."""

    def __init__(self, url: str, *, session_timeout_s: float = 10.0,
                 connect_timeout_s: float = 15.0,
                 auth: Sequence[tuple[str, str]] = ()) -> None:
        try:
            ZooKeeperUrl.parse(url)
        except ValueError as exc:
            raise ConfigError(f"[source] pulsar_configuration_zk: {exc}") from None
        self.url = url
        self._opts = (session_timeout_s, connect_timeout_s, tuple(auth))
        self._zk: PulsarZooKeeper | None = None
        self._lock = asyncio.Lock()

    async def __call__(self) -> PulsarZooKeeper:
        async with self._lock:
            if self._zk is None:
                timeout, connect, auth = self._opts
                self._zk = await PulsarZooKeeper.open(self.url, session_timeout_s=timeout,
                                                      connect_timeout_s=connect, auth=auth)
            return self._zk

    async def close(self) -> None:
        async with self._lock:
            zk, self._zk = self._zk, None
        if zk is not None:
            await zk.close()


class NamespacePolicies:
    """The watched namespace policies. ``open_zk`` gives the session to Pulsar's configuration
    store; ``on_change(ns)`` is called when a namespace's policy in force changes."""

    def __init__(self, open_zk: Callable[[], Awaitable[PulsarZooKeeper]],
                 on_change: Callable[[str], None] | None = None, *,
                 close_zk: Callable[[], Awaitable[None]] | None = None) -> None:
        self._open_zk = open_zk
        self._close_zk = close_zk  # a session of the watcher's own (ConfigurationStore)
        self.on_change = on_change
        self._states: dict[str, NamespacePolicy] = {}
        self._watches: dict[str, Watch] = {}
        self._arming: dict[str, asyncio.Future[None]] = {}
        self._retries: dict[str, asyncio.Task[None]] = {}
        self._closed = False

    def get(self, ns: str) -> NamespacePolicy | None:
        """``ns``'s policy as last read (None: not read yet)."""
        return self._states.get(ns)

    async def prepare(self, ns: str) -> None:
        """Watch ``ns``'s node (once per namespace; concurrent callers share the read). A
        failure is logged and the watch tried again in the background; never raised."""
        if ns in self._watches or self._closed:
            return
        fut = self._arming.get(ns)
        if fut is None:
            fut = asyncio.ensure_future(self._arm(ns))
            self._arming[ns] = fut
            fut.add_done_callback(lambda _f: self._arming.pop(ns, None))
        await asyncio.shield(fut)

    async def _arm(self, ns: str) -> None:
        path = namespace_policies_path(ns)
        try:
            zk = await self._open_zk()
            self._watches[ns] = await zk.watch_data(path, lambda node: self._changed(ns, node))
        except OffloaddError as exc:
            log.warning("Pulsar's offload policy of namespace %s (%s) not read yet: %s; "
                        "offloadd's own levels apply meanwhile, trying again in %.0fs",
                        ns, path, exc, RETRY_S)
            if ns not in self._retries and not self._closed:
                self._retries[ns] = asyncio.ensure_future(self._retry(ns))

    async def _retry(self, ns: str) -> None:
        try:
            while ns not in self._watches and not self._closed:
                await asyncio.sleep(RETRY_S)
                await self._arm(ns)
        finally:
            self._retries.pop(ns, None)

    def _changed(self, ns: str, node: Versioned | None) -> None:
        old = self._states.get(ns)
        new = _state(namespace_policies_path(ns), node, old.policy if old else None)
        self._states[ns] = new
        if new.error is not None:
            log.warning("Pulsar's offload policy node %s is malformed: %s", new.path, new.error)
        elif old is None:
            if node is None:  # Pulsar writes it when it creates the namespace
                log.warning("namespace %s: no Pulsar policy node %s; only offloadd's own "
                            "levels apply (is Pulsar's configuration store elsewhere? set "
                            "[source] pulsar_configuration_zk: docs/sidecar.md)", ns,
                            new.path)
            elif new.policy is not None and not new.policy.empty:
                log.info("namespace %s: Pulsar's offload policy (%s): %s", ns, new.path,
                         new.policy.describe())
        elif old.policy != new.policy:
            log.info("namespace %s: Pulsar's offload policy changed (%s): %s", ns, new.path,
                     new.policy.describe() if new.policy is not None else "node removed")
        if old is not None and old.policy != new.policy and self.on_change is not None:
            self.on_change(ns)

    async def close(self) -> None:
        self._closed = True
        for w in self._watches.values():
            w.cancel()
        self._watches.clear()
        tasks = [*self._retries.values(), *self._arming.values()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._close_zk is not None:
            await self._close_zk()

    async def stop(self) -> None:  # as the runtime stops its extras
        await self.close()
