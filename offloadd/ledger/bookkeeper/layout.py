"""Where BookKeeper and Pulsar keep their metadata, and how to read it (pure: no I/O).

BookKeeper, hierarchical layout (``<root>/LAYOUT`` holds
``2\\norg.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1``)::

    ledger 1234567        → <root>/00/0123/L4567           (10 digits split 2-4-4)
    ledger ≥ 2^31 − 1     → <root>/000/0000/0000/0000/L0000 (19 digits split 3-4-4-4-4)

A ledger node holds ``BookieMetadataFormatVersion\\t3\\n``, a varint length and a
``LedgerMetadataFormat`` protobuf (``proto/bookkeeper.proto``). Its ``segment`` list records
ensemble changes: each segment's ensemble serves entries from its ``firstEntryId`` on. Entry
``e`` lives on the ensemble positions ``(e + j) mod ensembleSize`` for ``j < quorumSize`` of the
segment covering it (its *write set*); any of them can serve a read.

Pulsar: ``/managed-ledgers/<tenant>/<ns>/persistent/<topic>`` holds the topic's
``ManagedLedgerInfo``; its ledgers in log order, the last one open while the broker writes it.

The *mirror* (sidecar mode): offloadd never writes Pulsar's tree. It keeps its own
``ManagedLedgerInfo`` per topic in its own store (same path, another chroot), whose ledger list
follows Pulsar's and whose ``offloadContext``s hold offloadd's segments (docs/design.md "Metadata").
:func:`mirror_edit` is the one edit the source makes to that node: it appends new ledgers, fills
``entries``/``size``/``timestamp`` once a ledger is closed, and drops the records of ledgers
Pulsar deleted, exactly as a ledger writer does (:mod:`offloadd.retention` learns from that
absence that the ledger is gone, and deletes a segment's objects once every ledger it touches
is). It never edits an ``offloadContext``. Entries Pulsar deleted before offloadd held them are
recorded as a ``properties`` key ``offloadd.lost.<ledgerId>`` (see :class:`LostLedger`).

The mirror's one rule of time: a ledger missing from Pulsar's list is deleted only if the list
is at least as new as every list the mirror already follows. Pulsar appends ledgers and removes
them only when they are deleted, never to add them back, so a newer list lacking a ledger the
mirror holds proves the deletion, while an older one proves nothing (it was read before the
ledger was added). Every edit therefore takes a :class:`PulsarList` — the ledgers as one read of
Pulsar's znode saw them, with that read's ``version`` and ``mzxid`` — and the mirror records
the newest one it applied (``properties`` key ``offloadd.pulsar.list``); :func:`mirror_edit`
refuses a list older than that record, whoever derived it and however long it took. ``mzxid``
orders the reads: unlike the version it keeps growing when Pulsar deletes and re-creates a
topic.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from offloadd._proto import bookkeeper_pb2
from offloadd._proto import mldataformats_pb2 as mlpb
from offloadd.errors import FormatError
from offloadd.ledger.bookkeeper.codec import missing_fields
from offloadd.model.losses import LOST_PREFIX, LostLedger, lost_ledgers

__all__ = [
    "DEFAULT_LEDGERS_ROOT",
    "LOST_PREFIX",
    "PULSAR_LIST_KEY",
    "LedgerMetadata",
    "LedgerStateBK",
    "LostLedger",
    "MirrorChange",
    "PulsarLedger",
    "PulsarList",
    "check_layout",
    "decode_ledger_metadata",
    "ledger_id_from_path",
    "ledger_path",
    "lost_ledgers",
    "mirror_edit",
    "mirrored_list",
    "write_set",
]

DEFAULT_LEDGERS_ROOT = "/ledgers"
HIERARCHICAL_FACTORY = "org.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory"
METADATA_HEADER = b"BookieMetadataFormatVersion\t"
PULSAR_LIST_KEY = "offloadd.pulsar.list"
_SHORT_LIMIT = 2**31 - 1  # Integer.MAX_VALUE: ids from here on use the long layout


# ---- paths ------------------------------------------------------------------------------------


def ledger_path(ledger_id: int, root: str = DEFAULT_LEDGERS_ROOT) -> str:
    """The znode of ``ledger_id`` in the hierarchical layout under ``root``."""
    if ledger_id < 0:
        raise ValueError(f"ledger id {ledger_id} is negative")
    base = root.rstrip("/")
    if ledger_id < _SHORT_LIMIT:
        d = f"{ledger_id:010d}"
        return f"{base}/{d[:2]}/{d[2:6]}/L{d[6:]}"
    d = f"{ledger_id:019d}"
    return f"{base}/{d[:3]}/{d[3:7]}/{d[7:11]}/{d[11:15]}/L{d[15:]}"


def ledger_id_from_path(path: str, root: str = DEFAULT_LEDGERS_ROOT) -> int:
    """Inverse of :func:`ledger_path`; ``ValueError`` for a path that is not a ledger node."""
    base = root.rstrip("/") + "/"
    if not path.startswith(base):
        raise ValueError(f"{path!r} is not under {root!r}")
    parts = path[len(base):].split("/")
    if not parts[-1].startswith("L"):
        raise ValueError(f"{path!r}: a ledger node's name starts with L")
    parts[-1] = parts[-1][1:]
    widths = [2, 4, 4] if len(parts) == 3 else [3, 4, 4, 4, 4]
    if len(parts) != len(widths) or any(len(p) != w or not p.isdigit()
                                        for p, w in zip(parts, widths, strict=True)):
        raise ValueError(f"{path!r} is not a hierarchical ledger path")
    ledger_id = int("".join(parts))
    if (len(parts) == 3) != (ledger_id < _SHORT_LIMIT):
        raise ValueError(f"{path!r}: ledger {ledger_id} belongs in the other layout")
    return ledger_id


def check_layout(data: bytes, where: str) -> None:
    """Accept the hierarchical layout's ``LAYOUT`` node; ``FormatError`` names anything else."""
    text = data.decode("utf-8", errors="replace").strip().splitlines()
    if len(text) != 2 or not text[0].strip().isdigit():
        raise FormatError(where, 0, f"not a BookKeeper LAYOUT node: {data[:80]!r}")
    factory = text[1].split(":", 1)[0].strip()
    if factory != HIERARCHICAL_FACTORY:
        raise FormatError(where, 0, f"BookKeeper ledger layout {factory!r} is not supported "
                          f"(only {HIERARCHICAL_FACTORY}, BookKeeper's default)")


