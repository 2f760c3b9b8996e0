"""The segment catalog: what is offloaded where, derived from ``ManagedLedgerInfo`` (pure).

A streaming segment appears as one ``OffloadSegment`` (same uuid) in every ledger it touches, with
``endEntryId`` = its last entry in that ledger (as Pulsar's offloaded-ledger records;
docs/design.md "Metadata"). Its begin in each ledger is implicit: the entry after the previous
segment's end in that ledger, or 0. A ledger offloaded whole in the ledger-based format (PIP-17)
carries an ``OffloadContext`` with ``complete``.

What the records store of a segment's state; each edit below checks the change it makes against
the state table (:func:`offloadd.model.segment_state.advance`) on the records it reads, so an
illegal change is refused inside the compare-and-set and never written::

    ASSIGNED  (records present, complete=false)  -> range fixed, objects being written
    OFFLOADED (complete=true on every record)    -> readable from the tier

Everything here works on the protobuf message in memory; persisting is the caller's job
(:func:`offloadd.commit.edits.apply`, through the compare-and-set loop).
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from offloadd._proto import mldataformats_pb2 as pb
from offloadd.model import Position
from offloadd.model.keys import msb_lsb_to_uuid, uuid_to_msb_lsb
from offloadd.model.segment_state import SegmentState, advance, stored


class SegmentKind(enum.Enum):
    STREAMING = "streaming"  # PIP-76 object pair <uuid>, <uuid>-index
    LEDGER = "ledger"  # PIP-17 object pair per ledger


@dataclass(frozen=True)
class LedgerRange:
    """Entries ``first..last`` of ``ledger_id`` (inclusive)."""

    ledger_id: int
    first: int
    last: int

    @property
    def count(self) -> int:
        return self.last - self.first + 1


class Span:
    """Begin, end and size of anything laid out as ``ranges`` in log order."""

    ranges: tuple[LedgerRange, ...]

    @property
    def begin(self) -> Position:
        return Position(self.ranges[0].ledger_id, self.ranges[0].first)

    @property
    def end(self) -> Position:
        return Position(self.ranges[-1].ledger_id, self.ranges[-1].last)

    @property
    def entries(self) -> int:
        return sum(r.count for r in self.ranges)


@dataclass(frozen=True)
class Segment(Span):
    uid: uuid.UUID
    kind: SegmentKind
    ranges: tuple[LedgerRange, ...]  # in log order, non-empty
    complete: bool
    assigned_ms: int = 0
    offloaded_ms: int = 0
    driver: str = ""
    driver_properties: tuple[tuple[str, str], ...] = ()

    def ledger_ids(self) -> tuple[int, ...]:
        return tuple(r.ledger_id for r in self.ranges)

    def contains(self, pos: Position) -> bool:
        return any(r.ledger_id == pos.ledger_id and r.first <= pos.entry_id <= r.last
                   for r in self.ranges)


def segments(info: pb.ManagedLedgerInfo) -> list[Segment]:
    """Every segment recorded in ``info``, in log order."""
    order: list[uuid.UUID] = []
    parts: dict[uuid.UUID, list[tuple[LedgerRange, pb.OffloadSegment]]] = {}
    out: list[Segment] = []
    for li in info.ledgerInfo:
        ctx = li.offloadContext if li.HasField("offloadContext") else None
        if ctx is not None and (ctx.uidMsb or ctx.uidLsb) and not len(ctx.offloadSegment):
            if li.HasField("entries") and li.entries > 0:
                uid = msb_lsb_to_uuid(ctx.uidMsb, ctx.uidLsb)
                out.append(Segment(uid, SegmentKind.LEDGER,
                                   (LedgerRange(li.ledgerId, 0, li.entries - 1),),
                                   bool(ctx.complete), ctx.timestamp, ctx.timestamp,
                                   *_driver(ctx.driverMetadata if ctx.HasField("driverMetadata")
                                            else None)))
            continue
        if ctx is None:
            continue
        nxt = 0
        for seg in ctx.offloadSegment:
            uid = msb_lsb_to_uuid(seg.uidMsb, seg.uidLsb)
            r = LedgerRange(li.ledgerId, nxt, seg.endEntryId)
            nxt = seg.endEntryId + 1
            if uid not in parts:
                parts[uid] = []
                order.append(uid)
            parts[uid].append((r, seg))
    for uid in order:
        recs = parts[uid]
        first = recs[0][1]
        drv = _driver(first.driverMetadata if first.HasField("driverMetadata") else None)
        out.append(Segment(uid, SegmentKind.STREAMING, tuple(r for r, _ in recs),
                           all(s.complete for _, s in recs), first.assignedTimestamp,
                           first.offloadedTimestamp, *drv))
    ledger_pos = {li.ledgerId: i for i, li in enumerate(info.ledgerInfo)}
    out.sort(key=lambda s: (ledger_pos.get(s.ranges[0].ledger_id, -1), s.ranges[0].first))
    return out


def _driver(md: pb.OffloadDriverMetadata | None) -> tuple[str, tuple[tuple[str, str], ...]]:
    if md is None:
        return "", ()
    return md.name, tuple((kv.key, kv.value) for kv in md.properties)


def driver_metadata(name: str, props: Mapping[str, str]) -> pb.OffloadDriverMetadata:
    md = pb.OffloadDriverMetadata(name=name)
    for k in sorted(props):
        md.properties.add(key=k, value=props[k])
    return md


def add_assigned(info: pb.ManagedLedgerInfo, uid: uuid.UUID, ranges: Sequence[LedgerRange],
                 now_ms: int, driver: pb.OffloadDriverMetadata) -> bool:
    """Record a streaming segment as ASSIGNED in every ledger it touches.

    Refuses (``ValueError``) a range that does not start right after the last recorded
    segment of its ledger: segments are contiguous and never overlap.
    """
    msb, lsb = uuid_to_msb_lsb(uid)
    for seg in _records(info, uid):  # recorded already: the segment must not go backwards
        advance(stored(seg.complete), SegmentState.ASSIGNED)
    by_id = {li.ledgerId: li for li in info.ledgerInfo}
    for r in ranges:
        li = by_id.get(r.ledger_id)
        if li is None:
            raise ValueError(f"ledger {r.ledger_id} is not in the managed ledger")
        ctx = li.offloadContext
        expected = ctx.offloadSegment[-1].endEntryId + 1 if len(ctx.offloadSegment) else 0
        if r.first != expected:
            raise ValueError(f"segment {uid} would start at {r.ledger_id}:{r.first}, "
                             f"but ledger {r.ledger_id} continues at entry {expected}")
    for r in ranges:
        seg = by_id[r.ledger_id].offloadContext.offloadSegment.add()
        seg.uidMsb, seg.uidLsb = msb, lsb
        seg.complete = False
        seg.assignedTimestamp = now_ms
        seg.endEntryId = r.last
        seg.driverMetadata.CopyFrom(driver)
    return True


# What a committed segment costs in the tier, recorded with it (driver properties of its first
# record; Pulsar's readers ignore keys they do not know): ``offloadd status`` sums these over
# the committed segments, so what retention deleted drops out, and no status LISTs the bucket.
USAGE_OBJECTS = "offloadd.objects"
USAGE_STORED = "offloadd.storedBytes"
USAGE_PAYLOAD = "offloadd.payloadBytes"
USAGE_PUTS = "offloadd.putRequests"


@dataclass(frozen=True)
class TierUsage:
    """One segment's (or a sum of segments') objects, bytes and PUT-class requests."""

    objects: int = 0
    stored_bytes: int = 0  # data and index objects, as stored
    payload_bytes: int = 0  # the entries' payloads
    put_requests: int = 0  # PUT-class requests that wrote them (retries not included)

    def properties(self) -> dict[str, str]:
        return {USAGE_OBJECTS: str(self.objects), USAGE_STORED: str(self.stored_bytes),
                USAGE_PAYLOAD: str(self.payload_bytes), USAGE_PUTS: str(self.put_requests)}

    def __add__(self, other: TierUsage) -> TierUsage:
        return TierUsage(self.objects + other.objects, self.stored_bytes + other.stored_bytes,
                         self.payload_bytes + other.payload_bytes,
                         self.put_requests + other.put_requests)


def usage_of(seg: Segment) -> TierUsage | None:
    """What ``seg`` recorded of its usage; None when it recorded none (written before offloadd
    recorded it, or by another writer)."""
    props = dict(seg.driver_properties)
    try:
        return TierUsage(int(props[USAGE_OBJECTS]), int(props[USAGE_STORED]),
                         int(props[USAGE_PAYLOAD]), int(props[USAGE_PUTS]))
    except (KeyError, ValueError):
        return None


def _record_usage(md: pb.OffloadDriverMetadata, usage: TierUsage) -> None:
    props = {kv.key: kv.value for kv in md.properties}
    props.update(usage.properties())
    md.CopyFrom(driver_metadata(md.name, props))


def _forget_usage(md: pb.OffloadDriverMetadata) -> None:
    props = {kv.key: kv.value for kv in md.properties
             if kv.key not in TierUsage().properties()}
    md.CopyFrom(driver_metadata(md.name, props))


def mark_offloaded(info: pb.ManagedLedgerInfo, uid: uuid.UUID, now_ms: int,
                   ledger_ids: Iterable[int] = (), usage: TierUsage | None = None) -> bool:
    """ASSIGNED -> OFFLOADED on every record of ``uid``; ``KeyError`` if none exists, or if
    one of ``ledger_ids`` (the ledgers the segment was assigned over) no longer holds its
    record: a ledger dropped since the ASSIGN (a sidecar's mirror follows Pulsar's retention)
    was reported lost from its last committed entry on, so committing the rest would claim less
    than the segment's index holds. The offloader then redoes what is left."""
    msb, lsb = uuid_to_msb_lsb(uid)
    holding = {li.ledgerId for li in info.ledgerInfo if li.HasField("offloadContext")
               and any(s.uidMsb == msb and s.uidLsb == lsb
                       for s in li.offloadContext.offloadSegment)}
    gone = sorted(set(ledger_ids) - holding)
    if gone and holding:
        raise KeyError(f"segment {uid} lost the records of ledgers {gone} (deleted since it "
                       "was assigned)")
    found = False
    for seg in _records(info, uid):
        advance(stored(seg.complete), SegmentState.OFFLOADED)
        # on every record, not only the first one segments() reads: retention deletes a
        # segment's ledgers one at a time, and the segment, still readable, keeps its usage
        if usage is not None:
            _record_usage(seg.driverMetadata, usage)
        found = True
        seg.complete = True
        seg.offloadedTimestamp = now_ms
    if not found:
        raise KeyError(f"segment {uid} is not recorded")
    return True


