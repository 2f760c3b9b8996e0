"""Ledger-based mode (PIP-17): each closed ledger offloaded whole, as Pulsar's offloader does::

    ledger closed ─▶ ASSIGN (the ledger's offload context, complete = false) ─▶ data object,
        one part per block, the last block exact ─▶ index ─▶ OFFLOADED (complete = true)

Switching from streaming completes the open streaming segment first, and a ledger streaming had
started is finished as one streaming segment (the rest of it), so no entry is offloaded twice.
"""

from __future__ import annotations

import logging

from offloadd.aio import to_the_end
from offloadd.errors import NotFound
from offloadd.model import LedgerDesc, LedgerState, Position, catalog
from offloadd.model.catalog import LedgerRange
from offloadd.model.ids import random_uuid
from offloadd.model.segment_state import Tracked
from offloadd.offload.attempt import open_ledger
from offloadd.offload.context import TopicContext
from offloadd.offload.streaming import StreamingMode

__all__ = ["LedgerMode"]

log = logging.getLogger(__name__)


class LedgerMode:
    # one per topic: 10,000 of them (issue 22), no instance dict
    __slots__ = ("ctx", "streaming")

    def __init__(self, ctx: TopicContext, streaming: StreamingMode) -> None:
        self.ctx = ctx
        self.streaming = streaming

    async def step(self, pos: Position | None, desc: LedgerDesc | None) -> None:
        ctx = self.ctx
        att = ctx.attempt
        if att is not None:  # the streaming segment open when the mode changed
            if att.close_target is None:
                att.close_target = att.end
            await self.streaming.close(att)
            return
        if pos is None or desc is None or desc.state is not LedgerState.CLOSED \
                or pos.entry_id > desc.last_entry_id:
            await ctx.wait(pos, ctx.idle_poll_s(ctx.policy()))
            return
        if pos.entry_id > 0:
            await self.streaming.upload_ranges(
                [LedgerRange(desc.ledger_id, pos.entry_id, desc.last_entry_id)], redo_of=None)
        else:
            await self.offload(desc.ledger_id)
        ctx.position = Position(desc.ledger_id, desc.last_entry_id + 1)

    async def offload(self, ledger_id: int, segment: Tracked | None = None) -> None:
        """ASSIGN → data object (one part per block, exact last block) → index → OFFLOADED.
        ``segment``: the state of the segment this redoes (a new one when None)."""
        ctx = self.ctx
        env = ctx.env
        descs = {d.ledger_id: d for d in await ctx.ledgers()}
        desc = descs.get(ledger_id)
        if desc is None or desc.state is not LedgerState.CLOSED:
            raise NotFound(f"topic {ctx.topic}: ledger {ledger_id} is not a closed ledger of "
                           "the source")
        uid = random_uuid()
        t0 = env.clock()
        driver = ctx.driver()
        segment = segment or Tracked()
        await ctx.assign(lambda info: catalog.assign_ledger(info, ledger_id, uid, env.wall_ms(),
                                                            driver), segment)
        att = await open_ledger(ctx.uploads, desc, uid,
                                max_block_size=ctx.policy().roll.max_block_size, opened_at=t0)
        try:
            async for run in ctx.reader.runs(LedgerRange(ledger_id, 0, desc.last_entry_id),
                                             ctx.policy().roll.block_budget,
                                             att.wait_for_room):
                att.feed(run, desc.ctime_ms)
            await att.seal()
        except BaseException:
            await att.abort()
            raise
        done_ms = env.wall_ms()
        try:
            await ctx.offloaded(lambda info: catalog.complete_ledger(info, ledger_id, uid,
                                                                     done_ms, att.usage),
                                segment, uid, Position(ledger_id, desc.last_entry_id),
                                desc.entries, att.length, t0, done_ms)
        except BaseException:
            # a stalled owner's pair, sealed after the new owner redid its ASSIGNED record
            await to_the_end(self.streaming.discard(uid, [ledger_id]))
            raise
        log.info("topic %s: ledger %d offloaded whole as %s (%d bytes)", ctx.topic, ledger_id,
                 uid, att.length)