# ---- ledger metadata --------------------------------------------------------------------------


class LedgerStateBK(enum.IntEnum):
    OPEN = 1
    IN_RECOVERY = 2
    CLOSED = 3


@dataclass(frozen=True)
class LedgerMetadata:
    """A ledger as BookKeeper's metadata describes it. ``segments``: (first entry id, ensemble
    of ``host:port`` bookie ids), ascending."""

    ledger_id: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    state: LedgerStateBK
    last_entry_id: int
    length: int
    digest_type: int
    password: bytes | None
    ctime_ms: int
    segments: tuple[tuple[int, tuple[str, ...]], ...]

    @property
    def closed(self) -> bool:
        return self.state is LedgerStateBK.CLOSED

    def ensemble_for(self, entry_id: int) -> tuple[str, ...]:
        chosen = self.segments[0][1]
        for first, ensemble in self.segments:
            if first > entry_id:
                break
            chosen = ensemble
        return chosen

    def bookies_for(self, entry_id: int) -> list[str]:
        """The write set of ``entry_id``: the bookies that store it, in write order."""
        ensemble = self.ensemble_for(entry_id)
        return [ensemble[i] for i in write_set(entry_id, len(ensemble), self.write_quorum)]

    def write_set_groups(self, first: int, last: int) -> dict[tuple[str, ...], list[int]]:
        """Entries ``first..last`` grouped by write set (the same bookies, in write order)."""
        out: dict[tuple[str, ...], list[int]] = {}
        segs = self.segments
        for k, (seg_first, ensemble) in enumerate(segs):
            lo = max(first, seg_first)
            hi = last + 1 if k + 1 == len(segs) else min(last + 1, segs[k + 1][0])
            size = len(ensemble)
            for residue in range(size):
                start = lo + (residue - lo) % size
                if start >= hi:
                    continue
                ws = tuple(ensemble[i] for i in write_set(residue, size, self.write_quorum))
                out.setdefault(ws, []).extend(range(start, hi, size))
        return out

    def all_bookies(self) -> set[str]:
        return {b for _, ens in self.segments for b in ens}


