"""Managed-ledger metadata (``ManagedLedgerInfo``, DESIGN §6): pure edits plus the CAS loop.

The ledger writer appends and closes ``LedgerInfo`` records; the offloader only edits
``offloadContext.offloadSegment``. Every persisted change is a compare-and-set on the node's
version: a lost race re-reads and re-applies the same pure edit.
"""

from __future__ import annotations

from collections.abc import Callable

from offloadd._proto import mldataformats_pb2 as pb
from offloadd.errors import Conflict, FormatError, NotFound
from offloadd.metadata.base import MetadataStore, Versioned
from offloadd.metadata.envelope import unwrap
from offloadd.paths import managed_ledger_path

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
    attempts: int = 100,
) -> pb.ManagedLedgerInfo:
    """Apply ``edit`` (mutates in place; returns False for "no change") under CAS, retrying lost
    races. With ``create`` a missing node starts empty. Returns the stored value."""
    path = managed_ledger_path(ml_name)
    for _ in range(attempts):
        try:
            node: Versioned | None = await store.get(path)
        except NotFound:
            if not create:
                raise
            node = None
        info = decode(node.data, path) if node is not None else pb.ManagedLedgerInfo()
        if not edit(info):
            return info
        data = info.SerializeToString()
        try:
            if node is None:
                await store.create(path, data)
            else:
                await store.set(path, data, node.version)
            return info
        except Conflict:
            continue
    raise Conflict(f"{path}: gave up after {attempts} lost compare-and-set races")


def ledger_info(info: pb.ManagedLedgerInfo, ledger_id: int) -> pb.ManagedLedgerInfo.LedgerInfo:
    for li in info.ledgerInfo:
        if li.ledgerId == ledger_id:
            return li
    raise NotFound(f"ledger {ledger_id} is not in the managed ledger")


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
