"""The projection: committed segments → one Iceberg table per topic, exactly once.

For each topic::

    table ──▶ last projected position (snapshot summary, offloadd.last-position)
    catalog (ManagedLedgerInfo) ──▶ committed segments past it
    TierReader ──▶ entries ──▶ RowBuilder (decode) ──▶ append + summary{last position} (one commit)

Exactly once: the rows and the position they end at are one atomic catalog commit (the SQL
catalog's compare-and-set on the table's metadata location; the REST catalog's commit
requirements). A crash before the commit leaves only unreferenced data files; after it, the next
run starts past the recorded position. A concurrent projector of the same table loses the
compare-and-set, reloads, and resumes from the winner's position; each append also checks that
the snapshot it goes on top of records the position its rows follow (another commit through a
stale table, a schema evolution, brings that table forward without the pass noticing).

Maintenance (every ``compact_interval_s``): per day partition with at least
``compact_min_files`` files smaller than ``compact_small_file_bytes``, those files are rewritten
as one (sorted by position) in a single replace commit; snapshots older than
``snapshot_max_age_minutes`` are expired (the current one always stays). With
``delete_with_retention``, rows of ledgers that retention deleted from the tier are deleted from
the table too; by default the table keeps them.

Blocking pyiceberg calls run in worker threads; the tier is read with the async reader.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.expressions import LessThan
from pyiceberg.io.pyarrow import ArrowScan, _dataframe_to_data_files
from pyiceberg.table import Table

from offloadd.blobstore.base import BlobStore
from offloadd.config import Settings
from offloadd.errors import NotFound, OffloaddError
from offloadd.lakehouse import cleanup, layout
from offloadd.lakehouse.ops import TableStats, table_stats
from offloadd.lakehouse.pacing import CommitBudget
from offloadd.lakehouse.rows import RowBuilder, decode
from offloadd.lakehouse.schemas import TypedDecoder
from offloadd.lakehouse.tables import (
    LAST_POSITION,
    append,
    last_position,
    open_catalog,
    open_table,
    summary_properties,
)
from offloadd.lakehouse.transactions import (
    HELD,
    Counts,
    ReadCommitted,
    hidden_totals,
    totals_properties,
)
from offloadd.lakehouse.typed import evolve
from offloadd.metadata import managed_ledger
from offloadd.metadata.base import MetadataStore
from offloadd.metadata.schemas import SchemaReader, locator_path
from offloadd.model import Position, TopicName
from offloadd.model import catalog as segments_catalog
from offloadd.read.reader import TierReader

__all__ = ["CompactReport", "Projector", "TopicReport"]

log = logging.getLogger(__name__)
_RACES = 50  # lost commit races before a topic's pass gives up (it is retried next pass)


@dataclass
class TopicReport:
    topic: str
    rows: int = 0
    entries: int = 0
    commits: int = 0
    undecodable: int = 0
    conflicts: int = 0
    last_position: str | None = None
    lost: list[str] = field(default_factory=list)  # ranges retention deleted before projection
    error: str | None = None
    held_entries: int = 0  # behind an undecided transaction at the end of the pass
    read_committed: Counts = field(default_factory=Counts)  # what read-committed hid
    deferred: bool = False  # new segments wait for a later pass (the follower's commit budget)

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "read_committed": self.read_committed.to_json()}


@dataclass
class CompactReport:
    topic: str
    files_rewritten: int = 0
    files_written: int = 0
    snapshots_expired: int = 0
    rows_deleted_with_retention: bool = False
    files_deleted: int = 0  # by the orphan sweep (lakehouse/cleanup.py)
    bytes_deleted: int = 0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class _Seen:
    """What the last pass saw of a topic: enough to skip its table while no segment is added,
    and to report its lag without reading the table."""

    segments: list[Any]  # the managed ledger's segments when last read
    newest: Position | None = None  # end of the newest complete segment then
    last: Position | None = None  # the table's last position
    settled: bool = False  # a full pass decided everything up to `newest`
    held: int = 0  # entries held behind an undecided transaction after it
    schema: tuple[int | None] | None = None  # the schema locator's version the decoder is of


class _Conflict(Exception):
    """Another writer committed to the table first."""


class Projector:
    def __init__(self, settings: Settings, metadata: MetadataStore, blobstore: BlobStore, *,
                 catalog: Catalog | None = None,
                 clock: Callable[[], float] = time.time,
                 schemas: SchemaReader | None = None) -> None:
        self.settings = settings
        self.metadata = metadata
        self.reader = TierReader(metadata, blobstore,
                                 prefetch=settings.offload.read_prefetch_blocks)
        self._catalog = catalog
        self._clock = clock
        self._tables: dict[TopicName, Table] = {}
        self._stop: asyncio.Event | None = None  # set by run(): a pass ends after its commit
        # the topics' Pulsar schemas: the embedded store's registry unless told (a sidecar
        # reads Pulsar's: offloadd.wiring.schema_reader)
        self._schemas = schemas if schemas is not None else SchemaReader(metadata)
        self._typed: dict[TopicName, TypedDecoder | None] = {}
        self._seen: dict[TopicName, _Seen] = {}

    # ---- catalog and tables ----------------------------------------------------------------
    async def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = await asyncio.to_thread(open_catalog, self.settings)
        return self._catalog

    def _json_fields(self, topic: TopicName) -> dict[str, str]:
        return dict(self.settings.lakehouse.json_fields.get(str(topic), {}))

    async def _table(self, topic: TopicName, *, refresh: bool = False) -> Table:
        table = self._tables.get(topic)
        if table is None:
            cat = await self.catalog()
            table = await asyncio.to_thread(open_table, cat, topic, self._json_fields(topic),
                                            partition=layout.choice_for(self.settings, topic))
            self._tables[topic] = table
        elif refresh:
            await asyncio.to_thread(table.refresh)
        return table

    async def topics(self) -> list[TopicName]:
        pats = self.settings.lakehouse.topics
        out = []
        for name in await managed_ledger.list_names(self.metadata):
            topic = TopicName.from_managed_ledger(name)
            if not pats or any(fnmatch.fnmatchcase(str(topic), p) for p in pats):
                out.append(topic)
        return out

    # ---- projection ------------------------------------------------------------------------
    async def sync(self, topics: list[TopicName] | None = None, *,
                   max_commits: int | None = None,
                   budget: CommitBudget | None = None) -> list[TopicReport]:
        """Project every committed segment not yet in its table; one report per topic, in the
        order of ``topics``. A topic that fails is reported and does not stop the others.

        First every topic's managed ledger is read (one metadata read each): a topic with no
        complete segment since the last full pass is skipped without touching its table. The
        others are projected oldest unprojected commit first; with a ``budget`` (the
        follower's) only while it has a commit left, the rest reported ``deferred`` and left
        for a later pass."""
        todo = topics if topics is not None else await self.topics()
        reports: dict[TopicName, TopicReport] = {}
        work: list[tuple[int, int, TopicName, Any]] = []
        for i, topic in enumerate(todo):
            try:
                looked = await self._look(topic)
            except Exception as exc:  # the metadata store's
                reports[topic] = self._failed(topic, exc)
                continue
            if looked is None:
                reports[topic] = self._settled_report(topic)
            else:
                work.append((looked[0], i, topic, looked[1]))
        work.sort()
        for _, _, topic, info in work:
            if self._stop is not None and self._stop.is_set():
                break
            if budget is not None and not budget.ready(self._clock()):
                reports[topic] = rep = self._settled_report(topic)
                rep.deferred = True
                continue
            try:
                reports[topic] = await self.sync_topic(topic, max_commits=max_commits,
                                                       budget=budget, info=info)
            except Exception as exc:  # ours, or the catalog's / storage's (e.g. SQLite locked)
                reports[topic] = self._failed(topic, exc)
        return [reports[t] for t in todo if t in reports]

    def _failed(self, topic: TopicName, exc: Exception) -> TopicReport:
        log.error("lakehouse: %s: projection failed (retried next pass): %r", topic, exc)
        # start afresh next pass: the table reloaded, its schema versions read again
        self._tables.pop(topic, None)
        self._seen.pop(topic, None)
        return TopicReport(str(topic), error=repr(exc))

    def _settled_report(self, topic: TopicName) -> TopicReport:
        seen = self._seen.get(topic)
        last = seen.last if seen is not None else None
        return TopicReport(str(topic), last_position=str(last) if last else None,
                           held_entries=seen.held if seen is not None else 0)

    async def _look(self, topic: TopicName) -> tuple[int, Any] | None:
        """The topic's managed ledger, and the commit time of its oldest complete segment not
        yet projected (its place in the pass); None when nothing changed since the last
        full pass (or the topic has no managed ledger)."""
        try:
            info, _ = await managed_ledger.load(self.metadata, topic.managed_ledger)
        except NotFound:
            return None
        segs = segments_catalog.segments(info)
        done = [s for s in segs if s.complete]
        newest = done[-1].end if done else None
        seen = self._seen.get(topic)
        if seen is not None:
            seen.segments = segs
            if seen.settled and newest == seen.newest:
                return None
        last = seen.last if seen is not None else None
        due = min((s.offloaded_ms for s in done if last is None or s.end > last), default=0)
        return due, info

    def table_stats(self, now_ms: int) -> list[TableStats]:
        """Every table this projector has followed, as of its last pass (no I/O): rows, files
        and last snapshot of the table it holds, lag against the segments it last read."""
        out = []
        for topic, seen in self._seen.items():
            table = self._tables.get(topic)
            if table is not None:
                out.append(table_stats(topic, table, seen.segments, now_ms,
                                       held_entries=seen.held))
        return out

    async def sync_topic(self, topic: TopicName, *, max_commits: int | None = None,
                         budget: CommitBudget | None = None,
                         info: Any = None) -> TopicReport:
        rep = TopicReport(str(topic))
        for _ in range(_RACES):
            try:
                await self._sync_once(topic, rep, max_commits, budget, info)
                return rep
            except _Conflict:
                rep.conflicts += 1
                info = None
                log.info("lakehouse: %s: another writer committed first; resuming from its "
                         "position", topic)
                # let the winner run ahead: racing it commit for commit would only repeat
                await asyncio.sleep(random.uniform(0.1, 0.5) * min(rep.conflicts, 4))
                await self._table(topic, refresh=True)
        raise OffloaddError(f"lakehouse: {topic}: lost {_RACES} commit races; is another "
                            "projector writing the same table?")

    async def _typed_decoder(self, topic: TopicName, table: Table) -> None:
        """The topic's decoder of typed columns, the table evolved to its schema versions: read
        again only when the schema locator's version changed (a new schema version)."""
        try:
            # (where the schema reader reads: a sidecar's is Pulsar's metadata store, not ours)
            version: int | None = (await self._schemas.md.get(locator_path(topic))).version
        except NotFound:
            version = None
        seen = self._seen.get(topic)
        if seen is not None and seen.schema == (version,):
            return
        versions = await self._schemas.versions(topic) if version is not None else []
        try:
            self._typed[topic] = await asyncio.to_thread(evolve, table, str(topic), versions) \
                if versions else None
        except CommitFailedException as exc:  # our table was stale: reload it, try again
            raise _Conflict(str(exc)) from exc
        if seen is not None:
            seen.schema = (version,)

    async def _sync_once(self, topic: TopicName, rep: TopicReport, max_commits: int | None,
                         budget: CommitBudget | None, info: Any) -> None:
        # the table as this projector last left it: if another writer committed since, the
        # commit's compare-and-set fails and sync_topic reloads it (no read before each pass)
        table = await self._table(topic)
        last = await asyncio.to_thread(last_position, table)
        rep.last_position = str(last) if last else None
        if info is None:
            try:
                info, _ = await managed_ledger.load(self.metadata, topic.managed_ledger)
            except NotFound:
                return
        seen = self._seen.setdefault(topic, _Seen(segments_catalog.segments(info)))
        seen.segments = segments_catalog.segments(info)
        seen.last, seen.settled = last, False
        await self._typed_decoder(topic, table)
        segs = [s for s in seen.segments if s.complete and (last is None or s.end > last)]
        done = [s for s in seen.segments if s.complete]
        seen.newest = done[-1].end if done else None
        if not segs:
            seen.settled, seen.held = True, 0
            return
        if last is not None and all(li.ledgerId != last.ledger_id for li in info.ledgerInfo):
            # the ledger of the last projected entry is gone: whatever followed in it is lost
            rep.lost.append(f"{last.ledger_id}:{last.entry_id + 1}..end of ledger "
                            f"{last.ledger_id}")
        expected = _after(info, last)
        if expected is not None and segs[0].begin > expected:
            rep.lost.append(f"{expected}..before {segs[0].begin}")
        for lost in rep.lost:
            log.warning("lakehouse: %s: entries %s were deleted by retention before they were "
                        "projected (if there were any); they are not in the table", topic, lost)
        start = Position(last.ledger_id, last.entry_id + 1) if last is not None else None
        limit = self.settings.lakehouse.commit_max_bytes
        # read-committed: entries of undecided transactions (and all after them) are held in
        # memory for this pass only; the table's position never passes the first of them, so
        # a pass that ends (or dies) with entries held reads them again next time
        rc = ReadCommitted(int(self.settings.lakehouse.transaction_timeout_s * 1000))
        pending: list[tuple[Position, memoryview]] = []
        size = 0
        at = last  # the table's position each append must still find (see _commit)
        for seg in segs:
            async for e in self.reader.read_segment(seg, start):
                pending.append((e.position, e.payload))
                size += len(e.payload)
                if size >= limit:
                    at = await self._commit(topic, table, pending, rep, rc, budget, at)
                    pending, size = [], 0
                    if max_commits is not None and rep.commits >= max_commits:
                        return
                    if self._stop is not None and self._stop.is_set():
                        return
        if pending:
            await self._commit(topic, table, pending, rep, rc, budget, at)
        # the log up to `newest` is decided: the next pass skips the table until a segment
        # is added (held entries stay held until then: the decisions depend on the log only)
        seen.settled, seen.held = True, rc.held
        if rc.held:
            rep.held_entries = rc.held
            log.info("lakehouse: %s: %d entries held back behind an undecided transaction "
                     "(no commit or abort marker offloaded yet)", topic, rc.held)

    async def _commit(self, topic: TopicName, table: Table,
                      entries: list[tuple[Position, memoryview]], rep: TopicReport,
                      rc: ReadCommitted, budget: CommitBudget | None, at: Position | None
                      ) -> Position | None:
        """Append the rows of ``entries`` (those read-committed releases) and their last
        position in one commit on top of a snapshot whose position is ``at``, the one the
        rows follow; the table's position after it (``at`` when nothing was released).

        The catalog's compare-and-set only asserts that the table's current snapshot is the
        one ``table`` holds. ``table`` may have been brought forward since ``at`` was read
        from it, behind the pass's back: any other commit through it (a schema evolution, a
        property fix) answers with the catalog's newest metadata, another projector's
        appends included. So the position is checked against that snapshot too, in the same
        view the commit asserts: a table that moved is a lost race (reload, resume from the
        winner), never rows appended a second time after the winner's."""
        keep_hidden = self.settings.lakehouse.keep_hidden
        name = str(topic)

        def work() -> tuple[int, int, Position | None, Counts]:
            builder = RowBuilder(name, table.schema(), self._json_fields(topic),
                                 self._typed.get(topic))
            for pos, raw in entries:
                rc.add(pos, raw, decode(name, pos, raw))
            released = rc.take()
            counts, rc.counts = rc.counts, Counts()
            if not released:  # everything is held: nothing to commit yet
                return 0, 0, None, counts
            now = last_position(table)
            if now != at:
                raise _Conflict(f"the table is at {now}, not at {at} where this pass resumed")
            for r in released:
                if r.hidden is None or keep_hidden:
                    builder.add_decoded(r.position, r.raw, r.entry, txn=r.txn, hidden=r.hidden)
            last = released[-1].position
            rows = builder.table()
            totals = hidden_totals(table)
            totals.add(counts)
            props = summary_properties(last, **{"offloadd.entries": len(released)},
                                       **totals_properties(totals), **{HELD: rc.held})
            try:
                append(table, rows, props)
            except CommitFailedException as exc:
                raise _Conflict(str(exc)) from exc
            return rows.num_rows, builder.undecodable, last, counts

        rows, undecodable, last, counts = await asyncio.to_thread(work)
        rep.read_committed.add(counts)
        if last is None:
            return at
        rep.rows += rows
        rep.entries += len(entries)
        rep.undecodable += undecodable
        rep.commits += 1
        rep.last_position = str(last)
        if budget is not None:
            budget.spend()
        seen = self._seen.get(topic)
        if seen is not None:
            seen.last = last
        log.debug("lakehouse: %s: committed %d rows up to %s", topic, rows, last)
        return last

    # ---- maintenance -----------------------------------------------------------------------
    async def maintain(self, topics: list[TopicName] | None = None) -> list[CompactReport]:
        out = []
        for topic in topics if topics is not None else await self.topics():
            try:
                table = await self._table(topic, refresh=True)
                rep = CompactReport(str(topic))
                if self.settings.lakehouse.delete_with_retention:
                    await self._delete_with_retention(topic, table, rep)
                await asyncio.to_thread(self._compact, table, rep)
                await asyncio.to_thread(self._expire, table, rep)
                out.append(rep)
            except CommitFailedException as exc:
                log.info("lakehouse: %s: maintenance lost a commit race, next time: %s", topic,
                         exc)
            except Exception as exc:  # ours, or the catalog's / storage's
                log.error("lakehouse: %s: maintenance failed (retried next time): %r", topic,
                          exc)
        return out

    def _compact(self, table: Table, rep: CompactReport) -> None:
        lh = self.settings.lakehouse
        table.refresh()
        snap = table.current_snapshot()
        if snap is None:
            return
        groups: dict[str, list[Any]] = {}
        for task in table.scan().plan_files():
            f = task.file
            if f.file_size_in_bytes < lh.compact_small_file_bytes:
                groups.setdefault(str(f.partition), []).append(task)
        last = snap.summary[LAST_POSITION] if snap.summary is not None else None
        for part, tasks in sorted(groups.items()):
            if len(tasks) < lh.compact_min_files or last is None:
                continue
            scan = ArrowScan(table.metadata, table.io, table.schema(), _always_true())
            rows = scan.to_table(tasks).sort_by(
                [("ledger_id", "ascending"), ("entry_id", "ascending"),
                 ("batch_index", "ascending")])
            props = {LAST_POSITION: last, "offloadd.compacted-files": str(len(tasks))}
            with table.transaction() as tx, \
                    tx.update_snapshot(snapshot_properties=props).overwrite() as ow:
                for task in tasks:
                    ow.delete_data_file(task.file)
                written = list(_dataframe_to_data_files(
                    table_metadata=tx.table_metadata, write_uuid=ow.commit_uuid, df=rows,
                    io=table.io))
                for data_file in written:
                    ow.append_data_file(data_file)
            rep.files_rewritten += len(tasks)
            rep.files_written += len(written)
            log.info("lakehouse: %s: compacted %d small files of partition %s into %d",
                     rep.topic, len(tasks), part, len(written))
            table.refresh()

    def _expire(self, table: Table, rep: CompactReport) -> None:
        lh = self.settings.lakehouse
        grace = lh.reader_grace_minutes * 60
        rep.snapshots_expired = cleanup.expire(table, self._clock(),
                                               lh.snapshot_max_age_minutes * 60, grace)
        swept = cleanup.sweep(table, self._clock(), grace)
        rep.files_deleted, rep.bytes_deleted = swept.files_deleted, swept.bytes_deleted

    async def _delete_with_retention(self, topic: TopicName, table: Table,
                                     rep: CompactReport) -> None:
        try:
            info, _ = await managed_ledger.load(self.metadata, topic.managed_ledger)
        except NotFound:
            return
        if not len(info.ledgerInfo):
            return
        first = min(li.ledgerId for li in info.ledgerInfo)

        def work() -> bool:
            table.refresh()
            snap = table.current_snapshot()
            last = snap.summary[LAST_POSITION] if snap and snap.summary else None
            flt = LessThan("ledger_id", first)  # type: ignore[call-arg]  # pydantic plugin
            if last is None or not any(True for _ in table.scan(row_filter=flt).plan_files()):
                return False
            table.delete(flt, snapshot_properties={LAST_POSITION: last,
                                                   "offloadd.retention-before-ledger":
                                                   str(first)})
            return True

        rep.rows_deleted_with_retention = await asyncio.to_thread(work)

    # ---- the follower ----------------------------------------------------------------------
    async def run(self, stop: asyncio.Event,
                  on_pass: Callable[[list[TopicReport]], None] | None = None) -> None:
        """Follow the tier until ``stop``: a projection pass every ``interval_s`` within the
        commit budget (:mod:`~offloadd.lakehouse.pacing`), each pass's reports to ``on_pass``,
        maintenance every ``compact_interval_s``."""
        lh = self.settings.lakehouse
        next_maintenance = self._clock() + lh.compact_interval_s
        budget = CommitBudget.create(lh.max_commits_per_s, lh.interval_s, self._clock())
        self._stop = stop
        try:
            while not stop.is_set():
                try:
                    reports = await self.sync(budget=budget)
                    if on_pass is not None:
                        on_pass(reports)
                    if self._clock() >= next_maintenance:
                        next_maintenance = self._clock() + lh.compact_interval_s
                        await self.maintain()
                except Exception:  # a pyiceberg or I/O failure must not end the follower
                    log.exception("lakehouse: pass failed (retried in %.0fs)", lh.interval_s)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), lh.interval_s)
        finally:
            self._stop = None  # later passes (a final catch-up) run to the end


def _after(info: Any, last: Position | None) -> Position | None:
    """The position right after ``last`` among the ledgers still listed (None: unknown)."""
    if last is None:
        return None
    ledgers = [(li.ledgerId, li.entries if li.HasField("entries") else None)
               for li in info.ledgerInfo]
    for lid, entries in ledgers:
        if lid == last.ledger_id and (entries is None or last.entry_id + 1 < entries):
            return Position(lid, last.entry_id + 1)
        if lid > last.ledger_id and entries != 0:
            return Position(lid, 0)
    return None


def _always_true() -> Any:
    from pyiceberg.expressions import AlwaysTrue

    return AlwaysTrue()

