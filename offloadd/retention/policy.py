"""Retention decisions, pure: *what* may go, never the going (retention computes, GC deletes).

No I/O and no asyncio here: inputs are a topic's ``ManagedLedgerInfo``, a wall clock in
milliseconds and the records below; outputs are ledger ids, records and object keys.
:mod:`offloadd.retention.gc` reads and writes them and deletes the objects.

Why records at all: a segment's only trace in ``ManagedLedgerInfo`` is one ``OffloadSegment``
inside each ``LedgerInfo`` it touches, and the ledger writer (our embedded store or a Pulsar
broker) drops a ``LedgerInfo`` whole when retention deletes the ledger. Once the last of them is
gone nothing says the segment existed, so its objects could only be found again as orphans. Two
JSON records under ``/offloadd`` keep that knowledge (paths in :mod:`offloadd.model.keys`)::

    /offloadd/segments/<ml name>/<uuid>   SegmentRecord, one per committed segment
      {"v": 1, "uid": "<uuid>", "ml": "<tenant/ns/persistent/topic>",
       "kind": "streaming" | "ledger", "ledgers": [ledger ids it touches, log order],
       "deleted": [those of them marked deleted], "tracked_ms": <wall ms when recorded>}

    /offloadd/deletions/<uuid>            DeletionRecord, one per segment being deleted
      {"v": 1, "uid", "ml", "kind", "ledgers", "created_ms",
       "attempts": <failed attempts so far>, "last_attempt_ms": <ms> | null,
       "last_error": "<why the last attempt failed>" | null,
       "not_before_ms": <wall ms before which its objects stay> (absent: 0),
       "merged_into": "<uuid of the segment that replaced it>" (absent: retention's)}

A merge (``offloadd compact``) creates the DeletionRecord of each segment it replaced in the
same transaction that swaps them out of the catalog, with ``not_before_ms`` = the swap plus the
topic's deletion lag: a reader that listed the old catalog keeps finding their objects until
then.

Life of a segment, KIP-405 style (each arrow is one compare-and-set or transaction; the states
are :mod:`offloadd.model.segment_state`'s)::

    OFFLOADED in ManagedLedgerInfo ──track──▶ SegmentRecord(deleted=[])
      ──a ledger leaves the managed ledger──▶ mark: SegmentRecord(deleted=[...])
      ──every ledger marked──▶ DeletionRecord (created in the same transaction that
                               removes the SegmentRecord)
      ──all objects deleted──▶ DELETED: (no record)   failure ──▶ DeletionRecord(attempts+1),
                                                                  retried

A ledger is marked once it is absent from its topic's ``ManagedLedgerInfo`` (or the whole
managed ledger is gone): ledger ids are never reused and a deleted ledger never comes back, so
absence is final. A segment's objects are deleted only when *every* ledger it touches is marked.

Retention by time/size follows Pulsar's trimming of consumed ledgers: walk the ledgers oldest
first, delete while the ledger is past the retention time or the topic is over the retention size
(counting what is already chosen), stop at the first one that is neither, and never the last
(current) ledger. Two rules of ours on top: a ledger is deleted only once every entry of it is in
committed segments — retention never throws away bytes that exist nowhere else — and never the
ledger holding the end of the last committed segment: that is where the offloader's cursor
stands (Pulsar likewise keeps the slowest cursor's ledger), and a cursor whose ledger vanished
could not tell retention from data loss.

Deletion lag (``managedLedgerOffloadDeletionLagInMillis``): the *source copy* of a ledger (its
local files; bookies in Pulsar) may be dropped once the ledger is fully offloaded and the newest
segment covering it was committed more than the lag ago. The managed ledger keeps listing the
ledger, with ``offloadContext.bookkeeperDeleted`` set, and readers get it from the tier.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from offloadd._proto import mldataformats_pb2 as pb
from offloadd.blobstore.base import PROBE_KEY_PREFIX, ObjectInfo
from offloadd.errors import FormatError
from offloadd.model import catalog
from offloadd.model.catalog import Segment, SegmentKind
from offloadd.model.keys import (
    parse_key,
    segment_keys,
)
from offloadd.model.sizes import MiB

__all__ = [
    "DeletionRecord",
    "LedgerView",
    "RetentionLimits",
    "SegmentRecord",
    "ledger_views",
    "ledgers_to_delete",
    "object_keys",
    "orphans",
    "source_copies_to_trim",
]

RECORD_VERSION = 1


# -- ledgers ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LedgerView:
    """What retention needs to know of one ledger of a managed ledger.

    ``closed_ms`` bounds the time of the ledger's newest entry: the later of its own timestamp
    and the next ledger's (a ledger closes when the next one opens; Pulsar stamps the close time,
    the embedded store the open time, so the later of the two is right for both).
    ``offloaded``: every entry is in committed segments (an empty ledger counts once a later
    ledger has committed entries). ``offloaded_ms``: when the newest segment covering it was
    committed. ``source_deleted``: the source copy is gone (``bookkeeperDeleted``).
    ``cursor``: the last committed segment ends in this ledger.
    """

    ledger_id: int
    entries: int | None  # None while the ledger is open
    size: int
    closed_ms: int
    offloaded: bool
    offloaded_ms: int | None
    source_deleted: bool
    cursor: bool = False

    @property
    def open(self) -> bool:
        return self.entries is None


def ledger_views(info: pb.ManagedLedgerInfo) -> list[LedgerView]:
    """One :class:`LedgerView` per ``LedgerInfo``, in log order."""
    covered: dict[int, int] = {}
    off_ms: dict[int, int] = {}
    cursor: int | None = None
    for seg in catalog.segments(info):  # in log order
        if not seg.complete:
            continue
        cursor = seg.end.ledger_id
        for r in seg.ranges:
            covered[r.ledger_id] = covered.get(r.ledger_id, 0) + r.count
            off_ms[r.ledger_id] = max(off_ms.get(r.ledger_id, 0), seg.offloaded_ms)
    lis = list(info.ledgerInfo)
    # An empty ledger is "offloaded" when something after it is: walk backwards.
    later_ms: list[int | None] = [None] * len(lis)
    nearest: int | None = None
    for i in range(len(lis) - 1, -1, -1):
        later_ms[i] = nearest
        if lis[i].ledgerId in off_ms:
            nearest = off_ms[lis[i].ledgerId]
    views: list[LedgerView] = []
    for i, li in enumerate(lis):
        entries = li.entries if li.HasField("entries") else None
        closed_ms = li.timestamp
        if i + 1 < len(lis):
            closed_ms = max(closed_ms, lis[i + 1].timestamp)
        if entries is None:
            offloaded, when = False, None
        elif entries > 0:
            offloaded = covered.get(li.ledgerId, 0) >= entries
            when = off_ms.get(li.ledgerId) if offloaded else None
        else:
            offloaded, when = later_ms[i] is not None, later_ms[i]
        views.append(LedgerView(
            li.ledgerId, entries, li.size if li.HasField("size") else 0, closed_ms, offloaded,
            when, li.HasField("offloadContext") and li.offloadContext.bookkeeperDeleted,
            li.ledgerId == cursor))
    return views


@dataclass(frozen=True)
class RetentionLimits:
    """Topic retention; ``None`` = no limit of that kind."""

    max_age_ms: int | None = None
    max_size_bytes: int | None = None

    @classmethod
    def from_config(cls, max_age_minutes: float, max_size_mbytes: float) -> RetentionLimits:
        """Negative values switch a limit off (Pulsar's -1 = infinite retention)."""
        return cls(int(max_age_minutes * 60_000) if max_age_minutes >= 0 else None,
                   int(max_size_mbytes * MiB) if max_size_mbytes >= 0 else None)

    @property
    def active(self) -> bool:
        return self.max_age_ms is not None or self.max_size_bytes is not None


def ledgers_to_delete(views: Sequence[LedgerView], limits: RetentionLimits,
                      now_ms: int) -> list[int]:
    """The oldest ledgers that retention deletes now (a prefix of ``views``)."""
    if not limits.active:
        return []
    total = sum(v.size for v in views)
    chosen: list[int] = []
    freed = 0
    for v in views[:-1]:  # never the current ledger
        if v.open:
            break
        expired = limits.max_age_ms is not None and now_ms - v.closed_ms > limits.max_age_ms
        # Pulsar's rule: delete while the topic, before this ledger goes, is over the quota.
        over = limits.max_size_bytes is not None and total - freed > limits.max_size_bytes
        if not (expired or over) or not v.offloaded or v.cursor:
            break
        chosen.append(v.ledger_id)
        freed += v.size
    return chosen


def source_copies_to_trim(views: Sequence[LedgerView], deletion_lag_ms: int,
                          now_ms: int) -> list[int]:
    """Ledgers whose source copy may go: closed, not the current one, fully offloaded more than
    ``deletion_lag_ms`` ago, and not already trimmed."""
    return [v.ledger_id for v in views[:-1]
            if not v.open and v.offloaded and not v.source_deleted
            and v.offloaded_ms is not None and now_ms - v.offloaded_ms > deletion_lag_ms]


# -- records ------------------------------------------------------------------------------------


def object_keys(uid: uuid.UUID, kind: SegmentKind, ledgers: Iterable[int]) -> list[str]:
    """Every object of a segment, index before data.

    The index is written last and is the commit marker; removing it first makes a half-deleted
    segment look like an abandoned attempt rather than a committed one with data missing.
    """
    return segment_keys(uid, None if kind is SegmentKind.STREAMING else ledgers)


def _decode_json(data: bytes, where: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise FormatError(where, 0, f"not a JSON record ({exc})") from exc
    if not isinstance(doc, dict):
        raise FormatError(where, 0, "record is not a JSON object")
    if doc.get("v") != RECORD_VERSION:
        raise FormatError(where, 0, f"record version {doc.get('v')!r}, expected "
                          f"{RECORD_VERSION}")
    return doc


def _ints(doc: dict[str, Any], key: str, where: str) -> tuple[int, ...]:
    val = doc.get(key, [])
    if not isinstance(val, list) or not all(isinstance(x, int) and not isinstance(x, bool)
                                            for x in val):
        raise FormatError(where, 0, f"{key!r} must be a list of integers")
    return tuple(val)


def _common(doc: dict[str, Any], where: str) -> tuple[uuid.UUID, str, SegmentKind]:
    try:
        uid = uuid.UUID(str(doc["uid"]))
        ml = doc["ml"]
        kind = SegmentKind(doc["kind"])
    except (KeyError, ValueError) as exc:
        raise FormatError(where, 0, f"bad or missing field ({exc})") from exc
    if not isinstance(ml, str) or not ml:
        raise FormatError(where, 0, "'ml' must be a managed-ledger name")
    return uid, ml, kind


@dataclass(frozen=True)
class SegmentRecord:
    """A committed segment as retention tracks it, independent of ``ManagedLedgerInfo``."""

    uid: uuid.UUID
    ml: str
    kind: SegmentKind
    ledgers: tuple[int, ...]
    deleted: tuple[int, ...] = ()
    tracked_ms: int = 0

    @classmethod
    def of(cls, seg: Segment, ml: str, now_ms: int) -> SegmentRecord:
        return cls(seg.uid, ml, seg.kind, seg.ledger_ids(), (), now_ms)

    @property
    def fully_deleted(self) -> bool:
        return set(self.ledgers) <= set(self.deleted)

    def marked(self, present: Collection[int]) -> SegmentRecord:
        """This record with every ledger absent from ``present`` marked deleted."""
        gone = set(self.deleted) | {lid for lid in self.ledgers if lid not in present}
        deleted = tuple(lid for lid in self.ledgers if lid in gone)
        return self if deleted == self.deleted else replace(self, deleted=deleted)

    def encode(self) -> bytes:
        return json.dumps({"v": RECORD_VERSION, "uid": str(self.uid), "ml": self.ml,
                           "kind": self.kind.value, "ledgers": list(self.ledgers),
                           "deleted": list(self.deleted), "tracked_ms": self.tracked_ms},
                          sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes, where: str) -> SegmentRecord:
        doc = _decode_json(data, where)
        uid, ml, kind = _common(doc, where)
        ledgers = _ints(doc, "ledgers", where)
        if not ledgers:
            raise FormatError(where, 0, "a segment record names no ledger")
        tracked = doc.get("tracked_ms", 0)
        if not isinstance(tracked, int):
            raise FormatError(where, 0, "'tracked_ms' must be an integer")
        return cls(uid, ml, kind, ledgers, _ints(doc, "deleted", where), tracked)


@dataclass(frozen=True)
class DeletionRecord:
    """A segment whose every ledger is deleted: its objects go, and until they have all gone
    (whatever fails, however often) this record stays."""

    uid: uuid.UUID
    ml: str
    kind: SegmentKind
    ledgers: tuple[int, ...]
    created_ms: int
    attempts: int = 0
    last_attempt_ms: int | None = None
    last_error: str | None = None
    not_before_ms: int = 0  # objects stay until then (a merge's deletion lag)
    merged_into: uuid.UUID | None = None  # the merged segment that replaced this one

    @classmethod
    def of(cls, rec: SegmentRecord, now_ms: int) -> DeletionRecord:
        return cls(rec.uid, rec.ml, rec.kind, rec.ledgers, now_ms)

    @classmethod
    def merged(cls, seg: Segment, ml: str, into: uuid.UUID, now_ms: int,
               lag_ms: int) -> DeletionRecord:
        """The record of ``seg``, replaced by the merged segment ``into`` at ``now_ms``."""
        return cls(seg.uid, ml, seg.kind, seg.ledger_ids(), now_ms,
                   not_before_ms=now_ms + max(lag_ms, 0), merged_into=into)

    def due(self, now_ms: int) -> bool:
        """Its objects may be deleted now (the deletion lag has passed)."""
        return now_ms >= self.not_before_ms

    def keys(self) -> list[str]:
        return object_keys(self.uid, self.kind, self.ledgers)

    def failed(self, now_ms: int, error: str) -> DeletionRecord:
        return replace(self, attempts=self.attempts + 1, last_attempt_ms=now_ms,
                       last_error=error)

    def encode(self) -> bytes:
        return json.dumps({"v": RECORD_VERSION, "uid": str(self.uid), "ml": self.ml,
                           "kind": self.kind.value, "ledgers": list(self.ledgers),
                           "created_ms": self.created_ms, "attempts": self.attempts,
                           "last_attempt_ms": self.last_attempt_ms,
                           "last_error": self.last_error,
                           **({"not_before_ms": self.not_before_ms}
                              if self.not_before_ms else {}),
                           **({"merged_into": str(self.merged_into)}
                              if self.merged_into is not None else {})},
                          sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes, where: str) -> DeletionRecord:
        doc = _decode_json(data, where)
        uid, ml, kind = _common(doc, where)
        created, attempts = doc.get("created_ms", 0), doc.get("attempts", 0)
        last_ms, last_error = doc.get("last_attempt_ms"), doc.get("last_error")
        if not (isinstance(created, int) and isinstance(attempts, int)
                and (last_ms is None or isinstance(last_ms, int))
                and (last_error is None or isinstance(last_error, str))):
            raise FormatError(where, 0, "bad field types in deletion record")
        not_before, into = doc.get("not_before_ms", 0), doc.get("merged_into")
        if not isinstance(not_before, int) or not (into is None or isinstance(into, str)):
            raise FormatError(where, 0, "bad field types in deletion record")
        try:
            merged_into = uuid.UUID(into) if into is not None else None
        except ValueError as exc:
            raise FormatError(where, 0, f"'merged_into' is not a uuid ({exc})") from exc
        return cls(uid, ml, kind, _ints(doc, "ledgers", where), created, attempts, last_ms,
                   last_error, not_before, merged_into)


# -- orphans ------------------------------------------------------------------------------------


def orphans(objects: Iterable[ObjectInfo], referenced: Collection[uuid.UUID], grace_s: float,
            now_s: float) -> list[str]:
    """Keys of ours (``parse_key``) whose uuid nothing references, last modified more than
    ``grace_s`` ago; and a conditional-write probe's key a killed process left behind. Keys
    that are not ours are never candidates."""
    out: list[str] = []
    for obj in objects:
        parsed = parse_key(obj.key)
        probe = parsed is None and obj.key.startswith(PROBE_KEY_PREFIX)
        if not probe and (parsed is None or parsed.uid in referenced):
            continue
        if now_s - obj.mtime >= grace_s:
            out.append(obj.key)
    return out
