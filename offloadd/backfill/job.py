"""The backfill driver: cut a topic's closed history into segments and upload them on Spark.

::

    take ownership ─▶ plan ─▶ assign new splits ─▶ one Spark job, one task per segment
    (epoch fence)     │       (one CAS, ASSIGNED)        │ each task reports through an accumulator
                      │                                  ▼ as it ends
                      │                           driver: index exists? ─▶ commit OFFLOADED
                      ├─ OFFLOADED segments: skipped
                      ├─ ASSIGNED segments (a killed run): redone under fresh uuids
                      └─ closed ledgers after catalog.next_position(): split_history()

Ownership: the driver takes the topic with :mod:`offloadd.commit.fence` (ephemeral owner node
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
recorded in log order; tasks finish in any order). All segments go to Spark as one job with one
partition each (a job per segment would cost ~0.1 s of scheduling apiece). A task never raises:
it reports ``ok`` or ``error`` through an accumulator, which reaches the driver as each task
ends, so one bad segment does not cancel the others, and the driver commits each segment as soon
as its task succeeded (batched with whatever else arrived in the same tenth of a second), once
its index object exists. Failed segments are redone in a further job, up to ``max_attempts``
rounds, each under a fresh uuid written over the same ASSIGNED records (the old uuid's objects
are deleted first), so a zombie writer of an old attempt can never overwrite the pair that gets
committed. Idempotent: a rerun skips OFFLOADED segments and redoes ASSIGNED ones.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from pyspark.accumulators import AccumulatorParam

from offloadd import wiring
from offloadd._proto import mldataformats_pb2 as pb
from offloadd.backfill.plan import HistorySizes, Work, closed_ledgers, make_plan
from offloadd.backfill.progress import MetricsSink, Progress, Sink
from offloadd.backfill.task import SegmentResult, SegmentSpec, absolute_paths, upload_segment
from offloadd.blobstore.base import BlobStore
from offloadd.commit import edits, epochs
from offloadd.commit.fence import EpochFence, give_back_quietly, take
from offloadd.commit.ownership import process_owner_id
from offloadd.config import Settings
from offloadd.errors import ConfigError, Conflict, Fatal, Fenced, NotFound, OffloaddError
from offloadd.ledger.local import LocalLedgerSource
from offloadd.metadata import managed_ledger
from offloadd.metadata.base import MetadataStore
from offloadd.model import Position, TopicName, catalog
from offloadd.model.keys import streaming_index_key
from offloadd.model.segment_state import SegmentState, move_all
from offloadd.model.sizes import MiB
from offloadd.offload.attempt import delete_attempt

log = logging.getLogger(__name__)


class BackfillFailed(OffloaddError):
    """Some segments could not be offloaded; they stay ASSIGNED for the next run."""

    def __init__(self, message: str, report: BackfillReport) -> None:
        super().__init__(message)
        self.report = report


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


# ---- running ----------------------------------------------------------------------------------

@dataclass
class _Ctx:
    settings: Settings
    topic: TopicName
    metadata: MetadataStore
    blobstore: BlobStore
    fence: EpochFence
    spark: Any
    progress: Progress
    report: BackfillReport
    max_block_size: int
    min_block_size: int
    ledger_ts: dict[int, int]
    slots: int
    wall_ms: Callable[[], int] = lambda: int(time.time() * 1000)

    def spec(self, w: Work) -> SegmentSpec:
        return SegmentSpec(self.settings, str(self.topic), str(w.uid),
                           tuple((r.ledger_id, r.first, r.last) for r in w.ranges),
                           tuple((r.ledger_id, self.ledger_ts.get(r.ledger_id, 0))
                                 for r in w.ranges),
                           self.max_block_size, self.min_block_size,
                           self.settings.offload.blocks_in_flight)


async def run_backfill(settings: Settings, topic: TopicName, *, spark: Callable[[], Any],
                       max_attempts: int = 3,
                       owner_id: str | None = None, sinks: Sequence[Sink] = (),
                       metrics_bind: str | None = None) -> BackfillReport:
    """Backfill ``topic``'s closed history; ``BackfillFailed`` if any segment could not be
    offloaded after ``max_attempts`` (it stays ASSIGNED for a rerun).

    ``spark()`` returns the SparkSession; it is called only once the topic is owned and there
    is something to upload (a refused or empty backfill starts no JVM).
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
            owner = owner_id or process_owner_id("backfill")
            fence = await take(metadata, topic.managed_ledger, owner)
            if fence is None:
                holder = await epochs.current_owner(metadata, topic.managed_ledger)
                raise Conflict(f"{topic} is owned by {holder!r} (a running daemon or "
                               "backfill): stop it, or wait for its session to expire, then "
                               "run the backfill again")
            try:
                await _backfill(settings, topic, metadata, blobstore, fence, spark, target,
                                policy.max_block_size_bytes,
                                min(settings.min_block_size(policy), policy.max_block_size_bytes),
                                max_attempts, report, sinks, metrics_bind)
            finally:
                await give_back_quietly(fence, topic)
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
                    target: int, max_block_size: int, min_block_size: int, max_attempts: int,
                    report: BackfillReport, sinks: Sequence[Sink],
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
    if not plan.work:
        return
    first = plan.work[0].ranges[0]
    report.first = str(Position(first.ledger_id, first.first))
    report.last = str(plan.work[-1].end)
    spark = await asyncio.to_thread(spark_factory)
    if new:
        driver = catalog.driver_metadata(blobstore.name, dict(blobstore.driver_properties()))
        await move_all([w.state for w in new], SegmentState.ASSIGNED, partial(
            edits.apply, metadata, topic.managed_ledger,
            _assign_all(new, int(time.time() * 1000), driver), fence))
    metrics = MetricsSink(topic)
    if metrics_bind:
        metrics.serve(metrics_bind)
    progress = Progress([*sinks, metrics])
    progress.plan(len(plan.work), sum(w.nbytes for w in plan.work))
    ctx = _Ctx(settings, topic, metadata, blobstore, fence, spark, progress, report,
               max_block_size, min_block_size,
               {li.ledgerId: li.timestamp for li in info.ledgerInfo},
               int(spark.sparkContext.defaultParallelism))
    try:
        # Start every executor's Python worker (and its imports) before the clock: otherwise
        # the first task in each slot pays seconds of start-up.
        try:
            await asyncio.to_thread(_warm_up, spark, ctx.slots)
        except Exception as exc:
            raise Fatal(f"Spark executors could not run offloadd ({_short(exc)}): on a "
                        "cluster, install the same offloadd on every executor") from exc
        ticker = asyncio.create_task(_tick(progress))
        t_up = time.monotonic()
        try:
            pending = plan.work
            for attempt in range(max_attempts):
                if not pending:
                    break
                if attempt:
                    log.warning("%s: redoing %d failed segment(s), attempt %d of %d", topic,
                                len(pending), attempt + 1, max_attempts)
                pending = await _round(ctx, pending, attempt)
            report.failed_segments = len(pending)
        finally:
            report.upload_seconds = time.monotonic() - t_up
            report.failed_attempts = progress.failed_attempts
            ticker.cancel()
            await asyncio.gather(ticker, return_exceptions=True)
            progress.finish()
    finally:
        metrics.stop()


