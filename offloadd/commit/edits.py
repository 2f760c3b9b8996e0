"""Fenced edits of a topic's catalog: the commit.

Every change the offloader and the backfill make to a topic's offload records (assign a segment,
mark it offloaded, give a redo a fresh uuid, drop an abandoned attempt) goes through
:func:`apply`: a pure edit from :mod:`offloadd.model.catalog` applied under the one
compare-and-set loop (:func:`offloadd.metadata.managed_ledger.update`), in one transaction with
the fence's guard ops. A lost race on the managed-ledger node re-reads and re-applies; a failed
guard means another process owns the topic now and raises ``Fenced``: a stale owner can never
commit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from offloadd._proto import mldataformats_pb2 as pb
from offloadd.commit.batch import CommitBatcher
from offloadd.commit.fence import Fence
from offloadd.errors import IllegalTransition, NotFound
from offloadd.metadata import cas, managed_ledger
from offloadd.metadata.base import MetadataStore, Op
from offloadd.model.keys import managed_ledger_path

__all__ = ["apply"]


async def apply(store: MetadataStore, ml_name: str,
                edit: Callable[[pb.ManagedLedgerInfo], bool], fence: Fence, *,
                on_write: Callable[[], None] | None = None,
                also: Sequence[Op] = (),
                batcher: CommitBatcher | None = None,
                known: cas.Known | None = None) -> pb.ManagedLedgerInfo:
    """Apply ``edit`` to ``ml_name``'s ``ManagedLedgerInfo`` under ``fence``; the stored value.

    An edit that no longer applies (``ValueError``/``KeyError``: a ledger deleted, a record
    replaced meanwhile; ``IllegalTransition``: the records moved on, e.g. another attempt
    committed the segment) raises ``NotFound``: the caller redoes its work from a fresh read.
    ``on_write`` runs once the write landed (not when the edit changed nothing). ``also``: ops
    made in the same transaction (a merge's pending-deletion records). ``batcher``: the write
    goes in a batch with other topics' (:mod:`offloadd.commit.batch`), still fenced and
    compare-and-set on its own. ``known``: the node as the caller last read or wrote it
    (:class:`offloadd.metadata.cas.Known`; the commit then reads only when that is out of
    date), kept up to date.
    """
    wrote = False

    def guarded(info: pb.ManagedLedgerInfo) -> bool:
        nonlocal wrote
        try:
            wrote = edit(info)
        except (ValueError, KeyError, IllegalTransition) as exc:
            raise NotFound(f"{managed_ledger_path(ml_name)}: {exc}") from exc
        return wrote

    info = await managed_ledger.update(store, ml_name, guarded,
                                       guard=[*fence.guard_ops(), *also],
                                       on_conflict=fence.verify,
                                       multi=batcher.multi if batcher is not None else None,
                                       known=known)
    if wrote and on_write is not None:
        on_write()
    return info
