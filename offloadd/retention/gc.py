"""One garbage-collection pass: retention, deletions, retries, orphans (``offloadd gc``).

A pass, in order (the records and rules are in :mod:`offloadd.retention.policy`)::

    for every topic (every managed ledger, plus those only segment records still remember):
      1 track   a SegmentRecord for each committed segment not recorded yet
      2 retain  [retention] max_age_minutes / max_size_mbytes: delete the oldest offloaded
                ledgers through the source's ``LedgerDeleter`` (the embedded store's)
      3 trim    [retention] trim_source: drop the source's copy of ledgers offloaded more than
                offload.deletion_lag_ms ago (set ``bookkeeperDeleted`` first, then the source's
                ``LocalCopies`` drops the data: gc itself touches no file)
      4 mark    ledgers gone from the managed ledger are marked in the records; a record with
                every ledger marked becomes a DeletionRecord (created in the transaction that
                removes the SegmentRecord)
    5 delete    every DeletionRecord, new or left by an earlier pass: delete the objects, then
                the record; on failure the record stays, with the error, for the next pass.
                A merge's records (segments a merged one replaced) wait until their
                ``not_before_ms`` (the deletion lag) has passed; their SegmentRecords go at once
    6 sweep     orphans (objects of ours whose uuid nothing references, older than the grace
                period) and the blob store's stale incomplete uploads

Invariant, checked rather than assumed: an object whose uuid a managed ledger references (a
committed or an assigned segment) is never deleted. Steps 5 and 6 read the metadata again after
deciding, right before deleting, and refuse (and report) when the uuid is referenced.

Nothing is deleted on metadata that could not be read: a topic whose managed ledger fails to
load is skipped whole (its ledgers do not count as absent), and the orphan sweep is skipped when
any reference cannot be read. Concurrent passes are safe: every record change is a
compare-and-set, and deleting an absent object is not an error.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from typing import Protocol

from offloadd._proto import mldataformats_pb2 as pb
from offloadd.blobstore.base import StoreView
from offloadd.errors import ConfigError, Conflict, FormatError, NotFound, OffloaddError
from offloadd.ledger.base import SourceView
from offloadd.metadata import managed_ledger
from offloadd.metadata.base import CreateOp, DeleteOp, MetadataStore
from offloadd.model import TopicName, catalog
from offloadd.model.catalog import Segment
from offloadd.model.keys import (
    DELETIONS,
    SEGMENT_RECORDS,
    deletion_path,
    msb_lsb_to_uuid,
    parse_key,
    segment_record_path,
    segment_records_path,
)
from offloadd.model.segment_state import SegmentState, advance
from offloadd.retention.policy import (
    DeletionRecord,
    LedgerView,
    RetentionLimits,
    SegmentRecord,
    ledger_views,
    ledgers_to_delete,
    orphans,
    source_copies_to_trim,
)
from offloadd.retention.report import GcReport, LedgerAction, Mark, SegmentDeletion, render_text

__all__ = [
    "DeleteProbe",
    "GcProbe",
    "GcReport",
    "GcSettings",
    "LedgerAction",
    "SegmentDeletion",
    "gc_pass",
    "referenced_uids",
    "render_text",
    "retained_uids",
]

log = logging.getLogger(__name__)

_ML_DEPTH = 4  # tenant/namespace/persistent/topic


class DeleteProbe(Protocol):
    def delete_op(self, succeeded: bool = True) -> None: ...


class GcProbe(Protocol):
    """Metrics hook, satisfied by :class:`offloadd.metrics.Metrics`: every attempt to delete a
    segment's objects counts once in its topic's ``brk_ledgeroffloader_delete_offload_ops``
    (orphans belong to no topic and are not counted)."""

    def topic_named(self, topic: str) -> DeleteProbe: ...


@dataclass(frozen=True)
class GcSettings:
    """What a pass needs of the configuration (``[retention]``, each topic's deletion lag)."""

    orphan_grace_s: float = 7200.0
    limits: RetentionLimits = field(default_factory=RetentionLimits)
    trim_source: bool = False
    # managedLedgerOffloadDeletionLagInMillis of a topic (its offload policy)
    deletion_lag_ms: Callable[[TopicName], int] = lambda topic: 14_400_000


async def gc_pass(metadata: MetadataStore, tier: StoreView, source: SourceView | None,
                  settings: GcSettings, *, now: float, probe: GcProbe | None = None,
                  grace_s: float | None = None, dry_run: bool = False,
                  on_progress: Callable[[str], None] | None = None) -> GcReport:
    """Run one pass; ``now`` is wall-clock seconds (``time.time()``), ``grace_s`` overrides
    ``settings.orphan_grace_s``. With ``dry_run`` nothing is written or deleted.
    ``on_progress`` hears a short description of each step (a terminal status line).

    Retention deletes ledgers through ``source.deleter`` and drops local copies through
    ``source.copies``; stale uploads are swept through ``tier.sweeper``: each step that lacks
    its capability says so in the report's notes (or is skipped, for the sweep)."""
    gc = _Pass(metadata, tier, source, settings, now=now, probe=probe,
               grace_s=settings.orphan_grace_s if grace_s is None else grace_s,
               dry_run=dry_run)
    if on_progress is not None:
        gc.on_progress = on_progress
    return await gc.run()


def referenced_uids(info: pb.ManagedLedgerInfo,
                    without: Collection[int] = ()) -> set[uuid.UUID]:
    """Every segment uuid a managed ledger mentions (ignoring the ledgers ``without``), in
    whatever state, read from the protobuf directly so that no record the catalog would skip
    escapes the invariant."""
    out: set[uuid.UUID] = set()
    for li in info.ledgerInfo:
        if not li.HasField("offloadContext") or li.ledgerId in without:
            continue
        ctx = li.offloadContext
        if ctx.uidMsb or ctx.uidLsb:
            out.add(msb_lsb_to_uuid(ctx.uidMsb, ctx.uidLsb))
        out.update(msb_lsb_to_uuid(s.uidMsb, s.uidLsb) for s in ctx.offloadSegment)
    return out


async def retained_uids(metadata: MetadataStore) -> set[uuid.UUID]:
    """Uuids of segments that retention still tracks or is deleting: their objects are not
    orphans even when no managed ledger mentions them any more."""
    out: set[uuid.UUID] = set()
    for ml in await _names_under(metadata, SEGMENT_RECORDS, _ML_DEPTH):
        out.update(_uuids(await _children(metadata, segment_records_path(ml))))
    out.update(_uuids(await _children(metadata, DELETIONS)))
    return out


# -- the pass -----------------------------------------------------------------------------------

_Records = dict[uuid.UUID, tuple[SegmentRecord, int]]  # uid -> (record, node version)


class _Pass:
    def __init__(self, metadata: MetadataStore, tier: StoreView, source: SourceView | None,
                 settings: GcSettings, *, now: float, probe: GcProbe | None, grace_s: float,
                 dry_run: bool) -> None:
        self.metadata = metadata
        self.blobstore = tier.store
        self.sweeper = tier.sweeper
        self.deleter = source.deleter if source is not None else None
        self.copies = source.copies if source is not None else None
        self.settings = settings
        self.now = now
        self.now_ms = int(now * 1000)
        self.probe = probe
        self.grace_s = grace_s
        self.dry_run = dry_run
        self.limits = settings.limits
        self.report = GcReport(dry_run=dry_run)
        # dry run: deletions this pass would start, with the ledgers it would have deleted
        self.planned: list[tuple[DeletionRecord, set[int]]] = []
        self.on_progress: Callable[[str], None] = lambda step: None

    async def run(self) -> GcReport:
        try:
            names = sorted(set(await managed_ledger.list_names(self.metadata))
                           | set(await _names_under(self.metadata, SEGMENT_RECORDS, _ML_DEPTH)))
        except OffloaddError as exc:
            self.report.errors.append(f"cannot list topics: {exc}")
            names = []
        for i, ml in enumerate(names):
            self.on_progress(f"topic {i + 1}/{len(names)} {ml}")
            try:
                await self._topic(ml)
            except OffloaddError as exc:
                self.report.errors.append(f"{ml}: {exc}")
        self.on_progress("deleting segments whose ledgers are all gone")
        await self._deletions()
        self.on_progress("sweeping orphan objects")
        await self._sweep()
        return self.report

    # ---- steps 1-4, per topic -----------------------------------------------------------

    async def _topic(self, ml: str) -> None:
        info = await self._load(ml)  # a load error skips the topic: absence must be certain
        records, unreadable = await self._records(ml)
        if info is not None:
            await self._track(ml, catalog.segments(info), records, unreadable)
            gone = await self._retain_and_trim(ml, info)
            if gone and not self.dry_run:
                info = await self._load(ml)
        else:
            gone = set()
        present = set() if info is None else {li.ledgerId for li in info.ledgerInfo} - gone
        live = set() if info is None else referenced_uids(info, gone)  # gone: dry run only
        await self._mark(ml, records, present, live, gone)
        if info is None and not self.dry_run:
            # the topic is gone; once every record of it is too, drop their parent (a child
            # created meanwhile makes the delete fail, which is fine)
            parent = segment_records_path(ml)
            if not await _children(self.metadata, parent):
                with contextlib.suppress(OffloaddError):
                    await self.metadata.delete(parent)

    async def _load(self, ml: str) -> pb.ManagedLedgerInfo | None:
        try:
            info, _ = await managed_ledger.load(self.metadata, ml)
        except NotFound:
            return None
        return info

    async def _records(self, ml: str) -> tuple[_Records, set[uuid.UUID]]:
        out: _Records = {}
        unreadable: set[uuid.UUID] = set()
        parent = segment_records_path(ml)
        for name in await _children(self.metadata, parent):
            path = f"{parent}/{name}"
            try:
                uid = uuid.UUID(name)
            except ValueError:
                self.report.errors.append(f"{path}: not a segment record (name is no uuid)")
                continue
            try:
                node = await self.metadata.get(path)
                out[uid] = (SegmentRecord.decode(node.data, path), node.version)
            except NotFound:
                continue
            except FormatError as exc:
                unreadable.add(uid)
                self.report.errors.append(str(exc))
        return out, unreadable

    async def _track(self, ml: str, segs: list[Segment], records: _Records,
                     unreadable: set[uuid.UUID]) -> None:
        for seg in segs:
            if not seg.complete or seg.uid in records or seg.uid in unreadable:
                continue
            rec = SegmentRecord.of(seg, ml, self.now_ms)
            if self.dry_run:
                records[seg.uid] = (rec, 0)
                self.report.tracked += 1
                continue
            path = segment_record_path(ml, seg.uid)
            try:
                await self.metadata.create(path, rec.encode(), make_parents=True)
                records[seg.uid] = (rec, 0)
            except Conflict:  # a concurrent pass recorded it first
                node = await self.metadata.get(path)
                records[seg.uid] = (SegmentRecord.decode(node.data, path), node.version)
                continue
            self.report.tracked += 1

    async def _retain_and_trim(self, ml: str, info: pb.ManagedLedgerInfo) -> set[int]:
        """Steps 2 and 3; returns the ledgers retention deleted."""
        try:
            topic = TopicName.from_managed_ledger(ml)
        except ConfigError:
            return set()
        views = ledger_views(info)
        deleted: set[int] = set()
        doomed = ledgers_to_delete(views, self.limits, self.now_ms)
        deleter = self.deleter
        if doomed and deleter is None:
            self._note("retention is configured but the ledger source cannot delete ledgers "
                       "(with a Pulsar cluster the broker applies retention)")
        elif doomed and deleter is not None:
            for lid in doomed:
                if not self.dry_run:
                    try:
                        await deleter.delete_ledger(topic, lid)
                    except NotFound:  # someone else deleted it meanwhile
                        deleted.add(lid)
                        continue
                    except OffloaddError as exc:
                        # stop here: retention only ever removes a prefix of the ledgers
                        self.report.errors.append(f"{topic}: deleting ledger {lid}: {exc}")
                        break
                    log.info("%s: retention deleted ledger %d", topic, lid)
                deleted.add(lid)
                self.report.deleted_ledgers.append(LedgerAction(str(topic), lid))
        if self.settings.trim_source:
            await self._trim(topic, ml, [v for v in views if v.ledger_id not in deleted])
        return deleted

    async def _trim(self, topic: TopicName, ml: str, views: list[LedgerView]) -> None:
        copies = self.copies
        if copies is None:
            self._note("trim_source applies to the embedded ledger store only (a Pulsar broker "
                       "deletes offloaded ledgers from BookKeeper itself)")
            return
        lag = self.settings.deletion_lag_ms(topic)
        due = set(source_copies_to_trim(views, lag, self.now_ms))
        if self.dry_run:
            self.report.trimmed += [LedgerAction(str(topic), lid) for lid in sorted(due)]
            return
        flagged = {v.ledger_id for v in views if v.source_deleted}
        if due:
            now_ms = self.now_ms

            def flag(info: pb.ManagedLedgerInfo) -> bool:
                # decided again on the fresh value: the edit may be re-applied after a race
                ok = due & set(source_copies_to_trim(ledger_views(info), lag, now_ms))
                for li in info.ledgerInfo:
                    if li.ledgerId in ok:
                        li.offloadContext.bookkeeperDeleted = True
                return bool(ok)

            info = await managed_ledger.update(self.metadata, ml, flag)
            flagged |= {v.ledger_id for v in ledger_views(info) if v.source_deleted}
        for lid in sorted(flagged):  # also finishes an unlink a crash interrupted
            if await copies.drop_local_copy(lid):
                log.info("%s: dropped the local copy of offloaded ledger %d", topic, lid)
                self.report.trimmed.append(LedgerAction(str(topic), lid))

    async def _mark(self, ml: str, records: _Records, present: set[int],
                    live: set[uuid.UUID], gone: set[int]) -> None:
        for uid, (rec, version) in sorted(records.items()):
            if uid not in live and not self.dry_run and \
                    await self.metadata.exists(deletion_path(uid)):
                # replaced by a merged segment (its DeletionRecord came with the swap): the
                # merged one is tracked instead (a merge deletes these itself; a crash may not)
                with contextlib.suppress(Conflict, NotFound):
                    await self.metadata.delete(segment_record_path(ml, uid), version)
                continue
            new = rec.marked(present)
            self.report.marked += [Mark(_label(ml), lid, str(uid))
                                   for lid in new.deleted if lid not in rec.deleted]
            path = segment_record_path(ml, uid)
            if new.fully_deleted:
                if uid in live:
                    self._refuse(f"segment {uid} of {ml}: every ledger it touches is gone, yet "
                                 "the managed ledger still references it; not deleting")
                    continue
                await self._start_deletion(new, version, gone)
            elif new != rec and not self.dry_run:
                with contextlib.suppress(Conflict, NotFound):  # a concurrent pass marked it
                    await self.metadata.set(path, new.encode(), version)

    async def _start_deletion(self, rec: SegmentRecord, version: int, gone: set[int]) -> None:
        dele = DeletionRecord.of(rec, self.now_ms)
        if self.dry_run:
            self.planned.append((dele, gone))
            return
        await _ensure(self.metadata, DELETIONS)
        seg_path = segment_record_path(rec.ml, rec.uid)
        try:
            await self.metadata.multi([CreateOp(deletion_path(rec.uid), dele.encode()),
                                       DeleteOp(seg_path, version)])
        except (Conflict, NotFound):
            # Either a concurrent pass moved it (its deletion record is handled below), or a
            # deletion record exists already: then the segment record is redundant.
            if await self.metadata.exists(deletion_path(rec.uid)):
                with contextlib.suppress(Conflict, NotFound):
                    await self.metadata.delete(seg_path, version)

    # ---- step 5 ------------------------------------------------------------------------

    async def _deletions(self) -> None:
        try:
            names = await _children(self.metadata, DELETIONS)
        except OffloaddError as exc:
            self.report.errors.append(f"cannot list pending deletions: {exc}")
            names = []
        for name in names:
            path = f"{DELETIONS}/{name}"
            try:
                node = await self.metadata.get(path)
                rec = DeletionRecord.decode(node.data, path)
            except NotFound:
                continue
            except OffloaddError as exc:
                self.report.errors.append(f"{path}: {exc}")
                continue
            if not rec.due(self.now_ms):
                self.report.lagging += 1  # a merge's: readers may still hold the old catalog
                continue
            await self._delete_segment(rec, node.version)
        for rec, gone in self.planned:
            await self._delete_segment(rec, None, gone)

    async def _delete_segment(self, rec: DeletionRecord, version: int | None,
                              gone: Collection[int] = ()) -> None:
        """Delete a segment's objects; ``version`` None: a dry run's planned deletion, whose
        ledgers ``gone`` the dry run pretends are deleted."""
        keys = tuple(rec.keys())
        try:
            info = await self._load(rec.ml)  # the invariant: re-read right before deleting
        except OffloaddError as exc:
            await self._failed(rec, version, keys,
                               f"cannot check that no topic references it: {exc}")
            return
        if info is not None and rec.uid in referenced_uids(info, gone):
            self._refuse(f"segment {rec.uid} of {rec.ml} is pending deletion but its managed "
                         "ledger references it; dropping the deletion record, keeping objects")
            if version is not None and not self.dry_run:
                with contextlib.suppress(Conflict, NotFound):
                    await self.metadata.delete(deletion_path(rec.uid), version)
            return
        done = SegmentDeletion(str(rec.uid), _label(rec.ml), keys, rec.attempts)
        if self.dry_run:
            self.report.deleted_segments.append(done)
            return
        # a tracked segment is OFFLOADED (a merged-away one MERGED); once its objects are gone
        # it is DELETED (terminal: its deletion record goes, and with it the last trace of it)
        was = SegmentState.MERGED if rec.merged_into is not None else SegmentState.OFFLOADED
        deleted = advance(was, SegmentState.DELETED)
        problems: list[str] = []
        for key in keys:
            try:
                await self.blobstore.delete(key)
            except OffloaddError as exc:
                problems.append(f"{key}: {exc}")
        if self.probe is not None:
            self.probe.topic_named(_label(rec.ml)).delete_op(not problems)
        if problems:
            await self._failed(rec, version, keys, "; ".join(problems))
            return
        if version is not None:
            # NotFound/Conflict: a concurrent pass finished it or recorded a failure meanwhile;
            # the objects are gone either way and the next pass drops a leftover record.
            with contextlib.suppress(Conflict, NotFound):
                await self.metadata.delete(deletion_path(rec.uid), version)
        log.info("deleted segment %s of %s (%s)", rec.uid, rec.ml, ", ".join(keys))
        self.report.deleted_segments.append(replace(done, state=deleted.value))

    async def _failed(self, rec: DeletionRecord, version: int | None, keys: tuple[str, ...],
                      error: str) -> None:
        new = rec.failed(self.now_ms, error)
        self.report.failed.append(SegmentDeletion(str(rec.uid), _label(rec.ml), keys,
                                                  new.attempts, error))
        log.warning("deleting segment %s of %s failed (attempt %d; retried by the next gc "
                    "pass): %s", rec.uid, rec.ml, new.attempts, error)
        if version is None or self.dry_run:
            return
        try:
            await self.metadata.set(deletion_path(rec.uid), new.encode(), version)
        except (Conflict, NotFound):
            pass  # a concurrent pass updated or finished it
        except OffloaddError as exc:  # the record stays as it was: still retried
            self.report.errors.append(f"recording the failure of segment {rec.uid}: {exc}")

    # ---- step 6 ------------------------------------------------------------------------

    async def _sweep(self) -> None:
        try:
            listed = [o async for o in self.blobstore.list()]
            candidates = orphans(listed, (), self.grace_s, self.now)
            if candidates:  # references read after the listing: a visible object's
                # segment was recorded before the object completed, so it is in there
                refs = await self._all_references()
                candidates = [k for k in candidates if _uid(k) not in refs]
        except OffloaddError as exc:
            self.report.errors.append(f"orphan sweep skipped: {exc}")
            candidates = []
        if self.dry_run:
            self.report.orphans_removed += candidates
        elif candidates:
            try:
                refs = await self._all_references()  # the invariant: re-read right before
            except OffloaddError as exc:
                self.report.errors.append(f"orphan sweep skipped: {exc}")
                candidates, refs = [], set()
            for key in candidates:
                if _uid(key) in refs:
                    self._refuse(f"{key} became referenced while gc ran; not deleting")
                    continue
                try:
                    await self.blobstore.delete(key)
                except OffloaddError as exc:
                    self.report.orphans_failed.append(f"{key}: {exc}")
                    continue
                log.info("deleted orphan object %s", key)
                self.report.orphans_removed.append(key)
        if self.sweeper is not None and not self.dry_run:
            try:
                self.report.uploads_swept = await self.sweeper.sweep_incomplete_uploads(
                    self.grace_s)
            except OffloaddError as exc:
                self.report.errors.append(f"sweeping incomplete uploads: {exc}")

    async def _all_references(self) -> set[uuid.UUID]:
        """Every uuid any managed ledger mentions, or retention still tracks. Raises when any
        of it cannot be read: an unread reference must not turn an object into an orphan."""
        refs = await retained_uids(self.metadata)
        for ml in await managed_ledger.list_names(self.metadata):
            info = await self._load(ml)
            if info is not None:
                refs |= referenced_uids(info)
        return refs

    # ---- reporting ---------------------------------------------------------------------

    def _refuse(self, msg: str) -> None:
        log.error("gc: %s", msg)
        self.report.refused.append(msg)

    def _note(self, msg: str) -> None:
        if msg not in self.report.notes:
            self.report.notes.append(msg)


# -- helpers ------------------------------------------------------------------------------------


def _label(ml: str) -> str:
    try:
        return str(TopicName.from_managed_ledger(ml))
    except ConfigError:
        return ml


def _uid(key: str) -> uuid.UUID | None:
    parsed = parse_key(key)
    return parsed.uid if parsed is not None else None


def _uuids(names: list[str]) -> set[uuid.UUID]:
    out: set[uuid.UUID] = set()
    for n in names:
        with contextlib.suppress(ValueError):
            out.add(uuid.UUID(n))
    return out


async def _children(store: MetadataStore, path: str) -> list[str]:
    try:
        return await store.children(path)
    except NotFound:
        return []


async def _names_under(store: MetadataStore, root: str, depth: int) -> list[str]:
    """Relative names of the nodes exactly ``depth`` levels below ``root``."""
    out: list[str] = []

    async def walk(prefix: str, level: int) -> None:
        for kid in await _children(store, f"{root}/{prefix}" if prefix else root):
            name = f"{prefix}/{kid}" if prefix else kid
            if level + 1 == depth:
                out.append(name)
            else:
                await walk(name, level + 1)

    await walk("", 0)
    return sorted(out)


async def _ensure(store: MetadataStore, path: str) -> None:
    with contextlib.suppress(Conflict):
        await store.create(path, b"", make_parents=True)