async def _tick(progress: Progress) -> None:
    while True:
        await asyncio.sleep(1.0)
        progress.tick()


async def _round(ctx: _Ctx, works: list[Work], attempt: int) -> list[Work]:
    """One Spark job of one task per segment; commit each as its task reports success.
    Returns the segments that failed (to redo under fresh uuids)."""
    failed = await _fresh_uuids(ctx, [w for w in works if w.redo])
    unusable = {id(w) for w in failed}
    todo = [w for w in works if id(w) not in unusable]
    if not todo:
        return failed
    results = ctx.spark.sparkContext.accumulator([], _Results())
    group = f"offloadd-backfill-{uuid.uuid4().hex}"
    job = asyncio.ensure_future(asyncio.to_thread(
        _spark_round, ctx.spark, [ctx.spec(w) for w in todo], results, group,
        f"offloadd backfill {ctx.topic}: {len(todo)} segment(s), attempt {attempt + 1}"))
    settled: set[int] = set()
    try:
        while True:
            finished = job.done()
            # Task results reach the driver's accumulator as each task ends (before the job
            # does): commit them now, in batches of whatever arrived since the last look.
            fresh = [r for r in list(results.value) if r[0] not in settled]
            settled.update(r[0] for r in fresh)
            failed += await _settle(ctx, todo, fresh)
            ctx.progress.set_running(min(ctx.slots, len(todo) - len(settled)))
            if finished:
                break
            await asyncio.wait({job}, timeout=0.1)
    except asyncio.CancelledError:
        ctx.spark.sparkContext.cancelJobGroup(group)
        await asyncio.gather(job, return_exceptions=True)
        raise
    if job.exception() is not None:
        log.error("%s: Spark job ended early: %s", ctx.topic, _short(job.exception()))
    lost = [w for i, w in enumerate(todo) if i not in settled]  # no report: the job died
    for w in lost:
        ctx.progress.attempt_failed()
        w.failed()
    return failed + lost