def remove_segment(info: pb.ManagedLedgerInfo, uid: uuid.UUID) -> bool:
    """Drop every record of ``uid``.

    Used for an abandoned attempt (always the newest segment, so the rest stay contiguous).
    """
    changed = False
    msb, lsb = uuid_to_msb_lsb(uid)
    for li in info.ledgerInfo:
        if not li.HasField("offloadContext"):
            continue
        segs = li.offloadContext.offloadSegment
        keep = [s for s in segs if not (s.uidMsb == msb and s.uidLsb == lsb)]
        if len(keep) != len(segs):
            changed = True
            copies = [pb.OffloadSegment() for _ in keep]
            for c, s in zip(copies, keep, strict=True):
                c.CopyFrom(s)
            del segs[:]
            segs.extend(copies)
    return changed


def reassign(info: pb.ManagedLedgerInfo, old: uuid.UUID, new: uuid.UUID, now_ms: int) -> bool:
    """Give the ASSIGNED records of ``old`` the uuid ``new``, in place: the redo of any segment,
    not only the newest (the records keep their place, and so their begins, in every ledger).
    :class:`IllegalTransition` if ``old`` is already offloaded, ``KeyError`` if it is not
    recorded."""
    n_msb, n_lsb = uuid_to_msb_lsb(new)
    found = False
    for seg in _records(info, old):
        advance(stored(seg.complete), SegmentState.ASSIGNED)  # an offloaded one is not redone
        seg.uidMsb, seg.uidLsb = n_msb, n_lsb
        seg.assignedTimestamp = now_ms
        found = True
    if not found:
        raise KeyError(f"segment {old} is no longer recorded")
    return True


