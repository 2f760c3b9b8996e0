"""Topic ownership and fencing epochs, on any :class:`~offloadd.metadata.base.MetadataStore`.

Two nodes per managed ledger (paths from :mod:`offloadd.model.keys`)::

    /offloadd/owners/<ml>   ephemeral   owner id (UTF-8); exists while the owner's session lives
    /offloadd/topics/<ml>   persistent  {"epoch": N, "owner": "<owner id>"} (JSON)

Acquiring is ONE ``multi``: create the ephemeral owner node and bump the epoch in the topic-state
node by compare-and-set (create it at epoch 1 if absent). So an owner exists only together with
its new epoch, and the topic-state node changes exactly once per acquisition, by exactly one
version: **epoch N is held by the owner that left the node at version N - 1**. Nothing else may
write or delete that node (deleting it would restart the count at a version a stale owner may
still hold; the daemon's other per-topic state belongs elsewhere).

Fencing. A commit of an owner at epoch N is a ``multi`` that starts with :func:`fence_op` =
``CheckOp(topic_state_path(ml), N - 1)``. Once a newer owner acquired epoch N + 1 the node is at
version N, so the stale owner's check fails and ZooKeeper (or the embedded store) rejects the
whole ``multi``: nothing of the stale commit is applied, and the store raises ``Conflict``.
:class:`~offloadd.commit.fence.EpochFence` puts that op into every write of the owner (through
the compare-and-set loop, :mod:`offloadd.metadata.cas`) and turns the failure into
:class:`~offloadd.errors.Fenced` after re-reading the epoch (:func:`check_epoch`). The check
needs no lock or lease timing: a stale owner that is partitioned, paused or whose session has
expired learns it only at commit, and loses there.

A session that ends (expiry, crash, ``close``) drops the owner node, so another instance can
acquire. The same owner id in a new session is a new owner: a node left by a previous session
that has not yet expired blocks acquisition until it does.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from offloadd.errors import Conflict, Fenced, FormatError, NotFound, OffloaddError
from offloadd.metadata import cas
from offloadd.metadata.base import (
    BatchedMulti,
    BatchedReads,
    CheckOp,
    CreateOp,
    DeleteOp,
    MetadataStore,
    Versioned,
)
from offloadd.model.keys import owner_path, topic_state_path

_ATTEMPTS = 50


@dataclass(frozen=True)
class TopicState:
    epoch: int
    owner: str
    version: int

    def encode(self) -> bytes:
        return json.dumps({"epoch": self.epoch, "owner": self.owner},
                          sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes, version: int, where: str) -> TopicState:
        try:
            doc = json.loads(data)
            epoch, owner = doc["epoch"], doc["owner"]
        except (ValueError, KeyError, TypeError) as exc:
            raise FormatError(where, 0,
                              f"topic state is not {{epoch, owner}} JSON ({exc})") from exc
        if not isinstance(epoch, int) or not isinstance(owner, str) or epoch != version + 1:
            raise FormatError(where, 0, f"topic state epoch {epoch!r} does not match node "
                                        f"version {version} (epoch must be version + 1)")
        return cls(epoch, owner, version)


async def read_state(store: MetadataStore, ml_name: str) -> TopicState | None:
    """The topic's epoch and last acquirer; None if it was never owned."""
    path = topic_state_path(ml_name)
    node = await cas.read(store, path)
    return None if node is None else TopicState.decode(node.data, node.version, path)


async def current_epoch(store: MetadataStore, ml_name: str) -> int:
    """The latest epoch handed out (0 if never owned)."""
    state = await read_state(store, ml_name)
    return state.epoch if state is not None else 0


async def current_owner(store: MetadataStore, ml_name: str) -> str | None:
    """The owner id whose session holds the topic now; None if nobody does."""
    try:
        return (await store.get(owner_path(ml_name))).data.decode()
    except NotFound:
        return None


class _Held(Exception):
    """The owner node exists: someone else holds the topic."""


