"""The run reader: the buffer's bytes are taken before a read and held until the run's parts
have landed, whatever the read returns or raises."""

from __future__ import annotations

import asyncio

import pytest

from offloadd.errors import NotFound
from offloadd.ledger.memory import MemoryLedgerSource
from offloadd.model import TopicName
from offloadd.model.catalog import LedgerRange
from offloadd.offload.buffer import OffloadBuffer
from offloadd.offload.runs import RunReader

pytestmark = pytest.mark.timeout(30)

TOPIC = TopicName.parse("persistent://public/default/runs")
FRAME = 12 + 100  # one 100-byte entry, framed


def source(entries: int, size: int = 100) -> MemoryLedgerSource:
    src = MemoryLedgerSource()
    src.append(TOPIC, [bytes([i % 256]) * size for i in range(entries)])
    src.close_ledger(TOPIC)
    return src


class TestRunReader:
    """Runs are block-sized and hold exactly their bytes until released."""

    async def test_a_run_holds_what_it_read_until_released(self) -> None:
        buf = OffloadBuffer(10_000)
        reader = RunReader(source(10), buf, TOPIC)
        run = await reader.read(0, 0, 9, budget=3 * FRAME + 50)
        assert (run.entries.first_entry_id, run.entries.count) == (0, 3)
        assert buf.used == 3 * FRAME  # what the run does not use goes back at once
        run.release()
        assert buf.used == 0

    async def test_an_oversize_entry_is_held_whole(self) -> None:
        buf = OffloadBuffer(10_000)
        reader = RunReader(source(2, size=1_000), buf, TOPIC)
        run = await reader.read(0, 0, 1, budget=100)  # one entry is past the budget
        assert run.entries.count == 1 and buf.used == 1_012
        run.release()
        assert buf.used == 0

    async def test_a_failed_read_gives_its_reservation_back(self) -> None:
        buf = OffloadBuffer(10_000)
        reader = RunReader(source(3), buf, TOPIC)
        with pytest.raises(NotFound):
            await reader.read(0, 0, 99, budget=1_000)  # past the readable entries
        assert buf.used == 0

    async def test_nothing_is_read_while_the_buffer_is_full(self) -> None:
        buf = OffloadBuffer(2 * FRAME)
        reader = RunReader(source(10), buf, TOPIC)
        first = await reader.read(0, 0, 9, budget=2 * FRAME)
        second = asyncio.create_task(reader.read(0, 2, 9, budget=2 * FRAME))
        await asyncio.sleep(0)  # let it try: it waits for room, having read nothing
        assert not second.done() and buf.used == 2 * FRAME
        first.release()
        run = await asyncio.wait_for(second, 5)
        assert run.entries.first_entry_id == 2
        run.release()

    async def test_a_range_comes_as_consecutive_runs(self) -> None:
        buf = OffloadBuffer(10_000)
        reader = RunReader(source(10), buf, TOPIC)
        seen: list[tuple[int, int]] = []
        before = 0

        async def count() -> None:
            nonlocal before
            before += 1

        async for run in reader.runs(LedgerRange(0, 2, 8), 2 * FRAME, count):
            seen.append((run.entries.first_entry_id, run.entries.last_entry_id))
            run.release()
        assert seen == [(2, 3), (4, 5), (6, 7), (8, 8)] and before == 4
        assert buf.used == 0