def merge_segments(info: pb.ManagedLedgerInfo, old: Sequence[Segment], new: uuid.UUID,
                   now_ms: int, usage: TierUsage | None = None) -> bool:
    """Replace the committed streaming segments ``old`` (adjacent, in log order, as the caller
    read them) by the one segment ``new`` holding exactly their positions, in place: in every
    ledger the run of their records becomes one record of ``new`` (``complete``, ending where
    the last of them ended), so the records around it keep their begins. The new segment's
    first record carries ``usage`` (what the merged pair costs in the tier), never the usage
    the first old segment recorded; without ``usage`` it records none (counted as unsized).

    ``ValueError`` when the catalog no longer holds ``old`` as given (a segment replaced,
    deleted, not committed, not adjacent, a range changed): the merge was planned on a catalog
    that has moved, and must not be applied to this one.
    """
    if len(old) < 2:
        raise ValueError("a merge needs at least two segments")
    current = segments(info)
    where = {s.uid: i for i, s in enumerate(current)}
    first = where.get(old[0].uid)
    if first is None:
        raise ValueError(f"segment {old[0].uid} is no longer recorded")
    for k, seg in enumerate(old):
        i = first + k
        if i >= len(current) or current[i].uid != seg.uid:
            raise ValueError(f"segment {seg.uid} is no longer where the merge found it")
        cur = current[i]
        if cur.kind is not SegmentKind.STREAMING or cur.ranges != seg.ranges:
            raise ValueError(f"segment {seg.uid} changed since the merge read it")
        advance(stored(cur.complete), SegmentState.MERGED)  # only committed ones are merged
    gone = {uuid_to_msb_lsb(s.uid) for s in old}
    n_msb, n_lsb = uuid_to_msb_lsb(new)
    offloaded = max(s.offloaded_ms for s in old)
    for li in info.ledgerInfo:
        if not li.HasField("offloadContext"):
            continue
        segs = li.offloadContext.offloadSegment
        idx = [i for i, s in enumerate(segs) if (s.uidMsb, s.uidLsb) in gone]
        if not idx:
            continue
        if idx != list(range(idx[0], idx[-1] + 1)):
            raise ValueError(f"the merged segments are not adjacent in ledger {li.ledgerId}")
        keep = pb.OffloadSegment()
        keep.CopyFrom(segs[idx[0]])
        keep.uidMsb, keep.uidLsb = n_msb, n_lsb
        keep.complete = True
        keep.assignedTimestamp = now_ms
        # when the data first reached the tier: the deletion lag of the source's copies
        # counts from there, not from the rewrite
        keep.offloadedTimestamp = offloaded
        keep.endEntryId = segs[idx[-1]].endEntryId
        _forget_usage(keep.driverMetadata)
        if usage is not None:  # on every record, as mark_offloaded does
            _record_usage(keep.driverMetadata, usage)
        copies = []
        for i, s in enumerate(segs):
            if i == idx[0]:
                copies.append(keep)
            elif i not in idx:
                c = pb.OffloadSegment()
                c.CopyFrom(s)
                copies.append(c)
        del segs[:]
        segs.extend(copies)
    return True