def write_set(entry_id: int, ensemble_size: int, write_quorum: int) -> list[int]:
    """Ensemble positions holding ``entry_id``: ``(e + j) mod ensembleSize``, ``j < quorum``."""
    return [(entry_id + j) % ensemble_size for j in range(min(write_quorum, ensemble_size))]


def decode_ledger_metadata(data: bytes, ledger_id: int, where: str) -> LedgerMetadata:
    """Parse a ledger node (format version 3); ``FormatError`` names the node on junk."""
    if not data.startswith(METADATA_HEADER):
        raise FormatError(where, 0, "not BookKeeper ledger metadata (no "
                          "BookieMetadataFormatVersion header)")
    nl = data.find(b"\n", len(METADATA_HEADER))
    if nl < 0:
        raise FormatError(where, len(METADATA_HEADER), "metadata header line does not end")
    version = data[len(METADATA_HEADER):nl]
    if version != b"3":
        raise FormatError(where, len(METADATA_HEADER),
                          f"ledger metadata format version {version.decode(errors='replace')} "
                          "is not supported (only 3, BookKeeper 4.9 and later)")
    pos = nl + 1
    size = shift = 0
    while True:
        if pos >= len(data) or shift > 35:
            raise FormatError(where, pos, "truncated length varint after the header")
        b = data[pos]
        pos += 1
        size |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            break
    if pos + size > len(data):
        raise FormatError(where, pos, f"metadata claims {size} bytes, node has "
                          f"{len(data) - pos}")
    fmt = bookkeeper_pb2.LedgerMetadataFormat()
    try:
        fmt.ParseFromString(data[pos:pos + size])
    except Exception as exc:  # protobuf's DecodeError and friends
        raise FormatError(where, pos, f"not a LedgerMetadataFormat protobuf ({exc})") from exc
    missing = missing_fields(fmt)
    if missing:
        raise FormatError(where, pos, "LedgerMetadataFormat lacks required fields: "
                          + ", ".join(missing))
    segments = tuple((s.firstEntryId, tuple(s.ensembleMember)) for s in fmt.segment)
    if not segments or any(len(ens) != fmt.ensembleSize for _, ens in segments):
        raise FormatError(where, pos, f"ledger {ledger_id}: ensembles do not match "
                          f"ensembleSize {fmt.ensembleSize}")
    return LedgerMetadata(
        ledger_id=ledger_id, ensemble_size=fmt.ensembleSize, write_quorum=fmt.quorumSize,
        ack_quorum=fmt.ackQuorumSize if fmt.HasField("ackQuorumSize") else fmt.quorumSize,
        state=LedgerStateBK(fmt.state),
        last_entry_id=fmt.lastEntryId if fmt.HasField("lastEntryId") else -1,
        length=fmt.length,
        digest_type=fmt.digestType if fmt.HasField("digestType") else 3,
        password=fmt.password if fmt.HasField("password") else None,
        ctime_ms=fmt.ctime if fmt.HasField("ctime") else 0,
        segments=segments)


