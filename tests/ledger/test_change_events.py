"""The follower of ``__change_events`` (:mod:`offloadd.ledger.change_events`) over the memory
source: it reads the namespace's system topic to its end before a topic starts, follows it across
ledgers, decodes with the registry's schema version each message names, tells the daemon of a
change, skips (naming its position) a message that does not decode, and waits for a namespace
whose system topic does not exist yet."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest

from offloadd._proto import pulsar_api_pb2 as pb
from offloadd.errors import NotFound
from offloadd.format import avro
from offloadd.format.message import encode_batch, encode_entry
from offloadd.format.schema_storage import (
    IndexEntry,
    SchemaEntry,
    SchemaLocator,
    version_bytes,
)
from offloadd.ledger import change_events
from offloadd.ledger.change_events import ChangeEvents, RegistrySchemas, read_table
from offloadd.ledger.memory import MemoryLedgerSource
from offloadd.metadata.base import Versioned
from offloadd.metadata.pulsar_policies import PulsarOffloadPolicy
from offloadd.metadata.topic_policies import offload_policies_datum
from offloadd.model import TopicName
from tests.fixtures.pulsar_events import BROKER_SCHEMA, event_entry, schema_info

pytestmark = pytest.mark.timeout(60)

NS = "public/default"
EVENTS = TopicName.parse("persistent://public/default/__change_events")
HOT = TopicName.parse("persistent://public/default/hot")
PART = TopicName.parse("persistent://public/default/hot-partition-2")
OTHER = TopicName.parse("persistent://public/default/other")


class Registry:
    """Pulsar's schema registry for ``__change_events``: the locator node, entries by position."""

    def __init__(self) -> None:
        info = schema_info(NS)
        e = IndexEntry(0, 900, 0, info.hash())
        self.nodes = {"/schemas/public/default/__change_events":
                      Versioned(SchemaLocator(e, (e,)).encode(), 0)}
        self.entries = {(900, 0): SchemaEntry(info.encode(), (e,)).encode()}
        self.reads = 0

    async def get(self, path: str) -> Versioned:
        try:
            return self.nodes[path]
        except KeyError:
            raise NotFound(path) from None

    async def read(self, topic: TopicName, ledger_id: int, entry_id: int) -> bytes:
        self.reads += 1
        return self.entries[(ledger_id, entry_id)]


async def until(pred: Callable[[], Any], what: str) -> None:
    try:
        async with asyncio.timeout(20):
            while not pred():
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def test_follows_the_system_topic_and_tells_of_changes(
        caplog: pytest.LogCaptureFixture) -> None:
    src = MemoryLedgerSource()
    reg = Registry()
    src.open_ledger(EVENTS)
    src.append(EVENTS, [event_entry(HOT, PulsarOffloadPolicy(threshold_bytes=7))])
    changed: list[str] = []
    follower = ChangeEvents(src, RegistrySchemas(reg.get, reg.read), changed.append)
    try:
        await follower.prepare(NS)  # read to the end before the topic starts
        level = follower.get(HOT)
        assert level is not None and level.policy.threshold_bytes == 7
        assert level.scope == "local" and follower.get(PART) == level
        assert follower.get(OTHER) is None
        for _ in range(100):
            follower.get(HOT)  # no I/O: the schema was read once
        assert reg.reads == 1

        # a new ledger, a global policy for another topic, a value no schema decodes
        src.close_ledger(EVENTS)
        src.open_ledger(EVENTS)
        bad = bytearray(event_entry(OTHER, PulsarOffloadPolicy(threshold_bytes=1)))
        bad[-1] ^= 0xFF  # the CRC32C catches it
        with caplog.at_level(logging.WARNING):
            src.append(EVENTS, [bytes(bad), event_entry(
                OTHER, PulsarOffloadPolicy(threshold_seconds=60), is_global=True, seq=1)])
            await until(lambda: follower.get(OTHER) is not None, "the global policy")
        assert f"{EVENTS} 1:0" in caplog.text and "skipped" in caplog.text
        assert follower.get(OTHER).scope == "global"  # type: ignore[union-attr]
        assert changed and set(changed) == {NS}

        src.append(EVENTS, [event_entry(HOT, None, removed=True, seq=2)])
        await until(lambda: follower.get(HOT) is None, "the removal")
        table = await read_table(src, RegistrySchemas(reg.get, reg.read), NS)
        assert table.table.lookup(HOT) is None
        assert table.table.lookup(OTHER) == follower.get(OTHER)
    finally:
        await follower.close()


async def test_a_namespace_without_the_system_topic_is_looked_at_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(change_events, "ABSENT_POLL_S", 0.05)
    src = MemoryLedgerSource()
    reg = Registry()
    follower = ChangeEvents(src, RegistrySchemas(reg.get, reg.read))
    try:
        await follower.prepare(NS)  # returns: nothing to read
        assert follower.get(HOT) is None
        ns = follower.namespace(NS)
        assert ns is not None and not ns.exists
        src.open_ledger(EVENTS)  # the first topic policy of the namespace
        src.append(EVENTS, [event_entry(HOT, PulsarOffloadPolicy(deletion_lag_ms=5))])
        await until(lambda: follower.get(HOT) is not None, "the topic's first policy")
    finally:
        await follower.close()


async def test_an_unknown_schema_version_is_skipped_naming_the_message(
        caplog: pytest.LogCaptureFixture) -> None:
    src = MemoryLedgerSource()
    reg = Registry()
    src.open_ledger(EVENTS)
    src.append(EVENTS, [event_entry(HOT, PulsarOffloadPolicy(threshold_bytes=1), version=3),
                        event_entry(OTHER, PulsarOffloadPolicy(threshold_bytes=2), seq=1)])
    with caplog.at_level(logging.WARNING):
        table = (await read_table(src, RegistrySchemas(reg.get, reg.read), NS)).table
    assert table.lookup(HOT) is None and table.lookup(OTHER) is not None
    assert "schema version 3" in caplog.text and f"{EVENTS} 0:0" in caplog.text


async def test_a_batched_entry_is_read_message_by_message() -> None:
    """The broker's producer does not batch, but a batch (say, from another writer of the
    topic) is read message by message, a null value included."""
    reg = Registry()
    src = MemoryLedgerSource()
    src.open_ledger(EVENTS)
    def datum(topic: TopicName, p: PulsarOffloadPolicy) -> bytes:
        return avro.encode(BROKER_SCHEMA, {
            "eventType": "TOPIC_POLICY", "topicPoliciesEvent": {
                "topic": topic.local, "policies": {"offloadPolicies": offload_policies_datum(p)}}})

    hot, other = datum(HOT, PulsarOffloadPolicy(threshold_bytes=3)), datum(
        OTHER, PulsarOffloadPolicy(threshold_bytes=4))
    body = encode_batch([
        (pb.SingleMessageMetadata(payload_size=len(hot), partition_key=str(HOT)), hot),
        (pb.SingleMessageMetadata(payload_size=len(other), partition_key=str(OTHER)), other),
        (pb.SingleMessageMetadata(payload_size=0, partition_key=str(OTHER), null_value=True),
         b"")])
    md = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1,
                            num_messages_in_batch=3, schema_version=version_bytes(0),
                            uncompressed_size=len(body))
    src.append(EVENTS, [encode_entry(md, body)])
    table = (await read_table(src, RegistrySchemas(reg.get, reg.read), NS)).table
    level = table.lookup(HOT)
    assert level is not None and level.policy.threshold_bytes == 3
    assert table.lookup(OTHER) is None  # set, then removed in the same batch
