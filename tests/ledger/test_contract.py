"""The LedgerSource contract, checked against every implementation, and each optional
capability (``offloadd.ledger.base``) against every implementation that declares it.

Each implementation comes with a *driver*: how a test appends entries and rolls ledgers, since
writing is not part of the protocol. A driver names the capabilities its source offers as typed
attributes; a capability's tests run on the drivers listed for it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Protocol

import crc32c
import pytest

from offloadd.errors import Conflict, NotFound
from offloadd.ledger.base import (
    FRAME_OVERHEAD,
    EntryChecksums,
    FrameOffsets,
    LedgerDeleter,
    LedgerSource,
    LocalCopies,
    SourceMetrics,
    StoredEntries,
)
from offloadd.ledger.local import LocalLedgerSource, LocalLedgerStore
from offloadd.ledger.memory import MemoryLedgerSource
from offloadd.metadata.memory import MemoryMetadataStore
from offloadd.model import LedgerState, Position, TopicName
from tests.bookkeeper.conftest import Cluster, open_cluster
from tests.fixtures.zookeeper import zk_server  # noqa: F401  (fixture, for the BookKeeper driver)
from tests.ledger.support import frames, payload, tail

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
        self.deleter: LedgerDeleter = self.memory

    async def append(self, topic: TopicName, payloads: Sequence[bytes]) -> Position:
        return self.memory.append(topic, payloads)

    async def roll(self, topic: TopicName) -> None:
        self.memory.close_ledger(topic)
        self.memory.open_ledger(topic)


class LocalDriver:
    def __init__(self, path: Path) -> None:
        self.store = LocalLedgerStore(path, MemoryMetadataStore())
        local = self.store.source
        self.source: LedgerSource = local
        self.deleter: LedgerDeleter = local
        self.copies: LocalCopies = local
        self.checksums: EntryChecksums = local
        self.stored: StoredEntries = local
        self.offsets: FrameOffsets = local

    async def append(self, topic: TopicName, payloads: Sequence[bytes]) -> Position:
        return await self.store.writer.append(topic, payloads)

    async def roll(self, topic: TopicName) -> None:
        await self.store.writer.roll(topic)


class BookKeeperDriver:
    """A Pulsar cluster in miniature (tests/bookkeeper/cluster.py): real ZooKeeper, fake bookies.
    An entry is readable once a later one or the ledger's close confirms it, so only the
    capability tests that close their ledgers run here."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        bookkeeper = cluster.source()
        self.source: LedgerSource = bookkeeper
        self.checksums: EntryChecksums = bookkeeper

    async def append(self, topic: TopicName, payloads: Sequence[bytes]) -> Position:
        return await self.cluster.pulsar.append(topic, list(payloads))

    async def roll(self, topic: TopicName) -> None:
        await self.cluster.pulsar.roll(topic)


@contextlib.asynccontextmanager
async def open_driver(kind: str, request: pytest.FixtureRequest,
                      tmp_path: Path) -> AsyncIterator[Driver]:
    if kind == "memory":
        yield MemoryDriver()
    elif kind == "local":
        local = LocalDriver(tmp_path / "ledgers")
        try:
            yield local
        finally:
            await local.store.close()
    else:
        async with open_cluster(request.getfixturevalue("zk_server")) as cluster:
            bookkeeper = BookKeeperDriver(cluster)
            try:
                yield bookkeeper
            finally:
                await bookkeeper.source.close()


@pytest.fixture(params=["memory", "local"])
async def driver(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Driver]:
    async with open_driver(request.param, request, tmp_path) as d:
        yield d


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


# ---- optional capabilities --------------------------------------------------------------------
#
# Which implementation offers which capability is declared by its class (mypy holds the class to
# the protocol); these fixtures give each capability's tests every implementation that offers it.


class Deleting(Driver, Protocol):
    deleter: LedgerDeleter


class Copying(Driver, Protocol):
    copies: LocalCopies


class Checksumming(Driver, Protocol):
    checksums: EntryChecksums


class Counting(Driver, Protocol):
    stored: StoredEntries


class Offsetting(Driver, Protocol):
    offsets: FrameOffsets


@pytest.fixture(params=["memory", "local"])
async def deleting(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Deleting]:
    async with open_driver(request.param, request, tmp_path) as d:
        yield d  # type: ignore[misc]


@pytest.fixture(params=["local"])
async def copying(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Copying]:
    async with open_driver(request.param, request, tmp_path) as d:
        yield d  # type: ignore[misc]


@pytest.fixture(params=["local", pytest.param("bookkeeper", marks=pytest.mark.integration)])
async def checksumming(request: pytest.FixtureRequest,
                       tmp_path: Path) -> AsyncIterator[Checksumming]:
    async with open_driver(request.param, request, tmp_path) as d:
        yield d  # type: ignore[misc]


@pytest.fixture(params=["local"])
async def counting(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Counting]:
    async with open_driver(request.param, request, tmp_path) as d:
        yield d  # type: ignore[misc]


@pytest.fixture(params=["local"])
async def offsetting(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Offsetting]:
    async with open_driver(request.param, request, tmp_path) as d:
        yield d  # type: ignore[misc]


@pytest.mark.parametrize(("implementation", "declared"), [
    (LocalLedgerSource, {LedgerDeleter, LocalCopies, EntryChecksums, StoredEntries, FrameOffsets}),
    (MemoryLedgerSource, {LedgerDeleter}),
])
def test_each_implementation_declares_its_capabilities(
        implementation: type, declared: set[type]) -> None:
    """The capabilities an implementation offers are in its class's bases, so mypy checks them
    and the wiring can hand them out typed; it declares none it does not offer."""
    capabilities = {LedgerDeleter, LocalCopies, EntryChecksums, StoredEntries, FrameOffsets,
                    SourceMetrics}
    assert capabilities & set(implementation.__mro__) == declared


