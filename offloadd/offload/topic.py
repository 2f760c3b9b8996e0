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
from offloadd.errors import Fenced, OffloaddError
from offloadd.model import LedgerDesc, Position, TopicName, catalog
from offloadd.model.catalog import Segment, SegmentKind
from offloadd.model.lifecycle import Lifecycle
from offloadd.model.segment_state import SegmentState, Tracked, stored
from offloadd.offload import roller
from offloadd.offload.attempt import delete_attempt
from offloadd.offload.context import OffloadEnv, OffloadMode, TopicContext, TopicPolicy
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


class TopicOffloader(TopicContext):
    """Streams one topic into the tier. Long-lived; NEW → RUNNING → STOPPING → STOPPED.

    It is the topic's :class:`TopicContext` (position, last commit, failures: what the daemon
    and ``status`` read) with the loop around it; the modes share it."""

    __slots__ = ("_held", "_manual", "_recovery_failures", "_reported_lost", "_stop_fut",
                 "_stopping", "_turn", "lag", "leave_open", "ledger_mode", "recovered", "state",
                 "streaming")

    def __init__(self, topic: TopicName, env: OffloadEnv, policy: Callable[[], TopicPolicy],
                 fence: Fence, probe: TopicProbe | None = None,
                 status: StatusSink | None = None) -> None:
        super().__init__(topic, env, policy, fence, probe or NullProbe(), status)
        self.streaming = StreamingMode(self)
        self.ledger_mode = LedgerMode(self, self.streaming)
        self.state = Lifecycle.NEW
        self.recovered = False  # last_committed is known (recovery read the catalog)
        self.lag: Lag | None = None  # the lag loop's latest measurement (offload/lag.py)
        self._manual = False  # a trigger not yet acted on
        self._stopping = False  # a stop was requested
        # what a backoff waits on besides its delay (made only while one waits: issue 22)
        self._stop_fut: asyncio.Future[None] | None = None
        # a stop out of time: a cancellation leaves the open attempt as a crash would (nothing
        # recorded for it; its incomplete upload is offloadd gc's) instead of cleaning it up
        self.leave_open = False
        # the stop's turn this task holds (OffloadEnv.stop_closes), from before it reads its
        # ledgers until it ends: a task holding one is mid-way through its last close
        self._turn: asyncio.Semaphore | None = None
        self._recovery_failures = 0  # failures since the last good recovery that were its own
        self._reported_lost: set[int] | None = None  # made at the first loss
        self._held = TailLog()  # marks for the offload thresholds

    @property
    def segment_state(self) -> SegmentState | None:
        """The state of the segment in progress (or of the last one)."""
        return self.segment.state if self.segment is not None else None

    @property
    def running(self) -> bool:
        return self.state is Lifecycle.RUNNING

    @property
    def in_turn(self) -> bool:
        """Stopping and past waiting for its turn: it may be closing its open segment."""
        return self._turn is not None

    # ---- control -------------------------------------------------------------------------
    def trigger(self) -> None:
        """Close the open segment now (SIGUSR1 / ``offloadd offload-now``)."""
        self._manual = True
        self.wake.set()

    def request_stop(self) -> None:
        if self.state in (Lifecycle.NEW, Lifecycle.RUNNING):
            self.state = self.state.to(Lifecycle.STOPPING)
        self._stopping = True
        fut = self._stop_fut
        if fut is not None and not fut.done():
            fut.set_result(None)
        self.wake.set()

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
            await self.streaming.abandon()
        except Fenced as exc:
            log.warning("topic %s: lost ownership (%s); stopping without committing",
                        self.topic, exc)
            await self.streaming.abandon()
        except asyncio.CancelledError:
            if self.leave_open:
                log.debug("topic %s: stopped out of time; the open attempt is left", self.topic)
            else:
                await self.streaming.abandon()  # runs to its end even when cancelled
            raise
        finally:
            if self._turn is not None:
                self._turn.release()
                self._turn = None
            self.state = self.state.to(Lifecycle.STOPPED)

    async def _step(self) -> bool:
        """One turn of the loop; True when the task is finished (stopped)."""
        gate = self.env.stop_closes
        if self._stopping and gate is not None and self._turn is None:
            # A stop's closes take turns (OffloadEnv.stop_closes), and the turn is taken
            # before the ledgers are read: 10,000 topics reading at once delayed every close.
            # It is kept until the task ends, so one close is not spread over many turns.
            await gate.acquire()
            self._turn = gate
        policy = self.policy()
        # the offload thresholds hide what must stay only in the source for now
        ledgers = self._held.clip(policy.thresholds, await self.ledgers(), self.env.wall_ms(),
                                  self.position)
        pos, desc = self._normalise(ledgers)
        stopping = self._stopping
        if stopping and self._turn is None and self.env.stop_closes is not None:
            return False  # the stop came while it read: its turn first, then read again
        if policy.mode is OffloadMode.LEDGER and not stopping:
            target, used = roller.roll(policy.roll, now=self.env.clock(), ledgers=ledgers,
                                       segment=self.streaming.open_segment(),
                                       manual=self._manual, stopping=stopping)
            self._apply(target, used)
            await self.ledger_mode.step(pos, desc)
            return False
        d = roller.decide(
            policy.roll, now=self.env.clock(), ledgers=ledgers, pos=pos, desc=desc,
            segment=self.streaming.open_segment(), pending_since=self.streaming.pending_since,
            manual=self._manual, stopping=stopping,
            bytes_before=self.streaming.bytes_before.get(desc.ledger_id) if desc else None,
            idle_poll_s=self.idle_poll_s(policy))
        self._apply(d.close_target, d.trigger_used)
        self.streaming.pending_since = d.pending_since
        return await self.streaming.act(d, pos, desc)

    def _apply(self, close_target: Position | None, trigger_used: bool) -> None:
        if trigger_used:
            self._manual = False
        if self.attempt is not None:
            self.attempt.close_target = close_target

    def _normalise(self, ledgers: Sequence[LedgerDesc]) -> tuple[Position | None,
                                                               LedgerDesc | None]:
        """Move the position over ended or vanished ledgers; report entries lost to a ledger
        deleted before they were offloaded (once per ledger)."""
        pos, desc, skipped = roller.normalise(ledgers, self.position)
        for lost in skipped:
            reported = self._reported_lost
            if reported is None:
                reported = self._reported_lost = set()
            if lost.ledger_id not in reported and self.attempt is None:
                reported.add(lost.ledger_id)
                log.error("topic %s: ledger %d was deleted before entries from %s were "
                          "offloaded; they are lost to retention", self.topic, lost.ledger_id,
                          lost)
                self.probe.data_lost(lost.ledger_id)
        self.position = pos
        return pos, desc

    # ---- recovery ------------------------------------------------------------------------
    async def _recover_with_retry(self) -> None:
        retry = Retry(self.env.retry)
        while True:
            try:
                await self._recover()
                if self._recovery_failures and self._recovery_failures == self.failed_attempts:
                    # only recovery had failed, and now it worked: the topic is not failing
                    self.failed_attempts = 0
                    self.last_error = None
                    if self.status_sink is not None:
                        self.status_sink.cleared()
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
        self.streaming.bytes_before.clear()
        info = await self.load()
        # read, then check ownership: a stale owner must not redo (and so delete the objects
        # of) a segment the new owner is writing
        await self.fence.verify()
        self.publish_states(catalog.segments(info))
        for seg in catalog.segments(info):
            if not seg.complete:
                # an ASSIGNED record whose attempt failed (here, or in a process that died)
                failed = self.segment if self.segment is not None and \
                    self.segment.state is SegmentState.FAILED else Tracked(stored(False))
                failed.to(SegmentState.FAILED)
                await self._redo_or_drop(seg, failed)
                info = await self.load()
        done = [s for s in catalog.segments(info) if s.complete]
        if done:
            self.last_committed = done[-1].end
            self.probe.last_offloaded(*done[-1].end)
            if done[-1].offloaded_ms > 0:
                self.last_commit_ms = done[-1].offloaded_ms
                self.probe.last_commit_time(done[-1].offloaded_ms / 1000)
        self.position = catalog.next_position(info)
        self.recovered = True
        self.progressed()
        self.publish_states(catalog.segments(info))

    async def _redo_or_drop(self, seg: Segment, failed: Tracked) -> None:
        live = {d.ledger_id for d in await self.ledgers()}
        if not set(seg.ledger_ids()) <= live:
            # its ledgers were deleted (retention) before it could be redone
            log.error("topic %s: assigned segment %s covers ledgers the source no longer has; "
                      "dropping it: entries %s..%s are lost to retention", self.topic, seg.uid,
                      seg.begin, seg.end)
            for lid in set(seg.ledger_ids()) - live:
                self.probe.data_lost(lid)
            await delete_attempt(self.env.blobstore, seg.uid, seg.ledger_ids())
            await self.commit(lambda info: catalog.remove_segment(info, seg.uid))
            failed.to(SegmentState.DELETED)
            return
        log.info("topic %s: redoing assigned segment %s over %s..%s", self.topic, seg.uid,
                 seg.begin, seg.end)
        await delete_attempt(self.env.blobstore, seg.uid, seg.ledger_ids())
        if seg.kind is SegmentKind.LEDGER:
            await self.ledger_mode.offload(seg.ranges[0].ledger_id, failed)
            return
        await self.streaming.upload_ranges(seg.ranges, redo_of=seg.uid, segment=failed)
        self.position = Position(seg.end.ledger_id, seg.end.entry_id + 1)

    # ---- failure -------------------------------------------------------------------------
    def _failed(self, exc: OffloaddError) -> None:
        self.failed_attempts += 1
        self.last_error = str(exc)
        if self.status_sink is not None:
            self.status_sink.failed(self.last_error, self.failed_attempts)

    async def _on_failure(self, exc: OffloaddError) -> None:
        """A failed attempt: abort it, back off, then redo the same positions."""
        self._failed(exc)
        self.probe.offload_error()
        self.probe.write_storage_error()
        att = self.attempt
        if self.segment is None or self.segment.state in (SegmentState.OFFLOADED,
                                                        SegmentState.DELETED):
            self.segment = Tracked()  # the next segment failed before it had begun
        self.segment.to(SegmentState.FAILED)
        log.error("topic %s: offload attempt failed (%s); retry %d", self.topic, exc,
                  self.failed_attempts)
        await self.streaming.abandon()
        if att is not None and att.close_target is not None:
            self._manual = True  # the retry closes as promptly as the failed attempt meant to
        delay = self.env.retry.delay(self.failed_attempts)
        if await self._sleep_or_stop(delay) and att is None:
            return
        # Rewind: recovery finds an ASSIGNED record (redo it) or the last committed end.
        await self._recover_with_retry()

    async def _sleep_or_stop(self, delay: float) -> bool:
        if self._stopping:
            return True
        fut = self._stop_fut = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(delay):
                await fut
            return True
        except TimeoutError:
            return False
        finally:
            self._stop_fut = None

    def status(self) -> Mapping[str, object]:
        return {
            "state": self.state.value,
            "position": str(self.position) if self.position else None,
            "last_committed": str(self.last_committed) if self.last_committed else None,
            "open_segment_bytes": self.attempt.frame_bytes if self.attempt else 0,
            "failed_attempts": self.failed_attempts,
            "last_error": self.last_error,
            "last_commit_ms": self.last_commit_ms,
            # (aged: a quiet topic's lag is measured once, its seconds move with the clock)
            "lag": self.lag.aged(self.env.wall_ms()).as_dict() if self.lag is not None
            else None,
        }