# ---- the mirror -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PulsarLedger:
    """One ledger of Pulsar's list as the source sees it: closed ones with their final size."""

    ledger_id: int
    closed: bool
    entries: int = 0
    size: int = 0
    timestamp_ms: int = 0


@dataclass(frozen=True)
class PulsarList:
    """A topic's ledgers as one read of Pulsar's znode saw them: ``version`` and ``mzxid`` are
    that read's (``mzxid`` orders reads, also across a delete and re-create of the node)."""

    ledgers: tuple[PulsarLedger, ...]
    version: int
    mzxid: int

    def stamp(self) -> str:
        return json.dumps({"version": self.version, "mzxid": self.mzxid}, sort_keys=True)


def mirrored_list(info: mlpb.ManagedLedgerInfo) -> tuple[int, int] | None:
    """(mzxid, version) of the newest Pulsar list the mirror follows; None if not recorded."""
    for kv in info.properties:
        if kv.key == PULSAR_LIST_KEY:
            try:
                v = json.loads(kv.value)
                return int(v["mzxid"]), int(v["version"])
            except (ValueError, KeyError, TypeError):
                return None
    return None


@dataclass
class MirrorChange:
    """What :func:`mirror_edit` did: ledgers added, closed and dropped, losses recorded, loss
    records withdrawn (``cleared``: Pulsar still lists those ledgers, so an older offloadd wrote
    them from a stale list), whether it recorded a newer Pulsar list (``stamped``), or that it
    refused the list as older than the one the mirror follows (``stale``)."""

    added: list[int]
    closed: list[int]
    dropped: list[int]
    lost: list[LostLedger]
    cleared: list[int] = field(default_factory=list)
    stamped: bool = False
    stale: bool = False

    @property
    def changed(self) -> bool:
        return bool(self.added or self.closed or self.dropped or self.lost or self.cleared
                    or self.stamped)


def _offloaded_end(li: mlpb.ManagedLedgerInfo.LedgerInfo) -> int:
    """The last entry of ``li`` that a *committed* segment holds, or -1. An assigned segment
    does not count: dropping the record drops it too (its commit is then refused, see
    :func:`offloadd.model.catalog.mark_offloaded`), so its entries are lost like the rest."""
    if not li.HasField("offloadContext"):
        return -1
    ctx = li.offloadContext
    if len(ctx.offloadSegment):
        return max((s.endEntryId for s in ctx.offloadSegment if s.complete), default=-1)
    if (ctx.uidMsb or ctx.uidLsb) and ctx.complete and li.HasField("entries"):
        return li.entries - 1  # offloaded whole (ledger-based format)
    return -1


def mirror_edit(info: mlpb.ManagedLedgerInfo, listed: PulsarList, now_ms: int,
                known_last: Mapping[int, tuple[int, int]] | None = None, *,
                exempt: Collection[int] = ()) -> MirrorChange:
    """Make the ledger list of ``info`` (offloadd's mirror) follow ``listed`` (in place), unless
    ``listed`` is older than the list the mirror already follows (then nothing changes and the
    result says ``stale``): see the module docstring.

    ``known_last`` gives, for ledgers the mirror still holds as open, their final last entry
    and payload bytes when the source saw them closed in BookKeeper; without it a loss is
    recorded with an unknown end (what was readable while it was open is only a lower bound).
    Ledgers in ``exempt`` (held elsewhere, e.g. by Pulsar's own offloader) are dropped without a
    loss. Records that stay keep their ``offloadContext`` as they are.
    """
    pulsar = listed.ledgers
    ours = {li.ledgerId: li for li in info.ledgerInfo}
    wanted = {p.ledger_id for p in pulsar}
    change = MirrorChange([], [], [], [])
    followed = mirrored_list(info)
    if followed is not None and followed[0] > listed.mzxid:
        change.stale = True
        return change
    change.stamped = followed is None or followed[0] < listed.mzxid
    recorded = {kv.key for kv in info.properties}
    # a loss recorded for a ledger Pulsar still lists is false: an older offloadd mirrored a
    # stale list. Withdraw it, so that the ledger's real deletion is reported when it comes.
    change.cleared = sorted(lid for lid in wanted if f"{LOST_PREFIX}{lid}" in recorded)
    recorded -= {f"{LOST_PREFIX}{lid}" for lid in change.cleared}
    _find_dropped(info, wanted, known_last, exempt, recorded, now_ms, change)
    for p in pulsar:
        mine = ours.get(p.ledger_id)
        if mine is None:
            change.added.append(p.ledger_id)
        elif p.closed and (not mine.HasField("entries") or mine.entries != p.entries
                           or mine.size != p.size):
            change.closed.append(p.ledger_id)
    if not change.changed:
        return change
    if change.cleared or change.stamped:
        _restamp(info, listed, change)
    if not (change.added or change.closed or change.dropped or change.lost):
        return change
    _rebuild(info, pulsar, ours)
    for lost in change.lost:
        info.properties.add(key=lost.key(), value=lost.value())
    return change


