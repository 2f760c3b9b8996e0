"""The ZooKeeper session as the event loop sees it (:class:`Session`).

``connected``, ``suspended`` (connection lost, session may survive: stop committing, keep
state) or ``lost`` (session expired: every ephemeral node of ours is gone, so drop ownership and
re-validate before acting again). kazoo reconnects by itself with a new session after ``lost``;
the store stays usable. Listeners see each transition on the event loop (not the initial
connect, and not a deliberate close).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Callable
from typing import Any

from offloadd.metadata.zookeeper.bridge import Bridge
from offloadd.metadata.zookeeper.url import ZooKeeperUrl

log = logging.getLogger(__name__)


class SessionState(enum.Enum):
    CONNECTED = "connected"
    SUSPENDED = "suspended"
    LOST = "lost"


SessionListener = Callable[[SessionState], object]

_KAZOO_STATES = {"CONNECTED": SessionState.CONNECTED, "SUSPENDED": SessionState.SUSPENDED,
                 "LOST": SessionState.LOST}


class Session:
    """Tracks kazoo's state listener; ``on_connect`` runs on the loop at each (re)connect."""

    def __init__(self, bridge: Bridge, url: ZooKeeperUrl, client: Any,
                 on_connect: Callable[[], None]) -> None:
        self.state = SessionState.LOST
        self.id: int | None = None
        self.connected = asyncio.Event()  # set while connected
        self.closed = False  # a closing store tells nobody
        self._ever_connected = False
        self._bridge, self._url, self._client = bridge, url, client
        self._on_connect = on_connect
        self._listeners: list[SessionListener] = []

    def add_listener(self, listener: SessionListener) -> Callable[[], None]:
        """Call ``listener(state)`` on the event loop at each transition; returns the remover."""
        self._listeners.append(listener)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._listeners.remove(listener)

        return remove

    def kazoo_listener(self, state: str) -> None:
        """kazoo's state listener: runs in kazoo's connection thread; must not block."""
        mapped = _KAZOO_STATES.get(state)
        if mapped is None:
            return
        client_id = self._client.client_id if mapped is SessionState.CONNECTED else None
        session = client_id[0] if client_id else None
        self._bridge.from_kazoo_thread(lambda: self._on_state(mapped, session))

    def ended(self) -> None:
        """The client stopped: no session any more."""
        self.state, self.id = SessionState.LOST, None
        self.connected.clear()

    def _on_state(self, state: SessionState, session: int | None) -> None:
        if self.closed:
            return
        previous, self.state, self.id = self.state, state, session
        if state is SessionState.CONNECTED:
            self.connected.set()
        else:
            self.connected.clear()
        if previous is state:
            return
        # the first connect is the store opening (which says so itself), not a transition
        first = state is SessionState.CONNECTED and not self._ever_connected
        self._ever_connected = self._ever_connected or first
        level = logging.WARNING if state is not SessionState.CONNECTED else \
            logging.DEBUG if first else logging.INFO
        log.log(level, "ZooKeeper session %s -> %s (%s%s)", "new" if first else previous.value,
                state.value, self._url, f", session 0x{session:x}" if session else "")
        if state is SessionState.CONNECTED:
            self._on_connect()
        for listener in list(self._listeners):
            self._bridge.invoke(listener, state, "session listener")
