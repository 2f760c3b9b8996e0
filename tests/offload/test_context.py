"""Every state change goes through the state machine before it is written."""

from __future__ import annotations

import pytest

from offloadd.blobstore.memory import MemoryBlobStore
from offloadd.commit.fence import NoFence
from offloadd.ledger.memory import MemoryLedgerSource
from offloadd.metadata.memory import MemoryMetadataStore
from offloadd.model import TopicName
from offloadd.model.segment_state import IllegalTransition, SegmentState, Tracked
from offloadd.offload.buffer import OffloadBuffer
from offloadd.offload.context import OffloadEnv, TopicContext, TopicPolicy
from offloadd.offload.probes import NullProbe
from offloadd.offload.roller import RollPolicy

TOPIC = TopicName.parse("persistent://public/default/ctx")


class TestCommitSteps:
    """An illegal change is refused before anything is written."""

    async def test_an_offloaded_segment_cannot_be_assigned_again(self) -> None:
        md = MemoryMetadataStore()
        env = OffloadEnv(MemoryLedgerSource(), md, MemoryBlobStore(), OffloadBuffer(1 << 20))
        ctx = TopicContext(TOPIC, env, lambda: TopicPolicy(RollPolicy(1 << 20, 60, 1 << 16)),
                           NoFence(), NullProbe(), None)
        edits: list[str] = []

        def edit(info: object) -> bool:
            edits.append("written")
            return True

        done = Tracked(SegmentState.OFFLOADED)
        with pytest.raises(IllegalTransition):
            await ctx.assign(edit, done)
        assert edits == [] and done.state is SegmentState.OFFLOADED
        assert not await md.exists(f"/managed-ledgers/{TOPIC.managed_ledger}")