async def _fresh_uuids(ctx: _Ctx, works: list[Work]) -> list[Work]:
    """Give each segment to redo a fresh uuid (one metadata write) and delete the objects of
    the old one; the segments this fails for."""
    if not works:
        return []
    moves = [(w.uid, uuid.uuid4()) for w in works]
    try:  # a redo of a failed attempt
        await move_all([w.state for w in works], SegmentState.ASSIGNED, partial(
            edits.apply, ctx.metadata, ctx.topic.managed_ledger,
            partial(_reassign_all, moves=moves, ctx=ctx), ctx.fence))
    except Fenced:
        raise
    except OffloaddError as exc:
        log.error("%s: could not give %d segment(s) fresh uuids: %s", ctx.topic, len(works), exc)
        for _ in works:
            ctx.progress.attempt_failed()
        return list(works)
    for w, (_, new) in zip(works, moves, strict=True):
        w.uid = new
    sem = asyncio.Semaphore(16)

    def undeleted(key: str, exc: OffloaddError) -> None:
        log.warning("%s: could not delete %s of an abandoned attempt: %s (offloadd gc "
                    "removes it)", ctx.topic, key, exc)

    async def delete(uid: uuid.UUID) -> None:
        async with sem:
            await delete_attempt(ctx.blobstore, uid, on_error=undeleted)

    await asyncio.gather(*(delete(old) for old, _ in moves))
    return []


async def _settle(ctx: _Ctx, todo: list[Work], fresh: list[tuple[int, str, Any]]) -> list[Work]:
    """Commit the segments whose tasks succeeded (one metadata write); the failed ones."""
    failed: list[Work] = []
    done: list[tuple[Work, SegmentResult]] = []
    for i, status, payload in fresh:
        w = todo[i]
        if status == "ok" and isinstance(payload, SegmentResult):
            done.append((w, payload))
        else:
            log.error("%s: segment %s (%s..%s) failed: %s", ctx.topic, w.uid,
                      Position(w.ranges[0].ledger_id, w.ranges[0].first), w.end, payload)
            failed.append(w)

    async def index_exists(w: Work) -> bool:
        try:
            await ctx.blobstore.head(streaming_index_key(w.uid))
            return True
        except OffloaddError as exc:
            log.error("%s: segment %s reported done but its index is not readable: %s",
                      ctx.topic, w.uid, exc)
            return False

    checked = await asyncio.gather(*(index_exists(w) for w, _ in done))
    failed += [w for (w, _), ok in zip(done, checked, strict=True) if not ok]
    done = [d for d, ok in zip(done, checked, strict=True) if ok]
    if done:
        try:
            await move_all([w.state for w, _ in done], SegmentState.OFFLOADED, partial(
                edits.apply, ctx.metadata, ctx.topic.managed_ledger,
                partial(_offloaded_all, uids=[w.uid for w, _ in done], ctx=ctx,
                        usage=[_usage(r) for _, r in done]),
                ctx.fence))
        except Fenced:
            raise
        except OffloaddError as exc:
            log.error("%s: committing %d segment(s) failed: %s", ctx.topic, len(done), exc)
            failed += [w for w, _ in done]
            done = []
    rep = ctx.report
    for w, res in done:
        ctx.progress.segment_offloaded(res.frame_bytes)
        rep.offloaded_segments += 1
        rep.entries += res.entries
        rep.bytes += res.frame_bytes
        rep.object_bytes += res.data_length
        rep.task_seconds += res.seconds
        rep.segments.append(str(w.uid))
    for w in failed:
        ctx.progress.attempt_failed()
        w.failed()
    return failed


