"""Streaming mode (PIP-76): segments that roll by size or time, independently of ledgers.

Each turn the roller decides (:func:`offloadd.offload.roller.decide`) and this module acts::

    READ  ─▶ a block's worth into the buffer (RunReader) ─▶ opens the segment's attempt on the
             first run ─▶ its parts upload while the next run is read
    CLOSE ─▶ ASSIGN (the range is fixed now) ─▶ seal: complete data, write index ─▶ OFFLOADED
    WAIT  ─▶ until entries arrive, a trigger, or the segment's age is up

A segment is recorded ASSIGNED (with its full range) when it closes, just before its data object
is completed; a crash before that leaves only an incomplete upload (``offloadd gc`` sweeps it)
and the same positions go into a new segment; a crash after it leaves an ASSIGNED segment that
recovery redoes over exactly those positions (:meth:`StreamingMode.upload_ranges`).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence

from offloadd._proto import mldataformats_pb2 as pb
from offloadd.aio import to_the_end
from offloadd.errors import NotFound, OffloaddError, Retriable
from offloadd.model import LedgerDesc, Position, catalog
from offloadd.model.catalog import LedgerRange
from offloadd.model.segment_state import Tracked
from offloadd.offload import roller
from offloadd.offload.attempt import SegmentAttempt, delete_attempt, open_streaming
from offloadd.offload.context import TopicContext
from offloadd.offload.roller import Action, Decision, OpenSegment
from offloadd.retry import Backoff, Retry

__all__ = ["StreamingMode"]

log = logging.getLogger(__name__)

# An abandon's "is this attempt recorded?" read, retried through a metadata reconnect (a new
# ZooKeeper session is up within milliseconds of the old one's expiry) but not much longer: a
# shutdown waits for abandons, and what is left after this is offloadd gc's.
ABANDON_READ = Backoff(base_s=0.05, cap_s=1.0)
ABANDON_READ_FOR_S = 5.0


class StreamingMode:
    # one per topic: 10,000 of them (issue 22), no instance dict
    __slots__ = ("bytes_before", "ctx", "pending_since")

    def __init__(self, ctx: TopicContext) -> None:
        self.ctx = ctx
        self.pending_since: float | None = None  # unread entries seen, no segment open yet
        self.bytes_before: dict[int, int] = {}  # ledger -> payload bytes before our position

    def open_segment(self) -> OpenSegment | None:
        att = self.ctx.attempt
        if att is None:
            return None
        return OpenSegment(att.frame_bytes, att.opened_at, att.end, att.close_target)

    async def act(self, d: Decision, pos: Position | None, desc: LedgerDesc | None) -> bool:
        """Carry out the roller's decision; True when the task is finished (stopped)."""
        ctx = self.ctx
        if d.action is Action.READ:
            assert pos is not None
            assert desc is not None
            await self._read(desc, pos, d.entries)
        elif d.action is Action.CLOSE:
            assert ctx.attempt is not None
            await self.close(ctx.attempt)
        elif d.action is Action.STOP:
            return True
        else:
            await ctx.wait(pos, d.wait_s, desc)
        return False

    async def _read(self, desc: LedgerDesc, pos: Position, avail: int) -> None:
        ctx = self.ctx
        pol = ctx.policy().roll
        att = ctx.attempt
        if att is not None:
            await att.wait_for_room()
        budget = roller.read_budget(pol, att.frame_bytes if att else 0)
        # the phase lines at DEBUG let the crash tests tell where a kill -9 landed
        log.debug("topic %s: building a block from %s", ctx.topic, pos)
        run = await ctx.reader.read(desc.ledger_id, pos.entry_id, pos.entry_id + avail - 1,
                                    budget)
        entries = run.entries
        ctx.probe.ledger_reading_max_bytes(len(entries.data))
        try:
            if att is None:
                att = await self._open()
        except BaseException:
            run.release()
            raise
        parts = att.feed(run, desc.ctime_ms)
        log.debug("segment %s: %d part(s) uploading", att.uid, parts)
        # what we know of the ledger's byte count before the new position
        if entries.last_entry_id == desc.last_entry_id:
            self.bytes_before[desc.ledger_id] = desc.size
        elif desc.ledger_id in self.bytes_before:
            self.bytes_before[desc.ledger_id] += entries.payload_bytes
        ctx.position = Position(desc.ledger_id, entries.last_entry_id + 1)

    async def _open(self, redo_of: uuid.UUID | None = None,
                    segment: Tracked | None = None) -> SegmentAttempt:
        ctx = self.ctx
        pol = ctx.policy().roll
        opened = self.pending_since if self.pending_since is not None else ctx.env.clock()
        att = await open_streaming(ctx.uploads, max_block_size=pol.max_block_size,
                                   min_block_size=pol.min_block_size, redo_of=redo_of,
                                   opened_at=opened)
        log.debug("segment %s: multipart upload started", att.uid)
        self.pending_since = None
        ctx.attempt = att
        ctx.segment = segment or Tracked()
        return att

    async def close(self, att: SegmentAttempt) -> None:
        """ASSIGN (range fixed) → drain parts → complete data → index → commit OFFLOADED."""
        ctx = self.ctx
        t0 = ctx.env.clock()
        ranges = tuple(att.ranges)
        driver = ctx.driver()
        now_ms = ctx.env.wall_ms()
        redo_of = att.redo_of

        def assign(info: pb.ManagedLedgerInfo) -> bool:
            if redo_of is not None:  # a redo covers exactly the recorded positions
                return catalog.reassign(info, redo_of, att.uid, now_ms)
            return catalog.add_assigned(info, att.uid, ranges, now_ms, driver)

        segment = ctx.segment or Tracked()
        log.debug("segment %s: assigning %s..%s", att.uid, ranges[0].ledger_id, att.end)
        await ctx.assign(assign, segment)
        att.redo_of = att.uid  # from here on, a retry replaces this record
        log.debug("segment %s: assigned; draining parts, then the index", att.uid)
        await att.seal()
        log.debug("segment %s: index written; committing", att.uid)
        done_ms = ctx.env.wall_ms()
        end = Position(ranges[-1].ledger_id, ranges[-1].last)
        info = await ctx.offloaded(lambda info: catalog.mark_offloaded(
                                       info, att.uid, done_ms, [r.ledger_id for r in ranges],
                                       att.usage),
                                   segment, att.uid, end, att.entries, att.length, t0, done_ms)
        ctx.attempt = None
        log.info("topic %s: segment %s offloaded: %s..%s (%d ledgers, %d bytes)", ctx.topic,
                 att.uid, ranges[0].ledger_id, end, len(ranges), att.length)
        # the catalog as the commit stored it: no second read per segment
        ctx.publish_states(catalog.segments(info))

    async def upload_ranges(self, ranges: Sequence[LedgerRange], redo_of: uuid.UUID | None,
                            segment: Tracked | None = None) -> None:
        """One streaming segment over exactly ``ranges`` (all readable now), committed."""
        ctx = self.ctx
        att = await self._open(redo_of=redo_of, segment=segment)
        stamps = {d.ledger_id: d.ctime_ms for d in await ctx.ledgers()}
        budget = ctx.policy().roll.block_budget
        for r in ranges:
            if r.ledger_id not in stamps:
                raise NotFound(f"topic {ctx.topic}: ledger {r.ledger_id} is gone from the "
                               f"source; cannot offload {r.ledger_id}:{r.first}..{r.last}")
            async for run in ctx.reader.runs(r, budget, att.wait_for_room):
                parts = att.feed(run, stamps[r.ledger_id])
                log.debug("segment %s: %d part(s) uploading", att.uid, parts)
        await self.close(att)

    async def abandon(self) -> None:
        """Discard the open attempt's uncommitted work.

        Its objects are deleted only when the metadata, read *now*, does not record the attempt:
        a commit whose reply was lost may have landed (then the objects are the committed
        segment's), and an ASSIGNED record belongs to recovery, which redoes it and deletes the
        dead attempt's objects itself. A transient read failure is retried for a few seconds:
        the commonest abandon is a stalled owner waking to find its metadata session expired,
        and the read that decides fails until the new session is up, milliseconds later
        (leaving the objects then made every such wake-up an orphan pair). When the metadata
        stays unreadable, nothing is deleted (``offloadd gc`` sweeps real orphans later).
        """
        ctx = self.ctx
        att = ctx.attempt
        if att is None:
            return
        # A cancellation (ownership lost, then perhaps shutdown) often arrives while a failed
        # attempt is being abandoned: the clean-up runs to its end regardless (it is bounded:
        # ABANDON_READ_FOR_S, the store's request deadlines), or a sealed pair would be left
        # behind with no word in the log.
        try:
            await to_the_end(self.discard(att.uid, abort=att.abort))
        finally:
            if ctx.attempt is att:
                ctx.attempt = None

    async def discard(self, uid: uuid.UUID, ledger_ids: Sequence[int] = (), *,
                      abort: Callable[[], Awaitable[None]] | None = None) -> None:
        """Delete what attempt ``uid`` wrote unless the metadata, read now, records it (see
        :meth:`abandon`); ``abort`` first discards its upload in progress."""
        ctx = self.ctx
        if abort is not None:
            await abort()
        try:
            info = await self._load_for_abandon()
        except OffloaddError as exc:
            log.warning("topic %s: attempt %s abandoned; metadata unreadable (%s), its "
                        "objects are left for offloadd gc", ctx.topic, uid, exc)
            return
        if info is not None and any(s.uid == uid for s in catalog.segments(info)):
            return
        try:
            await delete_attempt(ctx.env.blobstore, uid, ledger_ids)
        except OffloaddError as exc:
            log.warning("topic %s: could not delete objects of abandoned attempt %s: %s "
                        "(offloadd gc removes them)", ctx.topic, uid, exc)

    async def _load_for_abandon(self) -> pb.ManagedLedgerInfo | None:
        """The topic's metadata as it is now (None: the topic has none, so it records nothing),
        retrying transient failures for up to ``ABANDON_READ_FOR_S``."""
        ctx = self.ctx
        retry = Retry(ABANDON_READ)
        give_up = ctx.env.clock() + ABANDON_READ_FOR_S
        while True:
            try:
                return await ctx.load()
            except NotFound:
                return None
            except Retriable as exc:
                delay = retry.next_delay()
                if ctx.env.clock() + delay > give_up:
                    raise
                log.debug("topic %s: metadata unreadable while abandoning (%s); retry in "
                          "%.2fs", ctx.topic, exc, delay)
                await asyncio.sleep(delay)
