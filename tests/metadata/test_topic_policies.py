"""Pulsar's topic policies as the broker writes them in ``__change_events`` (pure): a
``PulsarEvent`` encoded in Avro decodes back to its offload values, with the writer's schema
whatever other fields it has; a null value removes the key; the latest event of each key is in
force, a topic's local policy before its global one (``BrokerService.getManagedLedgerConfig``).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from offloadd.errors import FormatError
from offloadd.format import avro
from offloadd.format.message import decode_entry
from offloadd.metadata.pulsar_policies import PulsarOffloadPolicy
from offloadd.metadata.topic_policies import (
    GLOBAL_PREFIX,
    PULSAR_EVENT_SCHEMA,
    TopicPolicyEvent,
    TopicPolicyTable,
    decode_event,
    encode_event,
    event_key,
)
from offloadd.model import TopicName
from offloadd.model.system_topics import is_system_topic
from tests.fixtures.pulsar_events import BROKER_SCHEMA, event_entry

TOPIC = TopicName.parse("persistent://public/default/orders")
WHERE = "persistent://public/default/__change_events 3:0"
java_long = st.integers(-(2**63), 2**63 - 1)
policies = st.builds(
    PulsarOffloadPolicy, st.none() | java_long, st.none() | java_long, st.none() | java_long,
    st.none() | st.sampled_from(["bookkeeper-first", "tiered-storage-first"]))
topics = st.builds(TopicName, st.sampled_from(["public", "t-1"]),
                   st.sampled_from(["default", "ns.2"]),
                   st.from_regex(r"[a-z][a-z0-9_.=:-]{0,20}", fullmatch=True))


@settings(max_examples=200, deadline=None)
@given(topics, st.none() | policies, st.booleans())
def test_an_event_decodes_to_what_was_encoded(topic: TopicName,
                                              policy: PulsarOffloadPolicy | None,
                                              is_global: bool) -> None:
    key, value = encode_event(topic, policy, is_global=is_global)
    assert key == (GLOBAL_PREFIX if is_global else "") + str(topic)
    ev = decode_event(key, value, PULSAR_EVENT_SCHEMA, WHERE)
    assert ev == TopicPolicyEvent(key, policy, where=WHERE)
    assert ev.is_global is is_global and ev.topic == str(topic)


@settings(max_examples=200, deadline=None)
@given(topics, st.none() | policies, st.booleans(), st.integers(0, 5))
def test_a_broker_entry_decodes_with_the_writers_schema(
        topic: TopicName, policy: PulsarOffloadPolicy | None, is_global: bool,
        version: int) -> None:
    """The whole entry as the broker stores it, decoded with the registry's schema (more
    fields than offloadd's, in the broker's order)."""
    entry = decode_entry(event_entry(topic, policy, is_global=is_global, version=version),
                         WHERE)
    assert entry.schema_version is not None
    assert int.from_bytes(entry.schema_version, "big") == version
    (m,) = entry.messages
    ev = decode_event(m.key, m.payload, BROKER_SCHEMA, WHERE)
    assert ev == TopicPolicyEvent(event_key(topic, is_global=is_global), policy, where=WHERE)
    # offloadd's own (shorter) schema is not the writer's: it does not decode the value
    with pytest.raises(FormatError):
        decode_event(m.key, m.payload, PULSAR_EVENT_SCHEMA, WHERE)


def test_a_null_value_removes_the_key_and_other_events_are_not_policies() -> None:
    (m,) = decode_entry(event_entry(TOPIC, None, removed=True), WHERE).messages
    assert m.payload is None
    assert decode_event(m.key, m.payload, BROKER_SCHEMA, WHERE) == TopicPolicyEvent(
        str(TOPIC), None, removed=True, where=WHERE)
    snapshot = avro.encode(PULSAR_EVENT_SCHEMA, {"eventType": "TRANSACTION_BUFFER_SNAPSHOT"})
    assert decode_event(str(TOPIC), snapshot, PULSAR_EVENT_SCHEMA, WHERE) is None
    assert decode_event(None, snapshot, PULSAR_EVENT_SCHEMA, WHERE) is None
    with pytest.raises(FormatError, match="3:0"):
        decode_event(str(TOPIC), b"\x02\x00\xff", PULSAR_EVENT_SCHEMA, WHERE)


def test_a_partition_takes_its_parents_policy() -> None:
    part = TopicName.parse("persistent://public/default/orders-partition-7")
    assert event_key(part) == str(TOPIC)
    table = TopicPolicyTable()
    table.apply([TopicPolicyEvent(str(TOPIC), PulsarOffloadPolicy(threshold_bytes=5))])
    level = table.lookup(part)
    assert level is not None and level.policy.threshold_bytes == 5


def _ev(key: str, policy: PulsarOffloadPolicy | None, removed: bool) -> TopicPolicyEvent:
    return TopicPolicyEvent(key, None if removed else policy, removed=removed)


events = st.lists(st.tuples(st.sampled_from([str(TOPIC), GLOBAL_PREFIX + str(TOPIC)]),
                            st.none() | policies, st.booleans()), max_size=12)


@settings(max_examples=300, deadline=None)
@given(events)
def test_the_latest_event_of_each_key_local_before_global(
        log: list[tuple[str, Any, bool]]) -> None:
    table = TopicPolicyTable()
    latest: dict[str, PulsarOffloadPolicy | None] = {}
    for key, policy, removed in log:
        present, before = key in latest, latest.get(key)
        changed = table.apply([_ev(key, policy, removed)])
        if removed:
            latest.pop(key, None)
            assert changed == ({str(TOPIC)} if present else set())
        else:
            latest[key] = policy
            assert changed == ({str(TOPIC)} if not present or before != policy else set())
    level = table.lookup(TOPIC)
    local, glob = latest.get(str(TOPIC)), latest.get(GLOBAL_PREFIX + str(TOPIC))
    want = local if local is not None else glob
    if want is None:
        assert level is None
    else:
        assert level is not None and level.policy == want
        assert level.scope == ("local" if local is not None else "global")
        assert level.source == ("pulsar topic policy (" + level.scope
                                + ") persistent://public/default/__change_events")


def test_system_topics_are_pulsars() -> None:
    for name in ("__change_events", "__change_events-partition-0",
                 "__transaction_buffer_snapshot", "orders-sub__transaction_pending_ack",
                 "__transaction_log_3"):
        assert is_system_topic(TopicName("public", "default", name)), name
    assert is_system_topic(TopicName("pulsar", "system", "anything"))
    for name in ("orders", "change_events", "orders-partition-1", "__changes"):
        assert not is_system_topic(TopicName("public", "default", name)), name
