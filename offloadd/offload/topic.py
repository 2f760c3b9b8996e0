"""One topic's offload task: tail → buffer → roll → blocks → upload → commit, in a loop.

Plan, act and commit are separate pieces (roller.py plans, upload.py acts, commit.py commits);
this module only sequences them for one topic::

    recover ──▶ ┌─▶ normalise position ─▶ read a block's worth ─▶ submit parts ─┐
                │                                                              │
                └──── wait for entries ◀── roll? ──yes──▶ close: assign, drain, complete,
                                                          index, commit ──────┘

Segments are strictly sequential: a segment is closed and committed (or, if it failed, redone
over the same positions until it succeeds) before the next one opens. A segment is recorded
ASSIGNED (with its full range) when it closes, just before its data object is completed; a
crash before that leaves only an incomplete upload (swept at start-up) and the next run starts
the same positions afresh; a crash after it leaves an ASSIGNED segment that recovery redoes over
exactly those positions under a fresh uuid, removing the dead attempt's objects first.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from offloadd.blobstore.base import BlobStore
from offloadd.errors import Fenced, NotFound, OffloaddError
from offloadd.format.checksum import stamp_parts
from offloadd.format.ledger import LedgerObjectBuilder, build_ledger_metadata
from offloadd.format.streaming import StreamingObjectBuilder
from offloadd.ledger.base import LedgerSource
from offloadd.metadata import managed_ledger
from offloadd.metadata.base import MetadataStore
from offloadd.metadata.managed_ledger import ManagedLedgerInfo
from offloadd.model import EntryRun, LedgerDesc, LedgerState, Position, TopicName, catalog
from offloadd.model.catalog import LedgerRange, Segment, SegmentKind
from offloadd.model.keys import (
    ledger_data_key,
    ledger_index_key,
    streaming_data_key,
    streaming_index_key,
)
from offloadd.model.objects import index_metadata, object_metadata
from offloadd.offload import commit, roller
from offloadd.offload.buffer import OffloadBuffer
from offloadd.offload.commit import Fence
from offloadd.offload.lag import Lag
from offloadd.offload.roller import RollPolicy, RollReason
from offloadd.offload.state import SegmentState
from offloadd.offload.threshold import TailLog, Thresholds
from offloadd.offload.upload import SegmentUpload

log = logging.getLogger(__name__)



class TopicProbe(Protocol):
    """What a topic task reports; :mod:`offloadd.metrics` implements it."""

    def offload_bytes(self, n: int) -> None: ...
    def offload_error(self) -> None: ...
    def write_storage_error(self) -> None: ...
    def upload_latency(self, seconds: float) -> None: ...
    def segment_committed(self, entries: int, nbytes: int, seconds: float) -> None: ...
    def segment_states(self, assigned: int, offloaded: int, failed: int) -> None: ...
    def lag(self, entries: int, nbytes: int, seconds: float) -> None: ...
    def last_offloaded(self, ledger_id: int, entry_id: int) -> None: ...
    def last_commit_time(self, seconds: float) -> None: ...
    def metadata_write(self) -> None: ...
    def ledger_reading_max_bytes(self, n: int) -> None: ...
    def data_lost(self, ledger_id: int) -> None: ...


class StatusSink(Protocol):
    """Where a topic task reports outcomes for its persisted offload status
    (:class:`offloadd.offload.recorder.StatusRecorder`)."""

    def succeeded(self, position: Position, segment: str, when_ms: int | None = None) -> None: ...
    def failed(self, error: str, attempts: int, when_ms: int | None = None) -> None: ...
    def cleared(self) -> None: ...


class NullProbe:
    def offload_bytes(self, n: int) -> None: pass
    def offload_error(self) -> None: pass
    def write_storage_error(self) -> None: pass
    def upload_latency(self, seconds: float) -> None: pass
    def segment_committed(self, entries: int, nbytes: int, seconds: float) -> None: pass
    def segment_states(self, assigned: int, offloaded: int, failed: int) -> None: pass
    def lag(self, entries: int, nbytes: int, seconds: float) -> None: pass
    def last_offloaded(self, ledger_id: int, entry_id: int) -> None: pass
    def last_commit_time(self, seconds: float) -> None: pass
    def metadata_write(self) -> None: pass
    def ledger_reading_max_bytes(self, n: int) -> None: pass
    def data_lost(self, ledger_id: int) -> None: pass


@dataclass(frozen=True)
class TopicPolicy:
    roll: RollPolicy
    mode: str = "streaming"
    # what stays only in the source for now (threshold.py)
    thresholds: Thresholds = field(default_factory=Thresholds)


@dataclass
class OffloadEnv:
    """The collaborators every topic task shares (injected; no globals)."""

    source: LedgerSource
    metadata: MetadataStore
    blobstore: BlobStore
    buffer: OffloadBuffer
    acquire: Callable[[int, str], Awaitable[object]] | None = None  # throttle
    clock: Callable[[], float] = time.monotonic
    wall_ms: Callable[[], int] = lambda: int(time.time() * 1000)
    blocks_in_flight: int = 4
    key_prefix: str = ""
    retry_base_s: float = 0.5
    retry_max_s: float = 30.0
    idle_poll_s: float = 1.0


class _StoppedDuringRecovery(Exception):
    """A stop request arrived while recovery was backing off between retries."""


class TaskState(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


@dataclass
class _Attempt:
    """One attempt at one segment: its uuid, upload and what it holds so far."""

    uid: uuid.UUID
    upload: SegmentUpload
    builder: StreamingObjectBuilder
    opened_at: float
    ranges: list[LedgerRange] = field(default_factory=list)
    frame_bytes: int = 0
    payload_bytes: int = 0
    ledger_ts: dict[int, int] = field(default_factory=dict)
    close_target: Position | None = None
    redo_of: uuid.UUID | None = None  # the ASSIGNED record this attempt replaces

    def add(self, run: EntryRun) -> None:
        if self.ranges and self.ranges[-1].ledger_id == run.ledger_id:
            last = self.ranges[-1]
            self.ranges[-1] = LedgerRange(last.ledger_id, last.first, run.last_entry_id)
        else:
            self.ranges.append(LedgerRange(run.ledger_id, run.first_entry_id, run.last_entry_id))
        self.frame_bytes += len(run.data)
        self.payload_bytes += run.payload_bytes

    @property
    def end(self) -> Position | None:
        if not self.ranges:
            return None
        return Position(self.ranges[-1].ledger_id, self.ranges[-1].last)


class TopicOffloader:
    """Streams one topic into the tier. Long-lived; states NEW → RUNNING → STOPPING → STOPPED."""

    def __init__(self, topic: TopicName, env: OffloadEnv, policy: Callable[[], TopicPolicy],
                 fence: Fence, probe: TopicProbe | None = None,
                 status: StatusSink | None = None) -> None:
        self.topic = topic
        self.env = env
        self._policy = policy
        self.fence = fence
        self.probe: TopicProbe = probe or NullProbe()
        self.status_sink = status
        self.state = TaskState.NEW
        self._manual = asyncio.Event()
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        self._attempt: _Attempt | None = None
        self._pending_since: float | None = None  # unread entries seen, no segment open yet
        self._bytes_before: dict[int, int] = {}  # ledger -> payload bytes before our position
        self.position: Position | None = None  # next position to offload
        self.last_committed: Position | None = None
        self.last_commit_ms: int | None = None  # wall time of the last commit, if known
        self.recovered = False  # last_committed is known (recovery read the catalog)
        self.lag: Lag | None = None  # the lag loop's latest measurement (offload/lag.py)
        self.failed_attempts = 0
        self._recovery_failures = 0  # failures since the last good recovery that were its own
        self.segment_state: SegmentState | None = None
        self.committed_segments = 0
        self.last_error: str | None = None
        self._reported_lost: set[int] = set()
        self._held = TailLog()  # marks for the offload thresholds

    # ---- control -------------------------------------------------------------------------
    def trigger(self) -> None:
        """Close the open segment now (SIGUSR1 / ``offloadd offload-now``)."""
        self._manual.set()
        self._wake.set()

    def request_stop(self) -> None:
        if self.state in (TaskState.NEW, TaskState.RUNNING):
            self.state = TaskState.STOPPING
        self._stop.set()
        self._wake.set()

    # ---- main loop -----------------------------------------------------------------------
    async def run(self) -> None:
        if self.state is TaskState.NEW:
            self.state = TaskState.RUNNING
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
            self.state = TaskState.STOPPED

    async def _recover_with_retry(self) -> None:
        delay = self.env.retry_base_s
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
                self.last_error = str(exc)
                self.failed_attempts += 1  # a topic that cannot even recover is failing
                self._recovery_failures += 1
                if self.status_sink is not None:
                    self.status_sink.failed(self.last_error, self.failed_attempts)
                log.error("topic %s: recovery failed: %s (retrying in %.1fs)",
                          self.topic, exc, delay)
                if await self._sleep_or_stop(delay):
                    raise _StoppedDuringRecovery from exc
                delay = min(delay * 2, self.env.retry_max_s)

    async def _recover(self) -> None:
        """Redo any ASSIGNED segment over its positions, then resume after the last one."""
        self._bytes_before.clear()
        info, _ = await managed_ledger.load(self.env.metadata, self.topic.managed_ledger)
        # read, then check ownership: a stale owner must not redo (and so delete the objects
        # of) a segment the new owner is writing
        await self.fence.verify()
        segs = catalog.segments(info)
        self._publish_states(segs)
        for seg in segs:
            if not seg.complete:
                live = {d.ledger_id for d in await self._ledgers()}
                if not set(seg.ledger_ids()) <= live:
                    # its ledgers were deleted (retention) before it could be redone
                    log.error("topic %s: assigned segment %s covers ledgers the source no "
                              "longer has; dropping it: entries %s..%s are lost to retention",
                              self.topic, seg.uid, seg.begin, seg.end)
                    for lid in set(seg.ledger_ids()) - live:
                        self.probe.data_lost(lid)
                    await self._delete_objects(seg.uid, seg.ledger_ids())
                    await commit.apply(self.env.metadata, self.topic.managed_ledger,
                                       functools.partial(catalog.remove_segment, uid=seg.uid),
                                       self.fence, on_write=self.probe.metadata_write)
                else:
                    log.info("topic %s: redoing assigned segment %s over %s..%s",
                             self.topic, seg.uid, seg.begin, seg.end)
                    await self._redo(seg)
                info, _ = await managed_ledger.load(self.env.metadata, self.topic.managed_ledger)
        done = [s for s in catalog.segments(info) if s.complete]
        if done:
            self.last_committed = done[-1].end
            self.probe.last_offloaded(*done[-1].end)
            if done[-1].offloaded_ms > 0:
                self.last_commit_ms = done[-1].offloaded_ms
                self.probe.last_commit_time(done[-1].offloaded_ms / 1000)
        self.position = catalog.next_position(info)
        self.recovered = True
        self._publish_states(catalog.segments(info))

    async def _step(self) -> bool:
        """One turn of the loop; True when the task is finished (stopped)."""
        env = self.env
        policy = self._policy()
        pol = policy.roll
        source_ledgers = await self._ledgers()
        # the offload thresholds hide what must stay only in the source for now
        ledgers = self._held.clip(policy.thresholds, source_ledgers, env.wall_ms(),
                                  self.position)
        pos, desc = self._normalise(ledgers)
        att = self._attempt
        now = env.clock()
        stopping = self._stop.is_set()
        reason = roller.roll_reason(pol, att.frame_bytes if att else 0,
                                    att.opened_at if att else None, now, self._manual.is_set())
        if stopping and att is not None and att.frame_bytes:
            reason = RollReason.SHUTDOWN
        if reason is not None and att is not None and att.close_target is None:
            if reason is RollReason.MANUAL:
                self._manual.clear()
            # time and trigger close at the topic's tail as it is now (its last readable entry);
            # size and shutdown close at what the segment holds
            tail = next((Position(d.ledger_id, d.last_entry_id) for d in reversed(ledgers)
                         if d.last_entry_id >= 0), None)
            att.close_target = (max(tail, att.end or tail)
                                if tail is not None and reason in (RollReason.TIME,
                                                                   RollReason.MANUAL)
                                else att.end)
        if self._policy().mode == "ledger" and not stopping:
            return await self._step_ledger_mode(pos, desc, att)

        avail = 0 if desc is None or pos is None else desc.last_entry_id - pos.entry_id + 1
        if att is not None and att.frame_bytes >= pol.max_bytes:
            avail = 0  # full: whatever else is readable goes to the next segment
        elif att is not None and att.close_target is not None and pos is not None:
            # closing: read only up to where we were when the roll was decided
            if pos > att.close_target:
                avail = 0
            elif desc is not None and desc.ledger_id == att.close_target.ledger_id:
                avail = min(avail, att.close_target.entry_id - pos.entry_id + 1)
        if att is None and avail <= 0:
            self._manual.clear()  # a trigger with nothing to offload is a no-op
            self._pending_since = None
        elif att is None and self._pending_since is None:
            self._pending_since = now  # the next segment's age counts from its first entry
        overdue = (att is None and self._pending_since is not None
                   and now - self._pending_since >= pol.max_age_s)
        if desc is not None and pos is not None and avail > 0 and not (stopping and att is None):
            before = self._bytes_before.get(desc.ledger_id)
            must_read = roller.should_read(
                pol, seg_bytes=att.frame_bytes if att else 0, avail_entries=avail,
                avail_payload=(desc.size - before) if before is not None else 1 << 62,
                ledger_closed=desc.state is LedgerState.CLOSED,
                closing=self._manual.is_set() or overdue
                or (att is not None and att.close_target is not None))
            if must_read:
                await self._read_into_segment(pol, desc, pos, avail)
                return False
        if att is not None and att.close_target is not None and att.frame_bytes:
            await self._close(att)
            return False
        if stopping:
            return True
        timeout = env.idle_poll_s
        since = att.opened_at if att is not None else self._pending_since
        if since is not None:
            timeout = max(0.0, min(timeout, since + pol.max_age_s - now))
        await self._wait(pos, timeout)
        return False

    # ---- reading -------------------------------------------------------------------------
    async def _ledgers(self) -> list[LedgerDesc]:
        return await self.env.source.ledgers(self.topic)

    def _normalise(self, ledgers: Sequence[LedgerDesc]) -> tuple[Position | None,
                                                               LedgerDesc | None]:
        """Move the position over ended or vanished ledgers; return it and its ledger."""
        pos = self.position
        if not ledgers:
            return pos, None
        if pos is None:
            pos = Position(ledgers[0].ledger_id, 0)
        ids = [d.ledger_id for d in ledgers]
        while True:
            if pos.ledger_id not in ids:
                later = [d for d in ledgers if d.ledger_id > pos.ledger_id]
                if not later:
                    self.position = pos
                    return pos, None
                if pos.ledger_id not in self._reported_lost and self._attempt is None:
                    self._report_lost(pos)
                pos = Position(later[0].ledger_id, 0)
                continue
            desc = ledgers[ids.index(pos.ledger_id)]
            idx = ids.index(pos.ledger_id)
            if (desc.state is LedgerState.CLOSED and pos.entry_id > desc.last_entry_id
                    and idx + 1 < len(ledgers)):
                pos = Position(ledgers[idx + 1].ledger_id, 0)
                continue
            self.position = pos
            return pos, desc

    def _report_lost(self, pos: Position) -> None:
        self._reported_lost.add(pos.ledger_id)
        log.error("topic %s: ledger %d was deleted before entries from %s were offloaded; "
                  "they are lost to retention", self.topic, pos.ledger_id, pos)
        self.probe.data_lost(pos.ledger_id)

    async def _read_into_segment(self, pol: RollPolicy, desc: LedgerDesc, pos: Position,
                                 avail: int) -> None:
        env = self.env
        att = self._attempt
        if att is not None:
            await att.upload.wait_for_room()
        budget = roller.read_budget(pol, att.frame_bytes if att else 0)
        await env.buffer.reserve(budget)
        reserved = budget
        lease = env.buffer.lease(budget)
        # the phase lines at DEBUG let the crash tests tell where a kill -9 landed
        log.debug("topic %s: building a block from %s", self.topic, pos)
        try:
            run = await env.source.read(self.topic, desc.ledger_id, pos.entry_id,
                                        pos.entry_id + avail - 1, max_bytes=budget, into=lease)
        except BaseException:
            env.buffer.release(reserved)
            env.buffer.give_back(lease)
            raise
        size = len(run.data)
        if size < reserved:
            env.buffer.release(reserved - size)
        elif size > reserved:  # an oversize entry: account for what we actually hold
            env.buffer.grow(size - reserved)
        reserved = size
        self.probe.ledger_reading_max_bytes(size)
        done = self._releaser(reserved, lease)
        try:
            if att is None:
                att = await self._open()
            parts = stamp_parts(att.builder.add_run(run))
        except BaseException:
            done()
            raise
        att.add(run)
        att.ledger_ts.setdefault(desc.ledger_id, desc.ctime_ms)
        att.upload.submit(parts, done)
        log.debug("segment %s: %d part(s) uploading", att.uid, len(parts))
        # what we know of the ledger's byte count before the new position
        if run.last_entry_id == desc.last_entry_id:
            self._bytes_before[desc.ledger_id] = desc.size
        elif desc.ledger_id in self._bytes_before:
            self._bytes_before[desc.ledger_id] += run.payload_bytes
        self.position = Position(desc.ledger_id, run.last_entry_id + 1)

    async def _wait(self, pos: Position | None, timeout: float) -> None:
        self._wake.clear()
        waits: list[asyncio.Task[object]] = [asyncio.ensure_future(self._wake.wait())]
        if pos is not None:
            waits.append(asyncio.ensure_future(self.env.source.wait_for_entries(
                self.topic, pos.ledger_id, pos.entry_id - 1, timeout)))
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    # ---- segments ------------------------------------------------------------------------
    async def _open(self, redo_of: uuid.UUID | None = None) -> _Attempt:
        env = self.env
        pol = self._policy().roll
        uid = uuid.uuid4()
        upload = self._new_upload(streaming_data_key(uid, env.key_prefix))
        await upload.start()
        log.debug("segment %s: multipart upload started", uid)
        builder = StreamingObjectBuilder(max_block_size=pol.max_block_size,
                                         min_block_size=pol.min_block_size)
        opened = self._pending_since if self._pending_since is not None else env.clock()
        self._pending_since = None
        self._attempt = _Attempt(uid, upload, builder, opened, redo_of=redo_of)
        return self._attempt

    def _new_upload(self, key: str) -> SegmentUpload:
        """A data object's upload: parts in flight, throttled, metered."""
        return SegmentUpload(self.env.blobstore, key,
                             object_metadata(self.topic.managed_ledger, "data"),
                             in_flight=self.env.blocks_in_flight, acquire=self._acquire_fn(),
                             on_part_done=self._part_done)

    def _acquire_fn(self) -> Callable[[int], Awaitable[object]] | None:
        acquire = self.env.acquire
        if acquire is None:
            return None
        topic = str(self.topic)

        async def take(n: int) -> object:
            return await acquire(n, topic)

        return take

    def _part_done(self, nbytes: int, seconds: float) -> None:
        self.probe.offload_bytes(nbytes)
        self.probe.upload_latency(seconds)

    async def _close(self, att: _Attempt) -> None:
        """ASSIGN (range fixed) → drain parts → complete data → index → commit OFFLOADED."""
        env = self.env
        t0 = env.clock()
        ranges = tuple(att.ranges)
        props = dict(env.blobstore.driver_properties())
        driver = catalog.driver_metadata(env.blobstore.name, props)
        now_ms = env.wall_ms()

        def assign(info: ManagedLedgerInfo) -> bool:
            if att.redo_of is not None:  # a redo covers exactly the recorded positions
                return catalog.reassign(info, att.redo_of, att.uid, now_ms)
            return catalog.add_assigned(info, att.uid, ranges, now_ms, driver)

        log.debug("segment %s: assigning %s..%s", att.uid, ranges[0].ledger_id, att.end)
        await commit.apply(env.metadata, self.topic.managed_ledger, assign, self.fence,
                           on_write=self.probe.metadata_write)
        self.segment_state = SegmentState.ASSIGNED
        att.redo_of = att.uid  # from here on, a retry replaces this record
        log.debug("segment %s: assigned; draining parts", att.uid)
        await att.upload.complete()
        log.debug("segment %s: data object complete; writing index", att.uid)
        index = att.builder.finish(att.ledger_ts)
        meta = index_metadata(self.topic.managed_ledger, data_length=att.upload.length,
                              index=index)
        await env.blobstore.put(streaming_index_key(att.uid, env.key_prefix), [index], meta)
        log.debug("segment %s: index written; committing", att.uid)
        done_ms = env.wall_ms()
        await commit.apply(env.metadata, self.topic.managed_ledger,
                           lambda info: catalog.mark_offloaded(
                               info, att.uid, done_ms, [r.ledger_id for r in ranges]),
                           self.fence, on_write=self.probe.metadata_write)
        self.segment_state = SegmentState.OFFLOADED
        self._attempt = None
        self.last_committed = Position(ranges[-1].ledger_id, ranges[-1].last)
        self.committed_segments += 1
        self.failed_attempts = 0
        self.last_error = None
        self._committed(done_ms, att.uid)
        self.probe.segment_committed(sum(r.count for r in ranges), att.upload.length,
                                     env.clock() - t0)
        log.info("topic %s: segment %s offloaded: %s..%s (%d ledgers, %d bytes)", self.topic,
                 att.uid, ranges[0].ledger_id, self.last_committed, len(ranges),
                 att.upload.length)
        info, _ = await managed_ledger.load(env.metadata, self.topic.managed_ledger)
        self._publish_states(catalog.segments(info))

    async def _redo(self, seg: Segment) -> None:
        """Upload ``seg``'s exact positions again under a fresh uuid, then commit."""
        await self._delete_objects(seg.uid, seg.ledger_ids())
        if seg.kind is SegmentKind.LEDGER:
            (r,) = seg.ranges
            await self._offload_ledger(r.ledger_id, redo_of=seg.uid)
            return
        await self._upload_ranges(seg.ranges, redo_of=seg.uid)
        self.position = Position(seg.end.ledger_id, seg.end.entry_id + 1)

    async def _read_range(self, r: LedgerRange, upload: SegmentUpload
                          ) -> AsyncIterator[tuple[EntryRun, Callable[[], None]]]:
        """``r`` as runs of at most a block's worth, each with its buffer bytes reserved and
        the callback that frees them (to run once the run's parts have landed)."""
        pol = self._policy().roll
        nxt = r.first
        while nxt <= r.last:
            await upload.wait_for_room()
            budget = pol.block_budget
            await self.env.buffer.reserve(budget)
            lease = self.env.buffer.lease(budget)
            try:
                run = await self.env.source.read(self.topic, r.ledger_id, nxt, r.last,
                                                 max_bytes=budget, into=lease)
            except BaseException:
                self.env.buffer.release(budget)
                self.env.buffer.give_back(lease)
                raise
            size = len(run.data)
            if size < budget:
                self.env.buffer.release(budget - size)
            else:
                self.env.buffer.grow(size - budget)
            yield run, self._releaser(size, lease)
            nxt = run.last_entry_id + 1

    async def _upload_ranges(self, ranges: Sequence[LedgerRange],
                             redo_of: uuid.UUID | None) -> None:
        """One streaming segment over exactly ``ranges`` (all readable now), committed."""
        att = await self._open(redo_of=redo_of)
        stamps = {d.ledger_id: d.ctime_ms for d in await self._ledgers()}
        for r in ranges:
            if r.ledger_id not in stamps:
                raise NotFound(f"topic {self.topic}: ledger {r.ledger_id} is gone from the "
                               f"source; cannot offload {r.ledger_id}:{r.first}..{r.last}")
            async for run, done in self._read_range(r, att.upload):
                try:
                    parts = stamp_parts(att.builder.add_run(run))
                except BaseException:
                    done()
                    raise
                att.add(run)
                att.ledger_ts.setdefault(r.ledger_id, stamps[r.ledger_id])
                att.upload.submit(parts, done)
                log.debug("segment %s: %d part(s) uploading", att.uid, len(parts))
        await self._close(att)

    # ---- ledger-based mode (PIP-17) --------------------------------------------------------
    async def _step_ledger_mode(self, pos: Position | None, desc: LedgerDesc | None,
                                att: _Attempt | None) -> bool:
        """Offload closed ledgers whole. Switching from streaming completes the open segment
        first, and a ledger streaming had started is finished as one streaming segment."""
        if att is not None:
            if att.close_target is None:
                att.close_target = att.end
            await self._close(att)
            return False
        if pos is None or desc is None or desc.state is not LedgerState.CLOSED \
                or pos.entry_id > desc.last_entry_id:
            await self._wait(pos, self.env.idle_poll_s)
            return False
        if pos.entry_id > 0:
            await self._upload_ranges([LedgerRange(desc.ledger_id, pos.entry_id,
                                                   desc.last_entry_id)], redo_of=None)
        else:
            await self._offload_ledger(desc.ledger_id)
        self.position = Position(desc.ledger_id, desc.last_entry_id + 1)
        return False

    async def _offload_ledger(self, ledger_id: int, redo_of: uuid.UUID | None = None) -> None:
        """ASSIGN → data object (one part per block, exact last block) → index → OFFLOADED."""
        env = self.env
        pol = self._policy().roll
        descs = {d.ledger_id: d for d in await self._ledgers()}
        desc = descs.get(ledger_id)
        if desc is None or desc.state is not LedgerState.CLOSED:
            raise NotFound(f"topic {self.topic}: ledger {ledger_id} is not a closed ledger of "
                           "the source")
        uid = uuid.uuid4()
        t0 = env.clock()
        driver = catalog.driver_metadata(env.blobstore.name,
                                         dict(env.blobstore.driver_properties()))
        await commit.apply(env.metadata, self.topic.managed_ledger,
                           lambda info: catalog.assign_ledger(info, ledger_id, uid,
                                                              env.wall_ms(), driver),
                           self.fence, on_write=self.probe.metadata_write)
        self.segment_state = SegmentState.ASSIGNED
        upload = self._new_upload(ledger_data_key(uid, ledger_id, env.key_prefix))
        await upload.start()
        try:
            builder = LedgerObjectBuilder(ledger_id=ledger_id, max_block_size=pol.max_block_size)
            async for run, done in self._read_range(
                    LedgerRange(ledger_id, 0, desc.last_entry_id), upload):
                last = run.last_entry_id == desc.last_entry_id
                try:
                    parts = stamp_parts(builder.add_run(run, last=last))
                except BaseException:
                    done()
                    raise
                upload.submit(parts, done)
            await upload.complete()
        except BaseException:
            await upload.abort()
            raise
        meta = build_ledger_metadata(
            last_entry_id=desc.last_entry_id, length=desc.size, ctime_ms=desc.ctime_ms,
            custom_metadata={"application": b"pulsar", "component": b"managed-ledger",
                             "pulsar/managed-ledger": self.topic.managed_ledger.encode()})
        index = builder.finish(meta)
        imeta = index_metadata(self.topic.managed_ledger, data_length=upload.length,
                               index=index)
        await env.blobstore.put(ledger_index_key(uid, ledger_id, env.key_prefix), [index], imeta)
        done_ms = env.wall_ms()
        await commit.apply(env.metadata, self.topic.managed_ledger,
                           lambda info: catalog.complete_ledger(info, ledger_id, uid, done_ms),
                           self.fence, on_write=self.probe.metadata_write)
        self.segment_state = SegmentState.OFFLOADED
        self.last_committed = Position(ledger_id, desc.last_entry_id)
        self.committed_segments += 1
        self.failed_attempts = 0
        self.last_error = None
        self._committed(done_ms, uid)
        self.probe.segment_committed(desc.entries, upload.length, env.clock() - t0)
        log.info("topic %s: ledger %d offloaded whole as %s (%d bytes)", self.topic, ledger_id,
                 uid, upload.length)

    def _releaser(self, n: int, lease: bytearray | None = None) -> Callable[[], None]:
        """What to run once a run's parts have landed: free its bytes, recycle its array."""
        buf = self.env.buffer

        def done() -> None:
            buf.release(n)
            if lease is not None:
                buf.give_back(lease)

        return done

    async def _delete_objects(self, uid: uuid.UUID, ledger_ids: Sequence[int] = ()) -> None:
        p = self.env.key_prefix
        keys = [streaming_data_key(uid, p), streaming_index_key(uid, p)]
        for lid in ledger_ids:
            keys += [ledger_data_key(uid, lid, p), ledger_index_key(uid, lid, p)]
        for key in keys:
            await self.env.blobstore.delete(key)

    async def _abandon(self) -> None:
        """Discard the open attempt's uncommitted work.

        Its objects are deleted only when the metadata, read *now*, does not record the attempt:
        a commit whose reply was lost may have landed (then the objects are the committed
        segment's), and an ASSIGNED record belongs to recovery, which redoes it and deletes the
        dead attempt's objects itself. When the metadata cannot be read, nothing is deleted
        (``offloadd gc`` sweeps real orphans later).
        """
        att = self._attempt
        if att is None:
            return
        try:
            await att.upload.abort()
            try:
                info, _ = await managed_ledger.load(self.env.metadata,
                                                    self.topic.managed_ledger)
            except OffloaddError as exc:
                log.warning("topic %s: attempt %s abandoned; metadata unreadable (%s), its "
                            "objects are left for offloadd gc", self.topic, att.uid, exc)
                return
            if any(s.uid == att.uid for s in catalog.segments(info)):
                return
            try:
                await self._delete_objects(att.uid)
            except OffloaddError as exc:
                log.warning("topic %s: could not delete objects of abandoned attempt %s: %s "
                            "(offloadd gc removes them)", self.topic, att.uid, exc)
        finally:
            if self._attempt is att:
                self._attempt = None

    async def _on_failure(self, exc: OffloaddError) -> None:
        """A failed attempt: abort it, back off, then redo the same positions."""
        self.failed_attempts += 1
        self.last_error = str(exc)
        if self.status_sink is not None:
            self.status_sink.failed(self.last_error, self.failed_attempts)
        self.probe.offload_error()
        self.probe.write_storage_error()
        att = self._attempt
        self.segment_state = SegmentState.FAILED
        log.error("topic %s: offload attempt failed (%s); retry %d", self.topic, exc,
                  self.failed_attempts)
        await self._abandon()
        if att is not None and att.close_target is not None:
            self._manual.set()  # the retry closes as promptly as the failed attempt meant to
        delay = min(self.env.retry_max_s,
                    self.env.retry_base_s * 2 ** min(self.failed_attempts - 1, 10))
        delay *= 0.5 + random.random() / 2
        if await self._sleep_or_stop(delay) and att is None:
            return
        # Rewind: recovery finds an ASSIGNED record (redo it) or the last committed end.
        await self._recover_with_retry()

    async def _sleep_or_stop(self, delay: float) -> bool:
        try:
            await asyncio.wait_for(self._stop.wait(), delay)
            return True
        except TimeoutError:
            return False

    # ---- reporting -----------------------------------------------------------------------
    def _publish_states(self, segs: Sequence[Segment]) -> None:
        assigned = sum(1 for s in segs if not s.complete)
        offloaded = sum(1 for s in segs if s.complete)
        failed = 1 if self.segment_state is SegmentState.FAILED else 0
        self.committed_segments = offloaded
        self.probe.segment_states(assigned - failed if assigned >= failed else 0, offloaded,
                                  failed)

    def _committed(self, when_ms: int, uid: uuid.UUID) -> None:
        """A segment was committed at ``when_ms``: report it."""
        assert self.last_committed is not None
        self.last_commit_ms = when_ms
        self.probe.last_offloaded(*self.last_committed)
        self.probe.last_commit_time(when_ms / 1000)
        if self.status_sink is not None:
            self.status_sink.succeeded(self.last_committed, str(uid), when_ms)

    def status(self) -> Mapping[str, object]:
        return {
            "state": self.state.value,
            "position": str(self.position) if self.position else None,
            "last_committed": str(self.last_committed) if self.last_committed else None,
            "open_segment_bytes": self._attempt.frame_bytes if self._attempt else 0,
            "failed_attempts": self.failed_attempts,
            "last_error": self.last_error,
            "last_commit_ms": self.last_commit_ms,
            "lag": self.lag.as_dict() if self.lag is not None else None,
        }