def _find_dropped(info: mlpb.ManagedLedgerInfo, wanted: set[int],
                  known_last: Mapping[int, tuple[int, int]] | None, exempt: Collection[int],
                  recorded: set[str], now_ms: int, change: MirrorChange) -> None:
    """The mirror's ledgers Pulsar no longer lists, and the loss each leaves unless a committed
    segment holds its entries to the end (or it is exempt, or the loss is recorded already)."""
    for li in info.ledgerInfo:
        if li.ledgerId in wanted:
            continue
        change.dropped.append(li.ledgerId)
        end = _offloaded_end(li)
        if li.HasField("entries"):
            last, size, known = li.entries - 1, li.size, True
        elif known_last is not None and li.ledgerId in known_last:
            (last, size), known = known_last[li.ledgerId], True
        else:
            last, size, known = -1, -1, False
        lost = LostLedger(li.ledgerId, end + 1, last, size if end < 0 else -1, now_ms)
        if (last > end or not known) and lost.key() not in recorded \
                and li.ledgerId not in exempt:
            change.lost.append(lost)


def _restamp(info: mlpb.ManagedLedgerInfo, listed: PulsarList, change: MirrorChange) -> None:
    """Withdraw the cleared loss records and, when the list is newer, record its stamp."""
    drop_keys = {f"{LOST_PREFIX}{lid}" for lid in change.cleared} | {PULSAR_LIST_KEY}
    props = [(kv.key, kv.value) for kv in info.properties if kv.key not in drop_keys]
    if not change.stamped:
        props += [(kv.key, kv.value) for kv in info.properties if kv.key == PULSAR_LIST_KEY]
    del info.properties[:]
    for k, v in props:
        info.properties.add(key=k, value=v)
    if change.stamped:
        info.properties.add(key=PULSAR_LIST_KEY, value=listed.stamp())


def _rebuild(info: mlpb.ManagedLedgerInfo, pulsar: Sequence[PulsarLedger],
             ours: Mapping[int, mlpb.ManagedLedgerInfo.LedgerInfo]) -> None:
    """The ledger list in Pulsar's order; existing records are copied whole (offload contexts
    intact)."""
    copies: list[mlpb.ManagedLedgerInfo.LedgerInfo] = []
    for p in pulsar:
        c = mlpb.ManagedLedgerInfo.LedgerInfo()
        if p.ledger_id in ours:
            c.CopyFrom(ours[p.ledger_id])
        else:
            c.ledgerId = p.ledger_id
            if p.timestamp_ms:
                c.timestamp = p.timestamp_ms
        if p.closed:
            c.entries, c.size = p.entries, p.size
            if p.timestamp_ms and not c.HasField("timestamp"):
                c.timestamp = p.timestamp_ms
        copies.append(c)
    del info.ledgerInfo[:]
    info.ledgerInfo.extend(copies)
