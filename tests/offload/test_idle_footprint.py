"""What an idle topic holds (issue 22, "memory follows data"): its own task and nothing else
running, and the wait in it still cut short by a trigger and by a stop."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from offloadd.ledger.local import RolloverPolicy
from offloadd.model import Position
from offloadd.offload.roller import RollPolicy
from tests.offload.test_pipeline import KiB, Rig, committed_entries, until

pytestmark = pytest.mark.timeout(60)


async def test_an_idle_topic_is_one_task_and_its_wait_is_cut_short(tmp_path: Path) -> None:
    rig = Rig(tmp_path, RolloverPolicy(max_entries=100), RollPolicy(1 << 20, 600, 4 * KiB))
    await rig.write(5)
    off = rig.offloader()
    before = asyncio.all_tasks()
    task = asyncio.create_task(off.run())

    async def read_all() -> bool:
        return off.position is not None and off.position >= Position(0, 5) \
            and off.attempt is not None

    await until(read_all)
    for _ in range(20):  # let the topic settle into its wait
        await asyncio.sleep(0.01)
    # the source's wait runs in the topic's task: no task of its own, none for a wake-up
    assert asyncio.all_tasks() - before == {task}
    off.trigger()  # cuts the wait short: the open segment (age limit 600 s) commits now

    async def committed() -> bool:
        return await committed_entries(rig) == 5

    await until(committed)
    assert not task.done()
    off.request_stop()
    await asyncio.wait_for(task, 10)
    assert not task.cancelled()
