"""Fences: what keeps a process that lost a topic from committing anything of it.

Every write of a topic's catalog, status or ownership carries its owner's fence::

    guard_ops()  -> ops that fail the transaction once this process no longer owns the topic
    verify()     -> raise ``Fenced`` if this process no longer owns the topic

:class:`EpochFence` is the fence of one acquisition of a topic (:mod:`offloadd.commit.epochs`):
``guard_ops() == [CheckOp(/offloadd/topics/<ml>, epoch - 1)]``, so a stale owner's commit fails
as a whole however late it arrives. :class:`NoFence` is for a process that owns everything
(``standalone`` on its embedded store). :func:`take` acquires a topic and returns its fence
(``None`` while another session owns it); :func:`give_back` releases it. Whoever assigns
segments of a topic — the streaming daemon or a backfill — holds it this way, so that at most
one of them assigns at a time.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from offloadd.commit import epochs
from offloadd.errors import OffloaddError
from offloadd.metadata.base import MetadataStore, Op

log = logging.getLogger(__name__)

__all__ = ["EpochFence", "Fence", "NoFence", "give_back", "give_back_quietly", "take"]


class Fence(Protocol):
    def guard_ops(self) -> Sequence[Op]:
        """Ops that fail the transaction once this process no longer owns the topic."""
        ...

    async def verify(self) -> None:
        """Raise ``Fenced`` if this process no longer owns the topic."""
        ...


class NoFence:
    """For a single process that owns everything (``standalone`` on the embedded store)."""

    def guard_ops(self) -> Sequence[Op]:
        return ()

    async def verify(self) -> None:
        return None


@dataclass(frozen=True)
class EpochFence:
    """The fence of one acquisition (epoch) of one topic by ``owner_id``."""

    store: MetadataStore
    ml_name: str
    epoch: int
    owner_id: str = ""

    def guard_ops(self) -> Sequence[Op]:
        return (epochs.fence_op(self.ml_name, self.epoch),)

    async def verify(self) -> None:
        await epochs.check_epoch(self.store, self.ml_name, self.epoch)


async def take(store: MetadataStore, ml_name: str, owner_id: str) -> EpochFence | None:
    """Own the topic for this store's session; ``None`` if another session owns it now."""
    epoch = await epochs.try_acquire(store, ml_name, owner_id)
    return None if epoch is None else EpochFence(store, ml_name, epoch, owner_id)


async def give_back(fence: EpochFence) -> bool:
    """Release the owner node (the epoch stays, so the fence dies with the next owner)."""
    return await epochs.release(fence.store, fence.ml_name, fence.owner_id)


async def give_back_quietly(fence: EpochFence, what: object) -> None:
    """:func:`give_back` at the end of a one-off command (backfill, compact): a failure only
    warns, because the owner node is ephemeral and lapses with the session anyway."""
    try:
        await give_back(fence)
    except OffloaddError as exc:
        log.warning("%s: could not release ownership: %s (it lapses with the session)", what,
                    exc)
