"""Managed-ledger metadata (``ManagedLedgerInfo``, in Pulsar's layout: docs/design.md
"Metadata") in the store: decode, load, list, update.

The ledger writer appends and closes ``LedgerInfo`` records; the offloader only edits
``offloadContext.offloadSegment`` (the pure edits are :mod:`offloadd.model.catalog`'s). Every
persisted change is a compare-and-set on the node's version (:mod:`offloadd.metadata.cas`): a
lost race re-reads and re-applies the same pure edit.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from offloadd._proto import mldataformats_pb2 as pb
from offloadd.errors import FormatError, NotFound
from offloadd.metadata import cas
from offloadd.metadata.base import MetadataStore, Op, Versioned
from offloadd.metadata.envelope import unwrap
from offloadd.model.keys import managed_ledger_path

ManagedLedgerInfo = pb.ManagedLedgerInfo
LedgerInfo = pb.ManagedLedgerInfo.LedgerInfo


def decode(data: bytes, where: str = "ManagedLedgerInfo") -> pb.ManagedLedgerInfo:
    """Parse ``ManagedLedgerInfo`` bytes, bare or in Pulsar's compressed envelope
    (:mod:`offloadd.metadata.envelope`); ``FormatError`` names the znode on junk."""
    info = pb.ManagedLedgerInfo()
    try:
        info.ParseFromString(unwrap(data, where))
    except Exception as exc:  # protobuf raises DecodeError / RuntimeWarning subclasses
        raise FormatError(where, 0, f"not a ManagedLedgerInfo protobuf ({exc})") from exc
    if not info.IsInitialized():
        raise FormatError(where, 0, "ManagedLedgerInfo is missing required fields")
    return info


async def load(store: MetadataStore, ml_name: str) -> tuple[pb.ManagedLedgerInfo, int]:
    path = managed_ledger_path(ml_name)
    node = await store.get(path)
    return decode(node.data, path), node.version


async def update(
    store: MetadataStore,
    ml_name: str,
    edit: Callable[[pb.ManagedLedgerInfo], bool],
    *,
    create: bool = False,
    guard: Sequence[Op] = (),
    on_conflict: Callable[[], Awaitable[None]] | None = None,
    multi: cas.Multi | None = None,
    known: cas.Known | None = None,
) -> pb.ManagedLedgerInfo:
    """Apply ``edit`` (mutates in place; returns False for "no change") under compare-and-set
    (:func:`offloadd.metadata.cas.update`: lost races re-read and re-apply). With ``create`` a
    missing node starts empty; ``guard``, ``on_conflict``, ``multi`` and ``known`` as there.
    Returns the stored value.
    """
    path = managed_ledger_path(ml_name)
    stored = pb.ManagedLedgerInfo()

    def apply(node: Versioned | None) -> bytes | None:
        nonlocal stored
        info = decode(node.data, path) if node is not None else pb.ManagedLedgerInfo()
        stored = info
        return info.SerializeToString() if edit(info) else None

    await cas.update(store, path, apply, create=create, guard=guard, on_conflict=on_conflict,
                     multi=multi, known=known)
    return stored


async def list_names(store: MetadataStore) -> list[str]:
    """Every managed-ledger name (``tenant/ns/persistent/topic``) under ``/managed-ledgers``."""
    names: list[str] = []

    async def walk(prefix: str, depth: int) -> None:
        try:
            kids = await store.children(managed_ledger_path(prefix) if prefix else
                                        "/managed-ledgers")
        except NotFound:
            return
        for k in kids:
            name = f"{prefix}/{k}" if prefix else k
            if depth == 3:
                names.append(name)
            else:
                await walk(name, depth + 1)

    await walk("", 0)
    return sorted(names)