def _records(info: pb.ManagedLedgerInfo, uid: uuid.UUID) -> Iterable[pb.OffloadSegment]:
    msb, lsb = uuid_to_msb_lsb(uid)
    for li in info.ledgerInfo:
        if li.HasField("offloadContext"):
            for seg in li.offloadContext.offloadSegment:
                if seg.uidMsb == msb and seg.uidLsb == lsb:
                    yield seg


def next_position(info: pb.ManagedLedgerInfo) -> Position | None:
    """The position right after the last recorded segment (complete or not), else the first
    ledger's entry 0; ``None`` for a managed ledger without ledgers.

    The result may be one past the end of a closed ledger: callers normalise against the source.
    """
    segs = segments(info)
    if segs:
        end = segs[-1].end
        return Position(end.ledger_id, end.entry_id + 1)
    if len(info.ledgerInfo):
        return Position(info.ledgerInfo[0].ledgerId, 0)
    return None


def assign_ledger(info: pb.ManagedLedgerInfo, ledger_id: int, uid: uuid.UUID, now_ms: int,
                  driver: pb.OffloadDriverMetadata) -> bool:
    """Record a whole-ledger (PIP-17) offload of ``ledger_id`` as ASSIGNED (``complete=false``),
    replacing an earlier incomplete attempt. Refuses a ledger that holds streaming records."""
    li = _ledger(info, ledger_id)
    ctx = li.offloadContext
    if len(ctx.offloadSegment):
        raise ValueError(f"ledger {ledger_id} already holds streaming segments")
    if ctx.HasField("uidMsb") or ctx.complete:  # an earlier attempt: redone, never undone
        advance(stored(ctx.complete), SegmentState.ASSIGNED)
    ctx.uidMsb, ctx.uidLsb = uuid_to_msb_lsb(uid)
    ctx.complete = False
    ctx.timestamp = now_ms
    ctx.driverMetadata.CopyFrom(driver)
    return True


def complete_ledger(info: pb.ManagedLedgerInfo, ledger_id: int, uid: uuid.UUID,
                    now_ms: int, usage: TierUsage | None = None) -> bool:
    """ASSIGNED → OFFLOADED for a whole-ledger offload; ``KeyError`` if another attempt owns it."""
    ctx = _ledger(info, ledger_id).offloadContext
    if msb_lsb_to_uuid(ctx.uidMsb, ctx.uidLsb) != uid:
        raise KeyError(f"ledger {ledger_id} is not assigned to {uid}")
    advance(stored(ctx.complete), SegmentState.OFFLOADED)
    if usage is not None:
        _record_usage(ctx.driverMetadata, usage)
    ctx.complete = True
    ctx.timestamp = now_ms
    return True


def _ledger(info: pb.ManagedLedgerInfo, ledger_id: int) -> pb.ManagedLedgerInfo.LedgerInfo:
    for li in info.ledgerInfo:
        if li.ledgerId == ledger_id:
            return li
    raise ValueError(f"ledger {ledger_id} is not in the managed ledger")