async def try_acquire(store: MetadataStore, ml_name: str, owner_id: str) -> int | None:
    """Take the topic for this store's session: the new epoch, or None if someone holds it."""
    owner, state_path = owner_path(ml_name), topic_state_path(ml_name)
    await _ensure_parent(store, owner)
    epoch = 0

    def bump(node: Versioned | None) -> bytes:
        nonlocal epoch
        state = None if node is None else TopicState.decode(node.data, node.version, state_path)
        epoch = 1 if state is None else state.epoch + 1
        return TopicState(epoch, owner_id, epoch - 1).encode()

    async def held() -> None:
        if await store.exists(owner):
            raise _Held
        # Lost a race on the topic-state node (another acquirer that has since gone): again.

    try:
        await cas.update(store, state_path, bump, create=True,
                         also=[CreateOp(owner, owner_id.encode(), ephemeral=True)],
                         on_conflict=held, attempts=_ATTEMPTS)
    except _Held:
        return None
    return epoch


async def release(store: MetadataStore, ml_name: str, owner_id: str) -> bool:
    """Drop the owner node if ``owner_id`` holds it; True if it was released.

    The epoch stays: a later owner gets the next one, so this owner's fence stays valid only
    until then.
    """
    path = owner_path(ml_name)
    try:
        node = await store.get(path)
        if node.data.decode() != owner_id:
            return False
        await store.delete(path, node.version)
        return True
    except (NotFound, Conflict):
        return False


RELEASES_PER_REQUEST = 256  # owner-node deletes in one transaction / ZooKeeper multi


async def release_many(store: MetadataStore, ml_names: Sequence[str], owner_id: str
                       ) -> dict[str, OffloaddError | None]:
    """:func:`release` for many topics in few requests: their owner nodes read together, the
    ones ``owner_id`` holds deleted ``RELEASES_PER_REQUEST`` at a time, each delete its own
    group (at the version read: a node that changed since is left alone) in one SQLite
    transaction / ZooKeeper ``multi``. One after the other, 10,000 releases took tens of
    seconds of a stop. Returns, per name, None (released, or not ours to release) or the
    error that left its node in place (a failed request fails the names it carried). A store
    without the batch capabilities gets one :func:`release` per name."""
    out: dict[str, OffloaddError | None] = {}
    if not (isinstance(store, BatchedReads) and isinstance(store, BatchedMulti)):
        for name in ml_names:
            try:
                await release(store, name, owner_id)
                out[name] = None
            except OffloaddError as exc:
                out[name] = exc
        return out
    for start in range(0, len(ml_names), RELEASES_PER_REQUEST):
        chunk = list(ml_names[start:start + RELEASES_PER_REQUEST])
        try:
            nodes = await store.get_many([owner_path(n) for n in chunk])
            mine = [(n, node) for n, node in zip(chunk, nodes, strict=True)
                    if node is not None and node.data == owner_id.encode()]
            out.update((n, None) for n in chunk)
            if not mine:
                continue
            results = await store.multi_batch(
                [[DeleteOp(owner_path(n), node.version)] for n, node in mine])
        except OffloaddError as exc:
            out.update((n, exc) for n in chunk)
            continue
        for (n, _), result in zip(mine, results, strict=True):
            # a node gone or changed since it was read is no longer ours to delete
            if isinstance(result, OffloaddError) and not isinstance(result, NotFound | Conflict):
                out[n] = result
    return out


def fence_op(ml_name: str, epoch: int) -> CheckOp:
    """The op that makes a ``multi`` fail unless ``epoch`` is still the topic's latest."""
    return CheckOp(topic_state_path(ml_name), epoch - 1)


async def check_epoch(store: MetadataStore, ml_name: str, epoch: int) -> None:
    """Raise ``Fenced`` unless ``epoch`` is the latest (a read; writes carry :func:`fence_op`)."""
    latest = await current_epoch(store, ml_name)
    if latest != epoch:
        raise Fenced(f"{ml_name}: epoch {epoch} is stale, the topic is at epoch {latest}")


async def _ensure_parent(store: MetadataStore, path: str) -> None:
    parent = path.rsplit("/", 1)[0]
    if not parent or await store.exists(parent):
        return
    with contextlib.suppress(Conflict):
        await store.create(parent, b"", make_parents=True)
