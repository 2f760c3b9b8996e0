"""Merging small segments in the tier (``offloadd compact``; docs/retention.md, "Merging").

A low-rate topic rolled by time leaves many small object pairs (a 10 s roll is 8,640 pairs a
day). A merge rewrites a run of adjacent committed streaming segments of one topic into one
segment, the way Redpanda merges adjacent segments in its tier::

    plan      committed streaming segments in log order, each below the target size; runs of
              adjacent ones grouped greedily while a group stays within the target (pure:
              :func:`plan`). An ASSIGNED segment (an attempt in flight or to be redone) and a
              ledger-based (PIP-17) one end a run; the open segment is not in the catalog yet.
    rewrite   read the group's entries back through the tier reader (every block checked),
              write them as one new streaming pair through the normal attempt
              (:func:`~offloadd.offload.attempt.open_streaming`: the same object format, the
              same throttle, the index last)
    swap      ONE fenced compare-and-set (:func:`offloadd.commit.edits.apply`): the old
              segments' records become the new segment's (``catalog.merge_segments``), and in
              the same transaction each old segment gets its pending-deletion record
              (:class:`~offloadd.retention.policy.DeletionRecord`, due after the topic's
              deletion lag)
    delete    gc deletes the old objects once the lag has passed (``retention/gc.py``)

Readers never see a gap or a duplicate: the catalog names either the old segments or the new
one, never both, and a reader that listed the old catalog still finds the old objects until the
lag has passed. A crash before the swap leaves the new objects unreferenced (orphans, swept by gc
after ``orphan_grace_s``; an incomplete upload by the upload sweep); after it, the old ones are
pending deletion. The swap re-checks the catalog it edits: if a segment of the group changed
meanwhile the merge gives up (its new objects are deleted) and the next run plans again; a
stale owner's swap fails on the fence (``Fenced``) like any commit.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from offloadd._proto import mldataformats_pb2 as pb
from offloadd.commit import edits
from offloadd.commit.fence import Fence
from offloadd.errors import Conflict, Fenced, FormatError, NotFound, OffloaddError
from offloadd.format.streaming import StreamingIndex
from offloadd.metadata import managed_ledger
from offloadd.metadata.base import CreateOp, MetadataStore, Op
from offloadd.model import EntryRun, TopicName, catalog
from offloadd.model.catalog import LedgerRange, Segment, SegmentKind
from offloadd.model.frames import FRAME
from offloadd.model.keys import DELETIONS, deletion_path, segment_record_path, streaming_index_key
from offloadd.model.segment_state import SegmentState, Tracked
from offloadd.offload.attempt import SegmentAttempt, Uploads, delete_attempt, open_streaming
from offloadd.offload.runs import Run
from offloadd.read.reader import Entry, TierReader
from offloadd.retention.gc import referenced_uids
from offloadd.retention.policy import DeletionRecord

__all__ = ["MergeReport", "MergeSettings", "Sized", "compact_topic", "merged_ranges", "plan"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MergeSettings:
    """What a merge needs of the topic's configuration."""

    target_bytes: int  # a merged segment's data object stays within this
    max_block_size: int
    min_block_size: int = 0
    deletion_lag_ms: int = 14_400_000  # the old objects stay this long after the swap


@dataclass(frozen=True)
class Sized:
    """A segment and its data object's length (0 when unknown: never merged)."""

    segment: Segment
    size: int


def plan(segs: Sequence[Sized], target_bytes: int) -> list[tuple[Segment, ...]]:
    """Groups of two or more adjacent committed streaming segments, each below
    ``target_bytes``, whose sizes add up to at most ``target_bytes`` (greedy, in log order)."""
    groups: list[tuple[Segment, ...]] = []
    cur: list[Sized] = []

    def flush() -> None:
        if len(cur) >= 2:
            groups.append(tuple(s.segment for s in cur))
        cur.clear()

    for s in segs:
        seg = s.segment
        if not (seg.complete and seg.kind is SegmentKind.STREAMING and 0 < s.size < target_bytes):
            flush()
            continue
        if cur and sum(c.size for c in cur) + s.size > target_bytes:
            flush()
        cur.append(s)
    flush()
    return groups


