"""One topic's offload task: recovery, the loop over the two modes, failure and backoff.

::

    recover ──▶ ┌─▶ hold back what the thresholds keep ─▶ normalise the position ─┐
                │                                                               ▼
                └──────────── streaming.act(roller.decide(...)) or ledger_mode.step(...)

Segments are strictly sequential: a segment is closed and committed (or, if it failed, redone
over the same positions until it succeeds) before the next one opens. Recovery redoes an
ASSIGNED segment (a crash or failure after its range was fixed) over exactly its positions
under a fresh uuid, deleting the dead attempt's objects first, then resumes right after the
last recorded segment. A failed attempt is abandoned (its upload aborted, its objects deleted
unless the catalog records it), then retried after a backoff (:mod:`offloadd.retry`) through
recovery. Losing ownership (``Fenced``) or cancellation stops the task without committing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence

from offloadd.commit.fence import Fence
from offloadd.commit.state import SegmentState, Tracked, stored
from offloadd.errors import Fenced, OffloaddError
from offloadd.model import LedgerDesc, Position, TopicName, catalog
from offloadd.model.catalog import Segment, SegmentKind
from offloadd.model.lifecycle import Lifecycle
from offloadd.offload import roller
from offloadd.offload.attempt import delete_attempt
from offloadd.offload.context import OffloadEnv, TopicContext, TopicPolicy
from offloadd.offload.lag import Lag
from offloadd.offload.ledger_mode import LedgerMode
from offloadd.offload.probes import NullProbe, StatusSink, TopicProbe
from offloadd.offload.streaming import StreamingMode
from offloadd.offload.threshold import TailLog
from offloadd.retry import Retry

__all__ = ["OffloadEnv", "TopicOffloader", "TopicPolicy", "TopicProbe"]

log = logging.getLogger(__name__)


class _StoppedDuringRecovery(Exception):
    """A stop request arrived while recovery was backing off between retries."""


class TopicOffloader:
    """Streams one topic into the tier. Long-lived; NEW → RUNNING → STOPPING → STOPPED."""

    def __init__(self, topic: TopicName, env: OffloadEnv, policy: Callable[[], TopicPolicy],
                 fence: Fence, probe: TopicProbe | None = None,
                 status: StatusSink | None = None) -> None:
        self.ctx = ctx = TopicContext(topic, env, policy, fence, probe or NullProbe(), status)
        self.streaming = StreamingMode(ctx)
        self.ledger_mode = LedgerMode(ctx, self.streaming)
        self.state = Lifecycle.NEW
        self.recovered = False  # last_committed is known (recovery read the catalog)
        self.lag: Lag | None = None  # the lag loop's latest measurement (offload/lag.py)
        self._manual = asyncio.Event()
        self._stop = asyncio.Event()
        self._recovery_failures = 0  # failures since the last good recovery that were its own
        self._reported_lost: set[int] = set()
        self._held = TailLog()  # marks for the offload thresholds

    # ---- what the daemon, the scheduler and status read -----------------------------------
    @property
    def topic(self) -> TopicName:
        return self.ctx.topic

    @property
    def probe(self) -> TopicProbe:
        return self.ctx.probe

    @property
    def position(self) -> Position | None:
        return self.ctx.position

    @property
    def last_committed(self) -> Position | None:
        return self.ctx.last_committed

    @property
    def failed_attempts(self) -> int:
        return self.ctx.failed_attempts

    @property
    def last_error(self) -> str | None:
        return self.ctx.last_error

    @property
    def segment_state(self) -> SegmentState | None:
        """The state of the segment in progress (or of the last one)."""
        return self.ctx.segment.state if self.ctx.segment is not None else None

    @property
    def running(self) -> bool:
        return self.state is Lifecycle.RUNNING

    # ---- control -------------------------------------------------------------------------
    def trigger(self) -> None:
        """Close the open segment now (SIGUSR1 / ``offloadd offload-now``)."""
        self._manual.set()
        self.ctx.wake.set()

    def request_stop(self) -> None:
        if self.state in (Lifecycle.NEW, Lifecycle.RUNNING):
            self.state = self.state.to(Lifecycle.STOPPING)
        self._stop.set()
        self.ctx.wake.set()

    # ---- main loop -----------------------------------------------------------------------
    async def run(self) -> None:
        if self.state is Lifecycle.NEW:
            self.state = self.state.to(Lifecycle.RUNNING)
        try:
            await self._recover_with_retry()
            while True:
                try:
                    done = await self._step()
                except (Fenced, asyncio.CancelledError):
                    raise
                except OffloaddError as exc:
                    await self._on_failure(exc)
                    continue
                if done:
                    break
        except _StoppedDuringRecovery:
            log.info("topic %s: stopped while recovery was still retrying; nothing was "
                     "committed, the next start recovers again", self.topic)
            await self._abandon()
        except Fenced as exc:
            log.warning("topic %s: lost ownership (%s); stopping without committing",
                        self.topic, exc)
            await self._abandon()
        except asyncio.CancelledError:
            await asyncio.shield(self._abandon())
            raise
        finally:
            self.state = self.state.to(Lifecycle.STOPPED)

    async def _step(self) -> bool:
        """One turn of the loop; True when the task is finished (stopped)."""
        ctx = self.ctx
        policy = ctx.policy()
        # the offload thresholds hide what must stay only in the source for now
        ledgers = self._held.clip(policy.thresholds, await ctx.ledgers(), ctx.env.wall_ms(),
                                  ctx.position)
        pos, desc = self._normalise(ledgers)
        stopping = self._stop.is_set()
        if policy.mode == "ledger" and not stopping:
            target, used = roller.roll(policy.roll, now=ctx.env.clock(), ledgers=ledgers,
                                       segment=self.streaming.open_segment(),
                                       manual=self._manual.is_set(), stopping=stopping)
            self._apply(target, used)
            await self.ledger_mode.step(pos, desc)
            return False
        d = roller.decide(
            policy.roll, now=ctx.env.clock(), ledgers=ledgers, pos=pos, desc=desc,
            segment=self.streaming.open_segment(), pending_since=self.streaming.pending_since,
            manual=self._manual.is_set(), stopping=stopping,
            bytes_before=self.streaming.bytes_before.get(desc.ledger_id) if desc else None,
            idle_poll_s=ctx.env.idle_poll_s)
        self._apply(d.close_target, d.trigger_used)
        self.streaming.pending_since = d.pending_since
        return await self.streaming.act(d, pos, desc)

    def _apply(self, close_target: Position | None, trigger_used: bool) -> None:
        if trigger_used:
            self._manual.clear()
        if self.ctx.attempt is not None:
            self.ctx.attempt.close_target = close_target

    def _normalise(self, ledgers: Sequence[LedgerDesc]) -> tuple[Position | None,
                                                               LedgerDesc | None]:
        """Move the position over ended or vanished ledgers; report entries lost to a ledger
        deleted before they were offloaded (once per ledger)."""
        pos, desc, skipped = roller.normalise(ledgers, self.ctx.position)
        for lost in skipped:
            if lost.ledger_id not in self._reported_lost and self.ctx.attempt is None:
                self._reported_lost.add(lost.ledger_id)
                log.error("topic %s: ledger %d was deleted before entries from %s were "
                          "offloaded; they are lost to retention", self.topic, lost.ledger_id,
                          lost)
                self.probe.data_lost(lost.ledger_id)
        self.ctx.position = pos
        return pos, desc

    # ---- recovery ------------------------------------------------------------------------
    async def _recover_with_retry(self) -> None:
        retry = Retry(self.ctx.env.retry)
        while True:
            try:
                await self._recover()
                if self._recovery_failures and self._recovery_failures == self.failed_attempts:
                    # only recovery had failed, and now it worked: the topic is not failing
                    self.ctx.failed_attempts = 0
                    self.ctx.last_error = None
                    if self.ctx.status_sink is not None:
                        self.ctx.status_sink.cleared()
                self._recovery_failures = 0
                return
            except Fenced:
                raise
            except OffloaddError as exc:
                delay = retry.next_delay()
                self._failed(exc)  # a topic that cannot even recover is failing
                self._recovery_failures += 1
                log.error("topic %s: recovery failed: %s (retrying in %.1fs)",
                          self.topic, exc, delay)
                if await self._sleep_or_stop(delay):
                    raise _StoppedDuringRecovery from exc

    async def _recover(self) -> None:
        """Redo any ASSIGNED segment over its positions, then resume after the last one."""
        ctx = self.ctx
        self.streaming.bytes_before.clear()
        info = await ctx.load()
        # read, then check ownership: a stale owner must not redo (and so delete the objects
        # of) a segment the new owner is writing
        await ctx.fence.verify()
        ctx.publish_states(catalog.segments(info))
        for seg in catalog.segments(info):
            if not seg.complete:
                # an ASSIGNED record whose attempt failed (here, or in a process that died)
                failed = ctx.segment if ctx.segment is not None and \
                    ctx.segment.state is SegmentState.FAILED else Tracked(stored(False))
                failed.to(SegmentState.FAILED)
                await self._redo_or_drop(seg, failed)
                info = await ctx.load()
        done = [s for s in catalog.segments(info) if s.complete]
        if done:
            ctx.last_committed = done[-1].end
            self.probe.last_offloaded(*done[-1].end)
            if done[-1].offloaded_ms > 0:
                ctx.last_commit_ms = done[-1].offloaded_ms
                self.probe.last_commit_time(done[-1].offloaded_ms / 1000)
        ctx.position = catalog.next_position(info)
        self.recovered = True
        ctx.publish_states(catalog.segments(info))

    async def _redo_or_drop(self, seg: Segment, failed: Tracked) -> None:
        ctx = self.ctx
        live = {d.ledger_id for d in await ctx.ledgers()}
        if not set(seg.ledger_ids()) <= live:
            # its ledgers were deleted (retention) before it could be redone
            log.error("topic %s: assigned segment %s covers ledgers the source no longer has; "
                      "dropping it: entries %s..%s are lost to retention", self.topic, seg.uid,
                      seg.begin, seg.end)
            for lid in set(seg.ledger_ids()) - live:
                self.probe.data_lost(lid)
            await delete_attempt(ctx.env.blobstore, seg.uid, seg.ledger_ids())
            await ctx.commit(lambda info: catalog.remove_segment(info, seg.uid))
            failed.to(SegmentState.DELETED)
            return
        log.info("topic %s: redoing assigned segment %s over %s..%s", self.topic, seg.uid,
                 seg.begin, seg.end)
        await delete_attempt(ctx.env.blobstore, seg.uid, seg.ledger_ids())
        if seg.kind is SegmentKind.LEDGER:
            await self.ledger_mode.offload(seg.ranges[0].ledger_id, failed)
            return
        await self.streaming.upload_ranges(seg.ranges, redo_of=seg.uid, segment=failed)
        ctx.position = Position(seg.end.ledger_id, seg.end.entry_id + 1)

    # ---- failure -------------------------------------------------------------------------
    def _failed(self, exc: OffloaddError) -> None:
        ctx = self.ctx
        ctx.failed_attempts += 1
        ctx.last_error = str(exc)
        if ctx.status_sink is not None:
            ctx.status_sink.failed(ctx.last_error, ctx.failed_attempts)

    async def _on_failure(self, exc: OffloaddError) -> None:
        """A failed attempt: abort it, back off, then redo the same positions."""
        ctx = self.ctx
        self._failed(exc)
        self.probe.offload_error()
        self.probe.write_storage_error()
        att = ctx.attempt
        if ctx.segment is None or ctx.segment.state in (SegmentState.OFFLOADED,
                                                        SegmentState.DELETED):
            ctx.segment = Tracked()  # the next segment failed before it had begun
        ctx.segment.to(SegmentState.FAILED)
        log.error("topic %s: offload attempt failed (%s); retry %d", self.topic, exc,
                  self.failed_attempts)
        await self._abandon()
        if att is not None and att.close_target is not None:
            self._manual.set()  # the retry closes as promptly as the failed attempt meant to
        delay = ctx.env.retry.delay(self.failed_attempts)
        if await self._sleep_or_stop(delay) and att is None:
            return
        # Rewind: recovery finds an ASSIGNED record (redo it) or the last committed end.
        await self._recover_with_retry()

    async def _abandon(self) -> None:
        """Discard the open attempt's uncommitted work.

        Its objects are deleted only when the metadata, read *now*, does not record the attempt:
        a commit whose reply was lost may have landed (then the objects are the committed
        segment's), and an ASSIGNED record belongs to recovery, which redoes it and deletes the
        dead attempt's objects itself. When the metadata cannot be read, nothing is deleted
        (``offloadd gc`` sweeps real orphans later).
        """
        ctx = self.ctx
        att = ctx.attempt
        if att is None:
            return
        try:
            await att.abort()
            try:
                info = await ctx.load()
            except OffloaddError as exc:
                log.warning("topic %s: attempt %s abandoned; metadata unreadable (%s), its "
                            "objects are left for offloadd gc", self.topic, att.uid, exc)
                return
            if any(s.uid == att.uid for s in catalog.segments(info)):
                return
            try:
                await delete_attempt(ctx.env.blobstore, att.uid)
            except OffloaddError as exc:
                log.warning("topic %s: could not delete objects of abandoned attempt %s: %s "
                            "(offloadd gc removes them)", self.topic, att.uid, exc)
        finally:
            if ctx.attempt is att:
                ctx.attempt = None

    async def _sleep_or_stop(self, delay: float) -> bool:
        try:
            await asyncio.wait_for(self._stop.wait(), delay)
            return True
        except TimeoutError:
            return False

    def status(self) -> Mapping[str, object]:
        ctx = self.ctx
        return {
            "state": self.state.value,
            "position": str(ctx.position) if ctx.position else None,
            "last_committed": str(ctx.last_committed) if ctx.last_committed else None,
            "open_segment_bytes": ctx.attempt.frame_bytes if ctx.attempt else 0,
            "failed_attempts": ctx.failed_attempts,
            "last_error": ctx.last_error,
            "last_commit_ms": ctx.last_commit_ms,
            "lag": self.lag.as_dict() if self.lag is not None else None,
        }
