"""The lifecycle every long-lived component goes through, as data (so that every component
reports and checks it the same way)::

    NEW ──start──▶ RUNNING ──stop──▶ STOPPING ──▶ STOPPED
     └─────────────stop (never started)──────────▶ (STOPPING)

The daemon and each topic task say which state they are in and move only along these arrows;
:meth:`Lifecycle.to` refuses any other move. Self moves are allowed (a second stop request).
"""

from __future__ import annotations

import enum

__all__ = ["IllegalLifecycle", "Lifecycle"]


class IllegalLifecycle(Exception):
    """A component was asked to move between states its lifecycle does not connect."""


class Lifecycle(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"

    def to(self, new: Lifecycle) -> Lifecycle:
        """``new`` if the move is allowed, else :class:`IllegalLifecycle`."""
        if new is not self and new not in _NEXT[self]:
            raise IllegalLifecycle(f"cannot go from {self.value} to {new.value}")
        return new


_NEXT: dict[Lifecycle, frozenset[Lifecycle]] = {
    Lifecycle.NEW: frozenset({Lifecycle.RUNNING, Lifecycle.STOPPING, Lifecycle.STOPPED}),
    Lifecycle.RUNNING: frozenset({Lifecycle.STOPPING, Lifecycle.STOPPED}),
    Lifecycle.STOPPING: frozenset({Lifecycle.STOPPED}),
    Lifecycle.STOPPED: frozenset(),
}
