"""The backfill driver: cut a topic's closed history into segments and upload them on Spark.

::

    take ownership ─▶ plan ─▶ assign new splits ─▶ one Spark task per segment ─▶ commit each
    (epoch fence)     │       (one CAS, ASSIGNED)   (task.upload_segment)       as it succeeds
                      ├─ OFFLOADED segments: skipped                            (OFFLOADED)
                      ├─ ASSIGNED segments (a killed run): redone under a fresh uuid
                      └─ closed ledgers after catalog.next_position(): split_history()

Ownership: the driver takes the topic with :mod:`offloadd.offload.fencing` (ephemeral owner node
+ epoch) and every metadata edit carries the epoch check, so a backfill refuses to start while
another session (a daemon or another backfill) owns the topic, and a backfill that lost the topic
can never commit. It releases the topic at the end; a daemon then resumes streaming at
``catalog.next_position``, right after the last backfilled entry.

Only closed ledgers are backfilled: an open ledger is the streaming daemon's. Boundaries follow
the streaming roll rule (:mod:`offloadd.backfill.split`), sized by the topic's
``max_size_per_segment_mbytes``; the frame size at a position comes from the embedded store's
offset files (:meth:`LocalLedgerSource.cumulative_bytes`), the size of whole ledgers from their
``LedgerInfo.size`` — O(log n) reads per boundary, no scan.

Every new segment is recorded ASSIGNED before any upload starts (segments within a ledger must be
recorded in log order; tasks finish in any order). A task's segment is committed OFFLOADED once
its index object exists. A failed attempt is redone up to ``max_attempts`` times, each under a
fresh uuid written over the same ASSIGNED records (the old attempt's objects are deleted first),
so a zombie writer of an old attempt can never overwrite the pair that gets committed.
Idempotent: a rerun skips OFFLOADED segments and redoes ASSIGNED ones.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from offloadd import catalog, wiring
from offloadd._proto import mldataformats_pb2 as pb
from offloadd.backfill.progress import MetricsSink, Progress, Sink, TerminalBar
from offloadd.backfill.split import LedgerExtent, Split, split_history
from offloadd.backfill.task import SegmentResult, SegmentSpec, absolute_paths, upload_segment
from offloadd.blobstore.base import BlobStore
from offloadd.catalog import LedgerRange, SegmentKind
from offloadd.config import Settings
from offloadd.errors import ConfigError, Conflict, Fatal, Fenced, NotFound, OffloaddError
from offloadd.ledger.base import FRAME_OVERHEAD
from offloadd.ledger.local import LocalLedgerSource
from offloadd.metadata import managed_ledger, ownership
from offloadd.metadata.base import MetadataStore
from offloadd.model import Position, TopicName
from offloadd.offload import commit, fencing
from offloadd.offload.fencing import EpochFence
from offloadd.paths import streaming_data_key, streaming_index_key, uuid_to_msb_lsb

log = logging.getLogger(__name__)
MiB = 1024 * 1024


class BackfillFailed(OffloaddError):
    """Some segments could not be offloaded; they stay ASSIGNED for the next run."""

    def __init__(self, message: str, report: BackfillReport) -> None:
        super().__init__(message)
        self.report = report


@dataclass
class Work:
    """One segment to upload: a new split, or an ASSIGNED record left by an earlier run."""

    uid: uuid.UUID
    ranges: tuple[LedgerRange, ...]
    nbytes: int
    redo: bool

    @property
    def end(self) -> Position:
        return Position(self.ranges[-1].ledger_id, self.ranges[-1].last)


@dataclass
class Plan:
    topic: TopicName
    work: list[Work]
    skipped: int  # segments already OFFLOADED
    start: Position | None  # where the new splits begin
    size_lookups: int = 0


@dataclass
class BackfillReport:
    topic: str
    skipped_segments: int = 0
    redone_segments: int = 0
    new_segments: int = 0
    offloaded_segments: int = 0
    failed_segments: int = 0
    failed_attempts: int = 0
    entries: int = 0
    bytes: int = 0  # frame bytes uploaded and committed
    object_bytes: int = 0  # data object bytes (headers and padding included)
    size_lookups: int = 0
    upload_seconds: float = 0.0
    task_seconds: float = 0.0  # summed over tasks: the work itself, without Spark's overhead
    seconds: float = 0.0
    first: str | None = None
    last: str | None = None
    segments: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.failed_segments == 0

    @property
    def throughput(self) -> float:
        """Frame bytes per second over the upload phase (plan and Spark start-up excluded)."""
        return self.bytes / self.upload_seconds if self.upload_seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "topic": self.topic, "skipped_segments": self.skipped_segments,
            "redone_segments": self.redone_segments, "new_segments": self.new_segments,
            "offloaded_segments": self.offloaded_segments,
            "failed_segments": self.failed_segments, "failed_attempts": self.failed_attempts,
            "entries": self.entries, "bytes": self.bytes, "object_bytes": self.object_bytes,
            "size_lookups": self.size_lookups, "upload_seconds": round(self.upload_seconds, 3),
            "task_seconds": round(self.task_seconds, 3),
            "seconds": round(self.seconds, 3),
            "throughput_mib_s": round(self.throughput / MiB, 2),
            "first": self.first, "last": self.last,
        }


# ---- planning ---------------------------------------------------------------------------------

def _frame_total(li: pb.ManagedLedgerInfo.LedgerInfo) -> int:
    return li.size + FRAME_OVERHEAD * li.entries


class HistorySizes:
    """``size_at`` for the splitter over the closed ledgers of the embedded store.

    Whole ledgers are sized from their ``LedgerInfo`` (entries, payload size); a position inside
    a ledger costs one read of its ``.off`` file. Counts the reads it makes.
    """

    def __init__(self, source: LocalLedgerSource, ledgers: Sequence[pb.ManagedLedgerInfo.LedgerInfo]
                 ) -> None:
        self._source = source
        self._base: dict[int, int] = {}
        self._entries: dict[int, int] = {}
        total = 0
        for li in ledgers:
            self._base[li.ledgerId] = total
            self._entries[li.ledgerId] = li.entries
            total += _frame_total(li)
        self._end = {li.ledgerId: _frame_total(li) for li in ledgers}
        self.lookups = 0

    def __call__(self, pos: Position) -> int:
        base = self._base[pos.ledger_id]
        if pos.entry_id <= 0:
            return base
        if pos.entry_id >= self._entries[pos.ledger_id]:
            return base + self._end[pos.ledger_id]
        self.lookups += 1
        return base + self._source.cumulative_bytes(pos.ledger_id, pos.entry_id)

    def range_bytes(self, r: LedgerRange) -> int:
        """Frame bytes of ``r``; also for a ledger that is not closed (a daemon's ASSIGNED
        segment in the open ledger), read from its offsets alone."""
        if r.ledger_id in self._base:
            return self(Position(r.ledger_id, r.last + 1)) - self(Position(r.ledger_id, r.first))
        self.lookups += 2
        return (self._source.cumulative_bytes(r.ledger_id, r.last + 1)
                - self._source.cumulative_bytes(r.ledger_id, r.first))


def closed_ledgers(info: pb.ManagedLedgerInfo) -> list[pb.ManagedLedgerInfo.LedgerInfo]:
    """The ledgers whose ``LedgerInfo`` is closed (``entries`` set); only the last may be open."""
    return [li for li in info.ledgerInfo if li.HasField("entries")]


def make_plan(info: pb.ManagedLedgerInfo, topic: TopicName, sizes: HistorySizes,
              target: int) -> Plan:
    """Blocking (the size look-ups read files): run it in a worker thread."""
    segs = catalog.segments(info)
    skipped = sum(1 for s in segs if s.complete)
    work = [Work(s.uid, s.ranges, sum(sizes.range_bytes(r) for r in s.ranges), True)
            for s in segs if s.kind is SegmentKind.STREAMING and not s.complete]
    start = catalog.next_position(info)
    closed = closed_ledgers(info)
    splits: list[Split] = split_history(
        [LedgerExtent(li.ledgerId, li.entries) for li in closed], start, target, sizes)
    work += [Work(uuid.uuid4(), s.ranges, s.nbytes, False) for s in splits]
    return Plan(topic, work, skipped, start, sizes.lookups)


# ---- metadata edits ---------------------------------------------------------------------------

def _assign_all(work: Sequence[Work], now_ms: int,
                driver: pb.OffloadDriverMetadata) -> Callable[[pb.ManagedLedgerInfo], bool]:
    def edit(info: pb.ManagedLedgerInfo) -> bool:
        for w in work:
            try:
                catalog.add_assigned(info, w.uid, w.ranges, now_ms, driver)
            except ValueError as exc:
                raise Conflict(f"the topic's segments changed while planning the backfill "
                               f"({exc}); rerun it") from exc
        return bool(work)

    return edit


def reassign(info: pb.ManagedLedgerInfo, old: uuid.UUID, new: uuid.UUID, now_ms: int) -> bool:
    """Give the ASSIGNED records of ``old`` the uuid ``new``, in place (pure).

    Unlike remove + add, this works for any segment, not only the newest: the records keep
    their place (and so their begin) in every ledger.
    """
    o_msb, o_lsb = uuid_to_msb_lsb(old)
    n_msb, n_lsb = uuid_to_msb_lsb(new)
    found = False
    for li in info.ledgerInfo:
        if not li.HasField("offloadContext"):
            continue
        for seg in li.offloadContext.offloadSegment:
            if seg.uidMsb == o_msb and seg.uidLsb == o_lsb:
                if seg.complete:
                    raise Conflict(f"segment {old} is already offloaded; not redoing it")
                seg.uidMsb, seg.uidLsb = n_msb, n_lsb
                seg.assignedTimestamp = now_ms
                found = True
    if not found:
        raise Conflict(f"segment {old} is no longer recorded; rerun the backfill")
    return True


# ---- running ----------------------------------------------------------------------------------

@dataclass
class _Ctx:
    settings: Settings
    topic: TopicName
    metadata: MetadataStore
    blobstore: BlobStore
    fence: EpochFence
    spark: Any
    pool: concurrent.futures.ThreadPoolExecutor
    progress: Progress
    report: BackfillReport
    max_block_size: int
    min_block_size: int
    key_prefix: str
    ledger_ts: dict[int, int]
    max_attempts: int
    wall_ms: Callable[[], int] = lambda: int(time.time() * 1000)


def default_owner_id() -> str:
    return f"backfill-{socket.gethostname()}-{os.getpid()}"


async def run_backfill(settings: Settings, topic: TopicName, *, spark: Callable[[], Any],
                       max_attempts: int = 3, concurrency: int | None = None,
                       owner_id: str | None = None, sinks: Sequence[Sink] = (),
                       metrics_bind: str | None = None) -> BackfillReport:
    """Backfill ``topic``'s closed history; ``BackfillFailed`` if any segment could not be
    offloaded after ``max_attempts`` (it stays ASSIGNED for a rerun).

    ``spark()`` returns the SparkSession; it is called only once the topic is owned and there
    is something to upload (a refused or empty backfill starts no JVM). ``concurrency``: segment
    jobs in flight (default twice Spark's ``defaultParallelism``).
    """
    t0 = time.monotonic()
    settings = absolute_paths(settings)
    if settings.source.kind != "local":
        raise ConfigError(f'[source] kind = "{settings.source.kind}": backfill reads the '
                          'embedded ledger store only (kind = "local")')
    policy = settings.policy_for(topic)
    if policy.mode != "streaming":
        raise ConfigError(f"{topic}: offload mode is {policy.mode!r}; backfill writes streaming "
                          "segments only")
    target = max(int(policy.max_size_per_segment_mbytes * MiB), 1)
    report = BackfillReport(str(topic))
    metadata = await wiring.open_metadata(settings)
    try:
        blobstore = await wiring.open_blobstore(settings)
        try:
            owner = owner_id or default_owner_id()
            fence = await fencing.take(metadata, topic.managed_ledger, owner)
            if fence is None:
                holder = await ownership.current_owner(metadata, topic.managed_ledger)
                raise Conflict(f"{topic} is owned by {holder!r} (a running daemon or "
                               "backfill): stop it, or wait for its session to expire, then "
                               "run the backfill again")
            try:
                await _backfill(settings, topic, metadata, blobstore, fence, spark, target,
                                policy.max_block_size_bytes,
                                min(settings.min_block_size(policy), policy.max_block_size_bytes),
                                max_attempts, concurrency, report, sinks, metrics_bind)
            finally:
                try:
                    await fencing.give_back(fence)
                except OffloaddError as exc:
                    log.warning("%s: could not release ownership: %s (it lapses with the "
                                "session)", topic, exc)
        finally:
            await blobstore.close()
    finally:
        await metadata.close()
    report.seconds = time.monotonic() - t0
    if not report.ok:
        raise BackfillFailed(f"{topic}: {report.failed_segments} segment(s) failed after "
                             f"{max_attempts} attempts each; they stay ASSIGNED and the next "
                             "backfill run redoes them", report)
    return report


async def _backfill(settings: Settings, topic: TopicName, metadata: MetadataStore,
                    blobstore: BlobStore, fence: EpochFence, spark_factory: Callable[[], Any],
                    target: int,
                    max_block_size: int, min_block_size: int, max_attempts: int,
                    concurrency: int | None, report: BackfillReport, sinks: Sequence[Sink],
                    metrics_bind: str | None) -> None:
    try:
        info, _ = await managed_ledger.load(metadata, topic.managed_ledger)
    except NotFound as exc:
        raise NotFound(f"topic {topic} does not exist: {exc}") from exc
    source = LocalLedgerSource(settings.source.path, metadata)
    sizes = HistorySizes(source, closed_ledgers(info))
    plan = await asyncio.to_thread(make_plan, info, topic, sizes, target)
    new = [w for w in plan.work if not w.redo]
    report.skipped_segments = plan.skipped
    report.redone_segments = len(plan.work) - len(new)
    report.new_segments = len(new)
    report.size_lookups = plan.size_lookups
    log.info("%s: %d segment(s) already offloaded, %d to redo, %d new from %s (%d size "
             "look-ups)", topic, plan.skipped, report.redone_segments, len(new), plan.start,
             plan.size_lookups)
    if plan.work:
        first = plan.work[0].ranges[0]
        report.first = str(Position(first.ledger_id, first.first))
        report.last = str(plan.work[-1].end)
    if not plan.work:
        return
    spark = await asyncio.to_thread(spark_factory)
    if new:
        driver = catalog.driver_metadata(blobstore.name, dict(blobstore.driver_properties()))
        await commit.apply(metadata, topic.managed_ledger,
                           _assign_all(new, int(time.time() * 1000), driver), fence)
    metrics = MetricsSink(topic)
    if metrics_bind:
        metrics.serve(metrics_bind)
    progress = Progress([*sinks, metrics])
    progress.plan(len(plan.work), sum(w.nbytes for w in plan.work))
    slots = int(spark.sparkContext.defaultParallelism)
    # Twice as many one-task jobs in flight as task slots: when a task ends, the next one is
    # already queued in Spark, so no slot waits for a commit and a job submission.
    workers = max(1, concurrency or 2 * slots)
    pool = concurrent.futures.ThreadPoolExecutor(workers + 1, thread_name_prefix="backfill-job")
    ctx = _Ctx(settings, topic, metadata, blobstore, fence, spark, pool, progress, report,
               max_block_size, min_block_size,
               settings.blobstore.prefix if settings.blobstore.driver == "aws-s3" else "",
               {li.ledgerId: li.timestamp for li in info.ledgerInfo}, max_attempts)
    # Start every executor's Python worker (and its imports) before the clock and the first
    # segment: otherwise the first wave of tasks pays seconds of start-up each.
    try:
        await _in_pool(pool, _warm_up, spark, slots)
    except Exception as exc:
        pool.shutdown(wait=False)
        metrics.stop()
        raise Fatal(f"Spark executors could not run offloadd ({_short(exc)}): on a cluster, "
                    "install the same offloadd on every executor") from exc
    ticker = asyncio.create_task(_tick(progress))
    sem = asyncio.Semaphore(workers)
    t_up = time.monotonic()
    tasks = [asyncio.create_task(_segment(ctx, w, sem)) for w in plan.work]
    try:
        results = await asyncio.gather(*tasks, return_exceptions=True)
    except asyncio.CancelledError:
        for t in tasks:
            t.cancel()
        spark.sparkContext.cancelAllJobs()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    finally:
        report.upload_seconds = time.monotonic() - t_up
        ticker.cancel()
        await asyncio.gather(ticker, return_exceptions=True)
        progress.finish()
        metrics.stop()
        pool.shutdown(wait=False, cancel_futures=True)
    report.failed_attempts = progress.failed_attempts
    for r in results:
        if isinstance(r, Fenced) or (isinstance(r, BaseException)
                                     and not isinstance(r, Exception)):
            raise r
        if isinstance(r, Exception):  # a bug, not a failed attempt: still a failed segment
            log.error("%s: segment task ended with %r", topic, r)
            report.failed_segments += 1


async def _tick(progress: Progress) -> None:
    while True:
        await asyncio.sleep(1.0)
        progress.tick()


async def _segment(ctx: _Ctx, w: Work, sem: asyncio.Semaphore) -> None:
    """Upload and commit one segment, retrying under fresh uuids."""
    loop = asyncio.get_running_loop()
    ml = ctx.topic.managed_ledger
    for attempt in range(ctx.max_attempts):
        async with sem:
            ctx.progress.segment_started()
            try:
                if w.redo or attempt:
                    old, new = w.uid, uuid.uuid4()
                    await commit.apply(ctx.metadata, ml,
                                       partial(_reassign_now, old=old, new=new, ctx=ctx),
                                       ctx.fence)
                    w.uid = new
                    await _delete_objects(ctx, old)
                spec = SegmentSpec(ctx.settings, str(ctx.topic), str(w.uid),
                                   tuple((r.ledger_id, r.first, r.last) for r in w.ranges),
                                   tuple((r.ledger_id, ctx.ledger_ts.get(r.ledger_id, 0))
                                         for r in w.ranges),
                                   ctx.max_block_size, ctx.min_block_size,
                                   ctx.settings.offload.blocks_in_flight, ctx.key_prefix)
                result = await loop.run_in_executor(ctx.pool, _spark_upload, ctx.spark, spec)
                await ctx.blobstore.head(streaming_index_key(w.uid, ctx.key_prefix))
                await commit.apply(ctx.metadata, ml,
                                   partial(_offloaded_now, uid=w.uid, ctx=ctx), ctx.fence)
            except Fenced:
                ctx.progress.attempt_failed()
                raise
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                ctx.progress.attempt_failed()
                log.error("%s: segment %s (%s..%s) attempt %d/%d failed: %s", ctx.topic, w.uid,
                          w.ranges[0].ledger_id, w.end, attempt + 1, ctx.max_attempts,
                          _short(exc))
                w.redo = True
                continue
        ctx.progress.segment_offloaded(result.frame_bytes)
        rep = ctx.report
        rep.offloaded_segments += 1
        rep.entries += result.entries
        rep.bytes += result.frame_bytes
        rep.object_bytes += result.data_length
        rep.task_seconds += result.seconds
        rep.segments.append(str(w.uid))
        return
    ctx.report.failed_segments += 1


def _reassign_now(info: pb.ManagedLedgerInfo, *, old: uuid.UUID, new: uuid.UUID,
                  ctx: _Ctx) -> bool:
    return reassign(info, old, new, ctx.wall_ms())


def _offloaded_now(info: pb.ManagedLedgerInfo, *, uid: uuid.UUID, ctx: _Ctx) -> bool:
    return catalog.mark_offloaded(info, uid, ctx.wall_ms())


async def _in_pool(pool: concurrent.futures.ThreadPoolExecutor, fn: Callable[..., Any],
                   *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)


def _warm_up(spark: Any, n: int) -> None:
    sc = spark.sparkContext
    sc.setJobDescription("offloadd backfill: start the executors' Python workers")
    sc.parallelize(range(n), n).map(_import_task).collect()


def _import_task(i: int) -> int:
    import offloadd.backfill.task  # noqa: F401  (the import is the point)

    time.sleep(0.2)  # overlap the tasks, so each slot starts its own worker
    return i


def _spark_upload(spark: Any, spec: SegmentSpec) -> SegmentResult:
    """One Spark job of one task (runs in a pool thread; Spark pins it to a JVM thread)."""
    sc = spark.sparkContext
    sc.setJobDescription(f"offloadd backfill {spec.topic} segment {spec.uid}")
    # The spec travels in the task's closure: no input data to write out for the job.
    results: list[SegmentResult] = sc.range(0, 1, numSlices=1).map(
        partial(_upload_one, spec)).collect()
    return results[0]


def _upload_one(spec: SegmentSpec, _: int) -> SegmentResult:
    return upload_segment(spec)


async def _delete_objects(ctx: _Ctx, uid: uuid.UUID) -> None:
    for key in (streaming_index_key(uid, ctx.key_prefix),
                streaming_data_key(uid, ctx.key_prefix)):
        try:
            await ctx.blobstore.delete(key)
        except OffloaddError as exc:
            log.warning("%s: could not delete %s of an abandoned attempt: %s (offloadd gc "
                        "removes it)", ctx.topic, key, exc)


def _short(exc: BaseException) -> str:
    """Spark wraps a task's Python traceback in a long Java one: keep the last Python line."""
    text = str(exc)
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line and not line.startswith("at ") and ("Error" in line or "offloadd" in line):
            return line[:500]
    return text.splitlines()[0][:500] if text else type(exc).__name__


def terminal_bar(topic: TopicName) -> TerminalBar:
    return TerminalBar(str(topic))