def merged_ranges(group: Sequence[Segment]) -> tuple[LedgerRange, ...]:
    """The ledger ranges of the segment merged from ``group`` (adjacent, in log order)."""
    out: list[LedgerRange] = []
    for seg in group:
        for r in seg.ranges:
            if out and out[-1].ledger_id == r.ledger_id:
                if r.first != out[-1].last + 1:
                    raise ValueError(f"segment {seg.uid} does not continue ledger "
                                     f"{r.ledger_id} at entry {out[-1].last + 1}")
                out[-1] = LedgerRange(r.ledger_id, out[-1].first, r.last)
            else:
                out.append(r)
    return tuple(out)


@dataclass
class MergeReport:
    """What :func:`compact_topic` did for one topic."""

    topic: str
    segments_before: int = 0
    segments_after: int = 0
    bytes_before: int = 0  # data objects of the segments it planned over
    merged: list[dict[str, Any]] = field(default_factory=list)  # one per swap made
    skipped: list[str] = field(default_factory=list)  # groups given up (the catalog moved)

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "segments_before": self.segments_before,
                "segments_after": self.segments_after, "bytes_before": self.bytes_before,
                "merged": self.merged, "skipped": self.skipped}


async def compact_topic(topic: TopicName, metadata: MetadataStore, reader: TierReader,
                        uploads: Uploads, fence: Fence, settings: MergeSettings, *,
                        wall_ms: Callable[[], int],
                        max_groups: int | None = None,
                        sizes: dict[uuid.UUID, int] | None = None) -> MergeReport:
    """Merge ``topic``'s small adjacent segments (see the module doc); ``max_groups`` bounds
    how many merges this call makes (the daemon's background merger takes a few at a time).
    ``sizes``: data-object lengths known from earlier calls (uid -> bytes), kept up to date
    here, so that a periodic caller reads each segment's index once, not once per pass.

    Raises ``Fenced`` when the topic is no longer ours; a group whose segments changed while it
    was rewritten is skipped (reported), not retried here."""
    ml = topic.managed_ledger
    report = MergeReport(str(topic))
    info, _ = await managed_ledger.load(metadata, ml)
    await fence.verify()
    segs = catalog.segments(info)
    report.segments_before = report.segments_after = len(segs)
    known = sizes if sizes is not None else {}
    for gone in set(known) - {s.uid for s in segs}:
        del known[gone]
    sized = []
    for seg in segs:
        if seg.uid not in known:
            size = await _size(reader, seg)
            if seg.complete:  # an ASSIGNED record may still be redone under another uuid
                known[seg.uid] = size
        sized.append(Sized(seg, known.get(seg.uid, 0)))
    report.bytes_before = sum(s.size for s in sized)
    groups = plan(sized, settings.target_bytes)
    if max_groups is not None:
        groups = groups[:max_groups]
    stamps = {li.ledgerId: li.timestamp for li in info.ledgerInfo}
    for group in groups:
        done = await _merge(topic, metadata, reader, uploads, fence, settings, group, stamps,
                            wall_ms)
        if done is None:
            report.skipped.append(",".join(str(s.uid) for s in group))
            continue
        report.merged.append({"into": str(done), "segments": [str(s.uid) for s in group],
                              "entries": sum(s.entries for s in group)})
        known[done] = sum(known.pop(s.uid, 0) for s in group)  # about: blocks are re-cut
        report.segments_after -= len(group) - 1
    return report


async def _size(reader: TierReader, seg: Segment) -> int:
    if not seg.complete or seg.kind is not SegmentKind.STREAMING:
        return 0
    idx = await reader.index(streaming_index_key(seg.uid))
    return idx.data_object_length if isinstance(idx, StreamingIndex) else 0


