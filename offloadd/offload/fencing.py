"""A :class:`~offloadd.offload.commit.Fence` backed by topic ownership epochs.

:mod:`offloadd.metadata.ownership` hands out epochs (one ``multi``: ephemeral owner node + epoch
bump). :class:`EpochFence` turns an epoch into the guard every commit carries, so a process that
lost the topic (session expired, another owner took over) can never commit again::

    guard_ops()  -> [CheckOp(/offloadd/topics/<ml>, epoch - 1)]
    verify()     -> Fenced unless epoch is still the latest

:func:`take` acquires and returns the fence (``None`` while another session owns the topic);
:func:`give_back` releases. Whoever assigns segments of a topic — the streaming daemon or a
backfill — should hold it this way, so that at most one of them assigns at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from offloadd.metadata import ownership
from offloadd.metadata.base import MetadataStore, Op


@dataclass(frozen=True)
class EpochFence:
    """The fence of one acquisition (epoch) of one topic by ``owner_id``."""

    store: MetadataStore
    ml_name: str
    epoch: int
    owner_id: str = ""

    def guard_ops(self) -> Sequence[Op]:
        return (ownership.fence_op(self.ml_name, self.epoch),)

    async def verify(self) -> None:
        await ownership.check_epoch(self.store, self.ml_name, self.epoch)


async def take(store: MetadataStore, ml_name: str, owner_id: str) -> EpochFence | None:
    """Own the topic for this store's session; ``None`` if another session owns it now."""
    epoch = await ownership.try_acquire(store, ml_name, owner_id)
    return None if epoch is None else EpochFence(store, ml_name, epoch, owner_id)


async def give_back(fence: EpochFence) -> bool:
    """Release the owner node (the epoch stays, so the fence dies with the next owner)."""
    return await ownership.release(fence.store, fence.ml_name, fence.owner_id)
