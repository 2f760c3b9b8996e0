"""The LedgerSource contract, checked against every implementation.

Each implementation comes with a *driver*: how a test appends entries and rolls ledgers, since
writing is not part of the protocol.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Protocol

import pytest

from offloadd.errors import NotFound
from offloadd.ledger.base import LedgerSource
from offloadd.ledger.local import LocalLedgerStore
from offloadd.ledger.memory import MemoryLedgerSource
from offloadd.metadata.memory import MemoryMetadataStore
from offloadd.model import FRAME_OVERHEAD, LedgerState, Position, TopicName
from tests.ledger.support import frames, tail

pytestmark = pytest.mark.timeout(30)

TOPIC = TopicName.parse("persistent://public/default/orders")


class Driver(Protocol):
    source: LedgerSource

    async def append(self, topic: TopicName, payloads: Sequence[bytes]) -> Position: ...

    async def roll(self, topic: TopicName) -> None: ...


class MemoryDriver:
    def __init__(self) -> None:
        self.memory = MemoryLedgerSource()
        self.source: LedgerSource = self.memory

    async def append(self, topic: TopicName, payloads: Sequence[bytes]) -> Position:
        return self.memory.append(topic, payloads)

    async def roll(self, topic: TopicName) -> None:
        self.memory.close_ledger(topic)
        self.memory.open_ledger(topic)


class LocalDriver:
    def __init__(self, path: Path) -> None:
        self.store = LocalLedgerStore(path, MemoryMetadataStore())
        self.source: LedgerSource = self.store.source

    async def append(self, topic: TopicName, payloads: Sequence[bytes]) -> Position:
        return await self.store.writer.append(topic, payloads)

    async def roll(self, topic: TopicName) -> None:
        await self.store.writer.roll(topic)


@pytest.fixture(params=["memory", "local"])
async def driver(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Driver]:
    if request.param == "memory":
        yield MemoryDriver()
        return
    local = LocalDriver(tmp_path / "ledgers")
    yield local
    await local.store.close()


class TestProtocol:
    """Both implementations satisfy the runtime-checkable protocol."""

    async def test_driver_source_is_a_ledger_source(self, driver: Driver) -> None:
        assert isinstance(driver.source, LedgerSource)


class TestLedgers:
    """Topics list their ledgers in log order with readable counts and sizes."""

    async def test_ledgers_report_entries_and_payload_sizes(self, driver: Driver) -> None:
        await driver.append(TOPIC, [b"a", b"bb"])
        await driver.roll(TOPIC)
        await driver.append(TOPIC, [b"ccc"])
        descs = await driver.source.ledgers(TOPIC)
        assert [(d.state, d.last_entry_id, d.size) for d in descs] == [
            (LedgerState.CLOSED, 1, 3), (LedgerState.OPEN, 0, 3)]
        assert descs[0].ledger_id < descs[1].ledger_id
        assert await driver.source.list_topics() == [TOPIC]

    async def test_unknown_topic_is_not_found_and_named(self, driver: Driver) -> None:
        other = TopicName.parse("persistent://public/default/nope")
        with pytest.raises(NotFound, match="nope"):
            await driver.source.ledgers(other)


class TestRead:
    """Reads hand out framed runs, honour max_bytes and refuse what is not readable."""

    async def test_read_returns_framed_entries_in_order(self, driver: Driver) -> None:
        payloads = [bytes([i]) * i for i in range(20)]
        pos = await driver.append(TOPIC, payloads)
        run = await driver.source.read(TOPIC, pos.ledger_id, 3, 19)
        assert frames(run) == payloads[3:]
        assert run.payload_bytes == sum(map(len, payloads[3:]))

    async def test_max_bytes_stops_before_the_entry_that_would_not_fit(
            self, driver: Driver) -> None:
        pos = await driver.append(TOPIC, [b"x" * 100] * 10)
        run = await driver.source.read(TOPIC, pos.ledger_id, 0, 9, max_bytes=3 * 112 + 111)
        assert run.count == 3
        assert len(run.data) == 3 * (100 + FRAME_OVERHEAD)

    async def test_max_bytes_below_one_entry_still_returns_the_first(
            self, driver: Driver) -> None:
        pos = await driver.append(TOPIC, [b"x" * 100] * 3)
        run = await driver.source.read(TOPIC, pos.ledger_id, 1, 2, max_bytes=10)
        assert (run.first_entry_id, run.count) == (1, 1)

    async def test_reading_past_the_last_entry_is_not_found(self, driver: Driver) -> None:
        pos = await driver.append(TOPIC, [b"a", b"b"])
        with pytest.raises(NotFound):
            await driver.source.read(TOPIC, pos.ledger_id, 0, 2)

    async def test_reading_a_missing_ledger_is_not_found(self, driver: Driver) -> None:
        pos = await driver.append(TOPIC, [b"a"])
        with pytest.raises(NotFound):
            await driver.source.read(TOPIC, pos.ledger_id + 1000, 0, 0)


class TestWait:
    """wait_for_entries returns when the topic moves past the known position."""

    async def test_wait_returns_at_once_when_entries_are_already_there(
            self, driver: Driver) -> None:
        pos = await driver.append(TOPIC, [b"a", b"b"])
        await asyncio.wait_for(driver.source.wait_for_entries(TOPIC, pos.ledger_id, 0, 30), 5)

    async def test_wait_wakes_on_append(self, driver: Driver) -> None:
        pos = await driver.append(TOPIC, [b"a"])
        waiter = asyncio.create_task(
            driver.source.wait_for_entries(TOPIC, pos.ledger_id, pos.entry_id, 30))
        await asyncio.sleep(0.05)
        assert not waiter.done()
        await driver.append(TOPIC, [b"b"])
        await asyncio.wait_for(waiter, 5)

    async def test_wait_wakes_on_a_new_ledger(self, driver: Driver) -> None:
        pos = await driver.append(TOPIC, [b"a"])
        waiter = asyncio.create_task(
            driver.source.wait_for_entries(TOPIC, pos.ledger_id, pos.entry_id, 30))
        await asyncio.sleep(0.05)
        await driver.roll(TOPIC)
        await asyncio.wait_for(waiter, 5)

    async def test_tail_follows_appends_across_ledgers(self, driver: Driver) -> None:
        async def produce() -> None:
            for i in range(30):
                await driver.append(TOPIC, [i.to_bytes(2, "big")] * (i % 3 + 1))
                if i % 7 == 6:
                    await driver.roll(TOPIC)
                await asyncio.sleep(0)

        expected = [i.to_bytes(2, "big") for i in range(30) for _ in range(i % 3 + 1)]
        consumer = asyncio.create_task(tail(driver.source, TOPIC, len(expected)))
        await produce()
        got = await asyncio.wait_for(consumer, 10)
        assert [p for _, p in got] == expected
        assert [pos for pos, _ in got] == sorted(pos for pos, _ in got)
