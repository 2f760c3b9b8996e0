"""Pulsar's persistent managed-ledger names, kept up to date by ZooKeeper children watches.

The tree is ``/managed-ledgers/<tenant>/<namespace>/persistent/<topic>``: one children watch on
``/managed-ledgers``, one per tenant and one per namespace's ``persistent`` node (which a watch
waits for while it does not exist). The daemon lists its topics every discovery pass (each
second); answering from the watches' last deliveries costs ZooKeeper nothing while the tree stays
as it is, where reading it would cost one read per namespace per pass. Watches survive
reconnects and session loss (they are re-armed and re-read), so nothing is missed meanwhile.

Callbacks only record what they were given (they run on the loop, between awaits); the watches
of new tenants and namespaces are armed, and those of removed ones cancelled, by the next
:meth:`ManagedLedgerNames.names`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from offloadd.metadata.zookeeper import Watch
from offloadd.model.keys import MANAGED_LEDGERS

__all__ = ["ManagedLedgerNames"]

K = TypeVar("K")

_ARMING = 32  # watches armed at once when many tenants or namespaces appear

ChildrenWatcher = Callable[[str, Callable[[list[str] | None], object]], Awaitable[Watch]]


class _Level:
    """One watched node's children (and the watch, once armed)."""

    def __init__(self) -> None:
        self.children: tuple[str, ...] = ()
        self.watch: Watch | None = None

    def cancel(self) -> None:
        if self.watch is not None:
            self.watch.cancel()
            self.watch = None


class ManagedLedgerNames:
    """Every ``tenant/ns/persistent/topic`` under ``/managed-ledgers``, from watches.
    ``watch_children(path, callback)`` arms a level-triggered children watch (see
    :class:`~offloadd.metadata.zookeeper.Watch`)."""

    def __init__(self, watch_children: ChildrenWatcher) -> None:
        self._watch_children = watch_children
        self._root: _Level | None = None
        self._tenants: dict[str, _Level] = {}
        self._namespaces: dict[tuple[str, str], _Level] = {}
        self._stale = True  # a tenant or namespace came or went: watches to arm or cancel
        self._names: tuple[str, ...] | None = None  # the answer, until a list changes
        self._lock = asyncio.Lock()

    def _changed(self, level: _Level, structure: bool) -> Callable[[list[str] | None], None]:
        def deliver(children: Sequence[str] | None) -> None:
            level.children = tuple(children or ())
            self._names = None
            if structure:
                self._stale = True
        return deliver

    async def names(self) -> tuple[str, ...]:
        """The names as the watches last delivered them (arming what is new first): the same
        tuple object until one of them changes, so callers can keep what they derive from it."""
        async with self._lock:
            if self._root is None:
                root = _Level()
                root.watch = await self._watch_children(MANAGED_LEDGERS,
                                                        self._changed(root, True))
                self._root = root
            while self._stale:
                self._stale = False
                await self._reconcile(self._root)
            if self._names is None:
                self._names = tuple(f"{tenant}/{ns}/persistent/{local}"
                                    for (tenant, ns), level in self._namespaces.items()
                                    for local in level.children)
            return self._names

    async def _reconcile(self, root: _Level) -> None:
        """Arm the watches of new tenants and namespaces, cancel those of removed ones."""
        tenants = set(root.children)
        for gone in set(self._tenants) - tenants:
            self._tenants.pop(gone).cancel()
        await self._arm_all([(t, f"{MANAGED_LEDGERS}/{t}") for t in tenants
                             if t not in self._tenants], self._tenants, True)
        wanted = {(t, ns) for t, level in self._tenants.items() for ns in level.children}
        for key in set(self._namespaces) - wanted:
            self._namespaces.pop(key).cancel()
            self._names = None
        await self._arm_all([(key, f"{MANAGED_LEDGERS}/{key[0]}/{key[1]}/persistent")
                             for key in wanted if key not in self._namespaces],
                            self._namespaces, False)

    async def _arm_all(self, todo: list[tuple[K, str]], into: dict[K, _Level],
                       structure: bool) -> None:
        limit = asyncio.Semaphore(_ARMING)

        async def arm(key: K, path: str) -> None:
            async with limit:
                level = _Level()
                level.watch = await self._watch_children(path, self._changed(level, structure))
                into[key] = level
                self._names = None

        results = await asyncio.gather(*(arm(k, p) for k, p in todo), return_exceptions=True)
        errs = [r for r in results if isinstance(r, BaseException)]
        if errs:
            self._stale = True  # what failed is armed on the next call
            raise errs[0]

    def close(self) -> None:
        for level in (self._root, *self._tenants.values(), *self._namespaces.values()):
            if level is not None:
                level.cancel()
        self._root = None
        self._tenants.clear()
        self._namespaces.clear()
        self._names = None
        self._stale = True
