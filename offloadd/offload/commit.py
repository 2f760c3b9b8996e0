"""The commit: compare-and-set edits of a topic's ``ManagedLedgerInfo``, guarded by a fence.

Every edit the offloader makes (assign a segment, mark it offloaded, drop an abandoned attempt)
goes through :func:`apply`: read the node, apply a pure edit from :mod:`offloadd.model.catalog`,
write it back in one transaction together with the fence's guard ops (e.g. a version check on the
topic's ownership epoch). A lost race on the managed-ledger node re-reads and re-applies; a failed
guard means another daemon owns the topic now, and raises ``Fenced``: a stale owner can never
commit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from offloadd._proto import mldataformats_pb2 as pb
from offloadd.errors import Conflict, NotFound
from offloadd.metadata import managed_ledger
from offloadd.metadata.base import MetadataStore, Op, SetOp
from offloadd.model.keys import managed_ledger_path


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


async def apply(store: MetadataStore, ml_name: str, edit: Callable[[pb.ManagedLedgerInfo], bool],
                fence: Fence, *, on_write: Callable[[], None] | None = None,
                attempts: int = 100) -> pb.ManagedLedgerInfo:
    path = managed_ledger_path(ml_name)
    for _ in range(attempts):
        node = await store.get(path)
        info = managed_ledger.decode(node.data, path)
        try:
            changed = edit(info)
        except (ValueError, KeyError) as exc:
            # the managed ledger moved under us (a ledger deleted, a record replaced): the
            # edit no longer applies; the caller redoes its work from a fresh read
            raise NotFound(f"{path}: {exc}") from exc
        if not changed:
            return info
        guard = list(fence.guard_ops())
        set_op = SetOp(path, info.SerializeToString(), node.version)
        try:
            if guard:
                await store.multi([*guard, set_op])
            else:
                await store.set(path, set_op.data, node.version)
        except Conflict:
            await fence.verify()  # raises Fenced when the guard, not the node, moved
            continue
        if on_write is not None:
            on_write()
        return info
    raise Conflict(f"{path}: gave up after {attempts} lost compare-and-set races")