async def two_ledgers(d: Driver, first: Sequence[bytes], second: Sequence[bytes]) -> list[int]:
    """Append ``first``, roll, append ``second``, roll: two closed ledgers."""
    a = await d.append(TOPIC, first)
    await d.roll(TOPIC)
    b = await d.append(TOPIC, second)
    await d.roll(TOPIC)
    return [a.ledger_id, b.ledger_id]


class TestLedgerDeleter:
    """A source that applies retention drops closed ledgers, and only those of the topic named."""

    async def test_a_deleted_ledger_is_no_longer_listed_or_readable(
            self, deleting: Deleting) -> None:
        first, second = await two_ledgers(deleting, [b"a", b"b"], [b"c"])
        await deleting.deleter.delete_ledger(TOPIC, first)
        assert [d.ledger_id for d in await deleting.source.ledgers(TOPIC)][:1] == [second]
        with pytest.raises(NotFound):
            await deleting.source.read(TOPIC, first, 0, 1)
        assert frames(await deleting.source.read(TOPIC, second, 0, 0)) == [b"c"]

    async def test_an_open_ledger_is_not_deleted(self, deleting: Deleting) -> None:
        pos = await deleting.append(TOPIC, [b"live"])
        with pytest.raises(Conflict):
            await deleting.deleter.delete_ledger(TOPIC, pos.ledger_id)
        assert frames(await deleting.source.read(TOPIC, pos.ledger_id, 0, 0)) == [b"live"]

    async def test_another_topics_ledger_is_not_found_and_left_alone(
            self, deleting: Deleting) -> None:
        first, _ = await two_ledgers(deleting, [b"mine"], [b"x"])
        other = TopicName.parse("persistent://public/default/other")
        await deleting.append(other, [b"y"])
        with pytest.raises(NotFound):
            await deleting.deleter.delete_ledger(other, first)
        assert frames(await deleting.source.read(TOPIC, first, 0, 0)) == [b"mine"]


class TestLocalCopies:
    """Dropping a ledger's local copy removes its data but not its place in the topic."""

    async def test_the_data_goes_the_ledger_stays_listed(self, copying: Copying) -> None:
        first, second = await two_ledgers(copying, [b"a", b"bb"], [b"c"])
        assert await copying.copies.drop_local_copy(first) is True
        descs = await copying.source.ledgers(TOPIC)
        assert [(d.ledger_id, d.last_entry_id, d.size) for d in descs[:2]] == [
            (first, 1, 3), (second, 0, 1)]
        with pytest.raises(NotFound):
            await copying.source.read(TOPIC, first, 0, 0)
        assert frames(await copying.source.read(TOPIC, second, 0, 0)) == [b"c"]

    async def test_dropping_again_or_an_unknown_ledger_is_a_no_op(self, copying: Copying) -> None:
        first, _ = await two_ledgers(copying, [b"a"], [b"b"])
        assert await copying.copies.drop_local_copy(first) is True
        assert await copying.copies.drop_local_copy(first) is False
        assert await copying.copies.drop_local_copy(first + 1000) is False


class TestEntryChecksums:
    """The stored CRC32C of every payload, exactly for the entries asked, all readable."""

    async def test_checksums_match_the_payloads(self, checksumming: Checksumming) -> None:
        payloads = [payload(i) for i in range(40)]
        first, _ = await two_ledgers(checksumming, payloads, [b"next"])
        got = await checksumming.checksums.read_crcs(first, 5, 39)
        assert list(got) == [crc32c.crc32c(p) for p in payloads[5:]]
        assert list(await checksumming.checksums.read_crcs(first, 0, 0)) == [
            crc32c.crc32c(payloads[0])]

    async def test_entries_past_the_readable_ones_are_not_found(
            self, checksumming: Checksumming) -> None:
        first, _ = await two_ledgers(checksumming, [b"a", b"b"], [b"c"])
        with pytest.raises(NotFound):
            await checksumming.checksums.read_crcs(first, 0, 2)
        with pytest.raises(NotFound):
            await checksumming.checksums.read_crcs(first + 1000, 0, 0)


class TestStoredEntries:
    """What the source's own storage holds, whatever the metadata says."""

    async def test_counts_the_entries_written(self, counting: Counting) -> None:
        first, second = await two_ledgers(counting, [b"a"] * 7, [b"b"] * 3)
        assert await counting.stored.stored_entries(first) == 7
        assert await counting.stored.stored_entries(second) == 3

    async def test_a_ledger_without_data_counts_as_none(self, counting: Counting) -> None:
        first, _ = await two_ledgers(counting, [b"a"], [b"b"])
        assert await counting.stored.stored_entries(first + 1000) is None


class TestFrameOffsets:
    """Where each entry's frame starts, without reading the entries (blocking: a thread)."""

    async def test_cumulative_bytes_are_the_frames_before_the_entry(
            self, offsetting: Offsetting) -> None:
        payloads = [payload(i) for i in range(30)]
        first, _ = await two_ledgers(offsetting, payloads, [b"next"])
        for entry in (0, 1, 17, 29, 30):  # 30: the end of the last frame
            want = sum(len(p) + FRAME_OVERHEAD for p in payloads[:entry])
            assert await asyncio.to_thread(
                offsetting.offsets.cumulative_bytes, first, entry) == want

    async def test_past_the_end_or_a_missing_ledger_is_not_found(
            self, offsetting: Offsetting) -> None:
        first, _ = await two_ledgers(offsetting, [b"a"], [b"b"])
        for ledger, entry in ((first, 2), (first + 1000, 0)):
            with pytest.raises(NotFound):
                await asyncio.to_thread(offsetting.offsets.cumulative_bytes, ledger, entry)
