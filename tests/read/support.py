"""Helpers for the read tests: a rig's offloader run until it has committed one segment."""

from __future__ import annotations

import asyncio

from offloadd.model.catalog import Segment
from tests.offload.test_pipeline import Rig, _has_position, stop, until


async def offload_one_segment(rig: Rig, *, timeout: float = 20.0) -> Segment:
    """Run ``rig``'s offloader on what the rig holds, trigger a roll once it has a position, stop
    it once a segment is committed, and return that (only) complete segment."""
    off = rig.offloader()
    task = asyncio.create_task(off.run())

    async def committed() -> bool:
        return any(s.complete for s in await rig.segments())

    await until(lambda: _has_position(off))
    off.trigger()
    await until(committed, timeout=timeout)
    await stop(task, off)
    (seg,) = [s for s in await rig.segments() if s.complete]
    return seg
