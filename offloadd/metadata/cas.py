"""The one compare-and-set loop: read a node, compute its new bytes, write them back only if
nobody changed the node meanwhile; on a lost race, back off and start over.

Every read-modify-write of the metadata store goes through :func:`update`: the ledger writers'
and the offloader's edits of ``ManagedLedgerInfo`` (:func:`offloadd.metadata.managed_ledger.
update`, :func:`offloadd.commit.edits.apply`), topic ownership epochs
(:mod:`offloadd.commit.epochs`) and the topic offload status records
(:mod:`offloadd.metadata.offload_status`)::

    read node (absent: None) ──▶ edit(node) ── None: nothing to change, return the node
        ▲                           │ new bytes
        │                           ▼
        └── back off ◀── lost ── one transaction: guard ops, extra ops, set (CAS on the
           (retry.CAS)   race     node's version) or create ── ok: return the new node

``known`` (a :class:`Known`) skips the first read: a writer that is mostly the node's only
writer (a topic's owner, its catalog and status record) keeps the node as it last read or wrote
it, and the first attempt edits that. A stale copy loses the compare-and-set like any other
race, and the loop reads afresh; an edit that finds nothing to change in the copy is not
trusted either (the node may have moved on): the node is read and the edit asked again. At
start-up that is two reads fewer per topic and segment for the catalog, and one per status
write (thousands of topics: round trips, and kazoo's per-request work, are what it costs).

``multi``, when given, carries every write instead of the store's own calls (always as one
``multi``, a single op too): the commit batcher's (:class:`offloadd.commit.batch.CommitBatcher`),
which sends many topics' writes in one request; a refused write comes back to this loop alone.

``guard`` ops ride in the same transaction (a fence's version check on the topic's epoch, so a
stale owner's write fails as a whole); when the transaction fails, ``on_conflict`` runs before
the retry and may raise to end the loop (the fence's ``verify`` raises ``Fenced`` when it was
the guard, not the node, that moved). ``also`` ops are applied together with the write (an
ephemeral owner node created with its epoch).

It lives with the metadata protocol, not in :mod:`offloadd.commit`, because the edges use it too:
the embedded store and the BookKeeper mirror append and close ledgers with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Awaitable, Callable, Sequence

from offloadd import aio
from offloadd.errors import Conflict, NotFound
from offloadd.metadata.base import CreateOp, MetadataStore, Op, SetOp, Versioned
from offloadd.retry import CAS, Backoff

__all__ = ["Edit", "Known", "Multi", "read", "update"]

# node as read (None: absent) -> the bytes to store, or None to leave the node as it is
Edit = Callable[[Versioned | None], bytes | None]
# what carries a write's ops, all or none (store.multi, or a batcher's)
Multi = Callable[[Sequence[Op]], Awaitable[list[int | str | None]]]

ATTEMPTS = 100


class Known:
    """A node as its writer last read or wrote it (``None``: absent), for :func:`update`'s
    first attempt; :meth:`forget` after anything that may have moved it without this holder
    being told (``update`` does, on a lost race)."""

    __slots__ = ("node", "valid")

    def __init__(self) -> None:
        self.node: Versioned | None = None
        self.valid = False

    def set(self, node: Versioned | None) -> None:
        self.node, self.valid = node, True

    def forget(self) -> None:
        self.node, self.valid = None, False


async def update(store: MetadataStore, path: str, edit: Edit, *, create: bool = False,
                 guard: Sequence[Op] = (), also: Sequence[Op] = (),
                 on_conflict: Callable[[], Awaitable[None]] | None = None,
                 attempts: int = ATTEMPTS, backoff: Backoff = CAS,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 multi: Multi | None = None, known: Known | None = None) -> Versioned | None:
    """Apply ``edit`` to ``path`` under compare-and-set; the node as stored afterwards (None if
    it is absent and ``edit`` left it so).

    ``create``: an absent node is handed to ``edit`` as None and created (with its parents);
    otherwise an absent node raises ``NotFound``. ``Conflict`` after ``attempts`` lost races.
    ``known``: the first attempt edits the node it holds, if any, instead of reading; it holds
    the node as stored afterwards (forgotten on a failure).
    """
    try:
        # (a copy saying "absent" is not trusted where absence is an error)
        if known is not None and known.valid and (create or known.node is not None):
            stored = await _try_known(store, path, edit, known.node, guard, also, multi)
            if stored is not None:
                known.set(stored)
                return stored
            if on_conflict is not None:  # (the guard may be what failed)
                await on_conflict()
        for attempt in range(1, attempts + 1):
            node: Versioned | None
            try:
                node = await store.get(path)
            except NotFound:
                if not create:
                    raise
                node = None
            data = edit(node)
            if data is None:
                _remember(known, node)
                return node
            stored = await _write(store, path, node, data, guard, also, multi)
            if stored is not None:
                _remember(known, stored)
                return stored
            # the node changed, appeared or vanished since the read; or the guard failed
            if node is None:
                _forget_parent(store, path)  # if it was the parent that vanished
            if on_conflict is not None:
                await on_conflict()
            await sleep(backoff.delay(attempt))
    except BaseException:
        if known is not None:
            known.forget()
        raise
    if known is not None:
        known.forget()
    raise Conflict(f"{path}: gave up after {attempts} lost compare-and-set races")


async def _try_known(store: MetadataStore, path: str, edit: Edit, node: Versioned | None,
                     guard: Sequence[Op], also: Sequence[Op], multi: Multi | None
                     ) -> Versioned | None:
    """The edit of a copy, written; None if that did not work out: the copy was out of date
    (the write lost its race, or the edit refused it or found nothing to change: either may
    be the copy's age, so a fresh read decides)."""
    try:
        data = edit(node)
    except Exception:
        return None
    if data is None:
        return None
    stored = await _write(store, path, node, data, guard, also, multi)
    if stored is None and node is None:
        _forget_parent(store, path)
    return stored


def _remember(known: Known | None, node: Versioned | None) -> None:
    if known is not None:
        known.set(node)


async def _write(store: MetadataStore, path: str, node: Versioned | None, data: bytes,
                 guard: Sequence[Op], also: Sequence[Op], multi: Multi | None
                 ) -> Versioned | None:
    """One write of ``data`` over ``node`` as read (None: create it); the node as stored, or
    None when the race was lost (``Conflict``/``NotFound``)."""
    try:
        if node is None:
            await _ensure_parent(store, path)
            write: Op = CreateOp(path, data)
        else:
            write = SetOp(path, data, node.version)
        ops = [*guard, *also, write]
        if multi is not None:
            await multi(ops)
        elif len(ops) > 1:
            await store.multi(ops)
        elif node is None:
            await store.create(path, data)
        else:
            await store.set(path, data, node.version)
    except (Conflict, NotFound):
        return None
    return Versioned(data, 0 if node is None else node.version + 1)


async def read(store: MetadataStore, path: str) -> Versioned | None:
    """The node, or None when it is absent (the read half of a read-modify-write)."""
    try:
        return await store.get(path)
    except NotFound:
        return None


# Parents known to exist, per store: thousands of topics' first records share a few parents
# (a namespace's), and checking each time cost one or two round trips per topic when many start
# at once. Concurrent callers wait for one check (a future per parent); a create that finds the
# parent gone after all forgets it (update's retry checks again).
_parents: weakref.WeakKeyDictionary[MetadataStore, dict[str, asyncio.Future[None]]] = \
    weakref.WeakKeyDictionary()


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0]


async def _ensure_parent(store: MetadataStore, path: str) -> None:
    parent = _parent(path)
    if not parent:
        return
    try:
        known = _parents.setdefault(store, {})
    except TypeError:  # a store that cannot be weakly referenced: check every time
        await _make_parent(store, parent)
        return
    fut = known.get(parent)
    if fut is None or fut.get_loop() is not asyncio.get_running_loop() or \
            (fut.done() and (fut.cancelled() or fut.exception() is not None)):
        fut = known[parent] = aio.retrieved(asyncio.ensure_future(_make_parent(store, parent)))
    await asyncio.shield(fut)


def _forget_parent(store: MetadataStore, path: str) -> None:
    with contextlib.suppress(TypeError):
        _parents.get(store, {}).pop(_parent(path), None)


async def _make_parent(store: MetadataStore, parent: str) -> None:
    if await store.exists(parent):
        return
    with contextlib.suppress(Conflict):  # created by someone else meanwhile
        await store.create(parent, b"", make_parents=True)