class _Frames:
    """Entries read back, framed again into runs of one ledger and fed to the attempt."""

    def __init__(self, att: SegmentAttempt, budget: int, stamps: Mapping[int, int]) -> None:
        self.att = att
        self.budget = max(budget, 1)
        self.stamps = stamps
        self._reset(-1, 0)

    def _reset(self, ledger_id: int, first: int) -> None:
        self.ledger_id, self.first = ledger_id, first
        self.buf = bytearray()
        self.offsets: list[int] = []

    async def add(self, e: Entry) -> None:
        pos, n = e.position, len(e.payload)
        if self.offsets and (pos.ledger_id != self.ledger_id
                             or pos.entry_id != self.first + len(self.offsets)
                             or len(self.buf) + FRAME.size + n > self.budget):
            await self.flush()
        if not self.offsets:
            self._reset(pos.ledger_id, pos.entry_id)
        self.offsets.append(len(self.buf))
        self.buf += FRAME.pack(n, pos.entry_id)
        self.buf += e.payload

    async def flush(self) -> None:
        if not self.offsets:
            return
        run = EntryRun(self.ledger_id, self.first, memoryview(self.buf),
                       [*self.offsets, len(self.buf)])
        await self.att.wait_for_room()  # read no further ahead than the uploads take
        if self.att.upload.failed is not None:
            raise self.att.upload.failed
        # the run owns its buffer (a fresh one is started): nothing to give back
        self.att.feed(Run(run, lambda: None), self.stamps.get(self.ledger_id, 0))
        self._reset(-1, 0)


async def _merge(topic: TopicName, metadata: MetadataStore, reader: TierReader,
                 uploads: Uploads, fence: Fence, settings: MergeSettings,
                 group: tuple[Segment, ...], stamps: Mapping[int, int],
                 wall_ms: Callable[[], int]) -> uuid.UUID | None:
    """Rewrite ``group`` as one segment and swap it in; its uuid, or None if the catalog moved
    under the merge (its new objects are deleted)."""
    ml = topic.managed_ledger
    want = merged_ranges(group)
    merged = Tracked()
    att = await open_streaming(uploads, max_block_size=settings.max_block_size,
                               min_block_size=settings.min_block_size)
    try:
        frames = _Frames(att, settings.max_block_size, stamps)
        for seg in group:
            async for entry in reader.read_segment(seg):
                await frames.add(entry)
        await frames.flush()
        if tuple(att.ranges) != want:
            raise FormatError(str(att.uid), 0, f"merge of {len(group)} segments read "
                              f"{tuple(att.ranges)}, the catalog says {want}")
        await att.seal()
    except Fenced:
        # the store refused to overwrite a key of this attempt: not ours to delete
        await att.abort()
        raise
    except BaseException:
        await att.abort()
        with contextlib.suppress(OffloaddError):  # never recorded: nobody references them
            await delete_attempt(uploads.store, att.uid)
        raise
    now = wall_ms()
    records = [DeletionRecord.merged(seg, ml, att.uid, now, settings.deletion_lag_ms)
               for seg in group]
    also: list[Op] = [CreateOp(deletion_path(r.uid), r.encode()) for r in records]
    with contextlib.suppress(Conflict):
        await metadata.create(DELETIONS, b"", make_parents=True)

    def swap(info: pb.ManagedLedgerInfo) -> bool:
        return catalog.merge_segments(info, group, att.uid, now, att.usage)

    # the new segment goes NEW -> ASSIGNED -> OFFLOADED in the swap's one write; the swap
    # itself moves the old ones OFFLOADED -> MERGED, checked on the records it reads
    merged.to(SegmentState.ASSIGNED)
    merged.to(SegmentState.OFFLOADED)
    try:
        await edits.apply(metadata, ml, swap, fence, also=also)
    except (NotFound, Fenced) as exc:
        # The catalog moved (a segment of the group replaced or deleted) or the topic has a
        # newer owner; or an earlier try of this very write landed and its answer was lost:
        # the catalog says which. Objects it does not reference are nobody's: deleted.
        info, _ = await managed_ledger.load(metadata, ml)
        if att.uid not in referenced_uids(info):
            log.warning("topic %s: merge of %d segments given up (%s); its new objects are "
                        "deleted", topic, len(group), exc)
            with contextlib.suppress(OffloaddError):
                await delete_attempt(uploads.store, att.uid)
            if isinstance(exc, Fenced):
                raise
            return None
    for seg in group:  # retention tracks the merged segment now (gc drops these too)
        with contextlib.suppress(OffloaddError):
            await metadata.delete(segment_record_path(ml, seg.uid))
    log.info("topic %s: merged %d segments (%s..%s, %d entries) into %s", topic, len(group),
             want[0].ledger_id, group[-1].end, sum(s.entries for s in group), att.uid)
    return att.uid
