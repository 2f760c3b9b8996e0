"""The metadata-store protocol: a small ZooKeeper-shaped, versioned key space.

Paths are absolute (``/a/b``) and relative to the store's root (ZooKeeper chroot, embedded
database). Every node has bytes and a version that starts at 0 on create and grows by one on
every ``set``. ``set``/``delete`` with ``version >= 0`` are compare-and-set: they raise
:class:`~offloadd.errors.Conflict` when the node's version differs. ``version = -1`` means
"whatever it is". Backend exceptions never escape an implementation; callers see only
:mod:`offloadd.errors` (``NotFound``, ``Conflict``, ``Retriable``, ``Fatal``).

Implementations: ``embedded.py`` (SQLite, several processes on one machine),
``zookeeper/`` (kazoo), ``memory.py`` (unit tests).

Optional capabilities: :class:`Sessions`, a store whose ephemeral nodes live in a session that
can be suspended and lost (ZooKeeper). :mod:`offloadd.wiring` hands it to cluster ownership and
the circuit gauge; the embedded and memory stores end a session only when the process ends.
:class:`BatchedMulti`, a store that applies many independent ``multi`` groups in one request
(one SQLite transaction, one ZooKeeper ``multi``) with a refusal failing only its own group;
:class:`offloadd.commit.batch.CommitBatcher` uses it to commit many topics at once.
:class:`BatchedReads`, a store that reads many nodes in one go (``offloadd status``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from offloadd.errors import OffloaddError


@dataclass(frozen=True)
class Versioned:
    data: bytes
    version: int
    # ZooKeeper's zxid of the node's last change (-1 from stores without one). Unlike
    # ``version`` it only grows, also across a delete and re-create, so it orders two reads of
    # a node. Not part of equality: it describes the read, not the content.
    mzxid: int = field(default=-1, compare=False)


@dataclass(frozen=True)
class CreateOp:
    path: str
    data: bytes
    ephemeral: bool = False


@dataclass(frozen=True)
class SetOp:
    path: str
    data: bytes
    version: int = -1


@dataclass(frozen=True)
class DeleteOp:
    path: str
    version: int = -1


@dataclass(frozen=True)
class CheckOp:
    """Fails the transaction unless ``path`` is at ``version``."""

    path: str
    version: int


Op = CreateOp | SetOp | DeleteOp | CheckOp


@runtime_checkable
class MetadataStore(Protocol):
    async def get(self, path: str) -> Versioned:
        """The node's bytes and version; ``NotFound`` if absent."""
        ...

    async def exists(self, path: str) -> bool: ...

    async def create(self, path: str, data: bytes, *, ephemeral: bool = False,
                     sequential: bool = False, make_parents: bool = True) -> str:
        """Create a node and return its path (with the sequence suffix when ``sequential``).

        ``Conflict`` if it exists. ``make_parents`` creates missing ancestors as empty nodes.
        Ephemeral nodes vanish when this store's session ends (``close()`` or process death).
        """
        ...

    async def set(self, path: str, data: bytes, version: int = -1) -> int:
        """Replace the bytes (CAS on ``version`` unless -1); returns the new version."""
        ...

    async def delete(self, path: str, version: int = -1, *, recursive: bool = False) -> None:
        """Delete the node; ``NotFound`` if absent, ``Conflict`` on version mismatch."""
        ...

    async def children(self, path: str) -> list[str]:
        """Names (not paths) of the direct children, sorted; ``NotFound`` if absent."""
        ...

    async def multi(self, ops: Sequence[Op]) -> list[int | str | None]:
        """Apply all ops atomically or none (``Conflict``/``NotFound`` names the failing op).

        Returns per op: the created path, the new version, or None.
        """
        ...

    async def close(self) -> None: ...


# One group's outcome in :meth:`BatchedMulti.multi_batch`: what ``multi`` would have returned,
# or the error it would have raised (``Conflict``, ``NotFound``, ``Fatal``).
GroupResult = list[int | str | None] | OffloaddError


@runtime_checkable
class BatchedMulti(Protocol):
    async def multi_batch(self, groups: Sequence[Sequence[Op]]) -> list[GroupResult]:
        """Apply each group as its own ``multi`` (all its ops or none), in order, in one request.

        A group whose op is refused (a stale version, a failed check, a node absent or already
        there) gets that error in its slot and changes nothing; the other groups still apply,
        seeing the effects of the groups before them as if each had been its own ``multi``. An
        error of the request itself (``Retriable``: the store busy or unreachable, and then any
        group may or may not have been applied) raises for all.
        """
        ...


@runtime_checkable
class BatchedReads(Protocol):
    async def get_many(self, paths: Sequence[str]) -> list[Versioned | None]:
        """The nodes at ``paths`` (None where absent), read together; not one snapshot."""
        ...


class Sessions(Protocol):
    """A store with sessions; its states are an enum valued ``connected``, ``suspended`` and
    ``lost`` (a lost session took its ephemeral nodes with it)."""

    @property
    def session_id(self) -> int | None:
        """The current session's id while connected (a new one after ``lost``)."""
        ...

    @property
    def session_state(self) -> enum.Enum: ...

    def add_session_listener(self, listener: Callable[[Any], object]) -> Callable[[], None]:
        """Call ``listener(state)`` on the event loop at each transition; returns the remover."""
        ...
