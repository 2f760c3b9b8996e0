"""Level-triggered watches on the ZooKeeper store (:class:`Watch`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Literal, Protocol

from kazoo.client import KazooClient

from offloadd.errors import NotFound, OffloaddError, Retriable
from offloadd.metadata.base import Versioned
from offloadd.metadata.zookeeper.bridge import Bridge
from offloadd.metadata.zookeeper.session import SessionState

log = logging.getLogger(__name__)

ChildrenCallback = Callable[[list[str] | None], object]
DataCallback = Callable[[Versioned | None], object]

_UNSET = object()


class WatchOwner(Protocol):
    """What a watch needs of its store (:class:`.store.ZooKeeperMetadataStore`)."""

    watches: set[Watch]
    bridge: Bridge

    @property
    def session_state(self) -> SessionState: ...

    @property
    def client(self) -> KazooClient: ...

    def absolute(self, path: str) -> str: ...

    async def call(self, start: Callable[[], Any], what: str, path: str) -> Any: ...


class Watch:
    """A level-triggered watch: the callback gets the current state now and after every change.

    Children watches deliver the sorted child names, data watches a :class:`Versioned`; both
    deliver ``None`` while the node does not exist, and keep watching for it to appear. Equal
    consecutive states are delivered once. The watch survives reconnects and session loss (it is
    re-armed and re-read, so changes made while disconnected are seen). Callbacks run on the
    event loop; a callback returning an awaitable is run as a task.
    """

    def __init__(self, store: WatchOwner, path: str,
                 kind: Literal["children", "data"], callback: Callable[[Any], object]) -> None:
        self.path, self.kind = path, kind
        self.armed = False
        self._store, self._callback = store, callback
        self._cancelled = False
        # one read at a time: a change seen while reading asks for one more (_again)
        self._running, self._again = False, False
        self._last: object = _UNSET

    @property
    def active(self) -> bool:
        return not self._cancelled

    def cancel(self) -> None:
        """No further callbacks (kazoo may still fire its watch once; it is ignored)."""
        self._cancelled = True
        self._store.watches.discard(self)

    def _fired(self, event: Any) -> None:
        """kazoo's watch callback: runs in kazoo's thread."""
        if self._cancelled:
            return
        lost = event.type == "NONE"  # kazoo drops every watch when the connection drops
        self._store.bridge.from_kazoo_thread(self._on_lost if lost else self.rearm)

    def _on_lost(self) -> None:
        self.armed = False
        # kazoo delivers this from its callback thread and the reconnect from its connection
        # thread: if the reconnect already reached the loop, nobody else will re-arm us.
        if self._store.session_state is SessionState.CONNECTED:
            self.rearm()

    def rearm(self) -> None:
        """Re-read and re-arm (on the loop); coalesces requests while a read is in flight."""
        if self._cancelled:
            return
        if self._running:
            self._again = True
            return
        self._running = True
        self._store.bridge.spawn(self._run())

    async def _run(self) -> None:
        try:
            while True:
                self._again = False
                try:
                    await self.arm()
                except Retriable as exc:
                    # Re-armed when the session is connected again (see Session), or soon if
                    # it already is (the failure raced a reconnect).
                    self.armed = False
                    log.debug("watch on %s not re-armed yet: %s", self.path, exc)
                    if self._store.session_state is SessionState.CONNECTED:
                        self._store.bridge.loop.call_later(0.2, self.rearm)
                except OffloaddError:
                    log.exception("watch on %s failed; it stops", self.path)
                    self.cancel()
                if not self._again or self._cancelled:
                    return
        finally:
            self._running = False

    async def arm(self) -> None:
        """Read the node (and set kazoo's watch on it); deliver what changed."""
        store = self._store
        zk, full = store.client, store.absolute(self.path)
        value: object
        while True:
            try:
                if self.kind == "children":
                    names = await store.call(lambda: zk.get_children_async(full, self._fired),
                                             "children", self.path)
                    value = sorted(names)
                else:
                    data, stat = await store.call(lambda: zk.get_async(full, self._fired),
                                                  "get", self.path)
                    value = Versioned(bytes(data or b""), stat.version, stat.mzxid)
                break
            except NotFound:
                stat = await store.call(lambda: zk.exists_async(full, self._fired),
                                        "exists", self.path)
                if stat is None:
                    value = None
                    break
                # Created between the two reads: the exists-watch is set; read it again.
        self.armed = True
        if self._cancelled or value == self._last:
            return
        self._last = value
        store.bridge.invoke(self._callback, value, f"watch callback for {self.path}")