def _reassign_all(info: pb.ManagedLedgerInfo, *, moves: list[tuple[uuid.UUID, uuid.UUID]],
                  ctx: _Ctx) -> bool:
    now = ctx.wall_ms()
    for old, new in moves:
        catalog.reassign(info, old, new, now)
    return True


def _usage(res: SegmentResult) -> catalog.TierUsage | None:
    """What the segment costs in the tier (None from a task that did not say: an older one)."""
    if not res.stored_bytes:
        return None
    return catalog.TierUsage(2, res.stored_bytes, res.payload_bytes, res.put_requests)


def _offloaded_all(info: pb.ManagedLedgerInfo, *, uids: list[uuid.UUID], ctx: _Ctx,
                   usage: list[catalog.TierUsage | None] | None = None) -> bool:
    now = ctx.wall_ms()
    for i, uid in enumerate(uids):
        catalog.mark_offloaded(info, uid, now, usage=usage[i] if usage else None)
    return True


# ---- the Spark side ---------------------------------------------------------------------------

class _Results(AccumulatorParam[list[Any]]):
    """Task reports ``(index, "ok" | "error", SegmentResult | message)``, gathered on the driver
    as each task ends."""

    def zero(self, value: list[Any]) -> list[Any]:
        return []

    def addInPlace(self, a: list[Any], b: list[Any]) -> list[Any]:
        a.extend(b)
        return a


def _spark_round(spark: Any, specs: list[SegmentSpec], results: Any, group: str,
                 description: str) -> None:
    """One job, one partition (task) per segment; runs in a worker thread (Spark pins it to a
    JVM thread, so the job group is this job's own)."""
    sc = spark.sparkContext
    sc.setJobGroup(group, description, interruptOnCancel=True)
    indexed = list(enumerate(specs))
    sc.parallelize(indexed, len(indexed)).foreach(partial(_run_task, results))


def _run_task(results: Any, item: tuple[int, SegmentSpec]) -> None:
    """The task: upload, then report through the accumulator. A failure is reported, not
    raised, so it fails this segment alone and not the job with the others."""
    i, spec = item
    try:
        out: tuple[int, str, Any] = (i, "ok", upload_segment(spec))
    except Exception as exc:
        out = (i, "error", f"{type(exc).__name__}: {exc}"[:2000])
    results.add([out])


def _warm_up(spark: Any, n: int) -> None:
    sc = spark.sparkContext
    sc.setJobDescription("offloadd backfill: start the executors' Python workers")
    sc.parallelize(range(n), n).map(_import_task).collect()


def _import_task(i: int) -> int:
    import offloadd.backfill.task  # noqa: F401  (the import is the point)

    time.sleep(0.2)  # overlap the tasks, so each slot starts its own worker
    return i


def _short(exc: BaseException | None) -> str:
    """Spark wraps a task's Python traceback in a long Java one: keep the telling line."""
    text = str(exc)
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line and not line.startswith("at ") and ("Error" in line or "offloadd" in line):
            return line[:500]
    return text.splitlines()[0][:500] if text else type(exc).__name__
