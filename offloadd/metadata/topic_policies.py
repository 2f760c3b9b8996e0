"""Pulsar's topic-level policies, as its brokers keep them (pure: messages in, values out).

Pulsar keeps no topic policy in its metadata store: each namespace has a system topic,
``persistent://<tenant>/<namespace>/__change_events``, where the broker's
``SystemTopicBasedTopicPoliciesService`` writes one message per change (unbatched):

- key: the full topic name (of a partitioned topic's parent, never ``-partition-N``), prefixed
  ``__G__`` for a *global* policy (replicated to every cluster); a local one stays in its cluster;
- value: a ``PulsarEvent`` datum, Avro binary (``Schema.AVRO`` of the Java class, reflection
  with every field nullable); the writer's schema is in the schema registry,
  ``/schemas/<tenant>/<namespace>/__change_events``, and each message's ``schema_version``
  names its version. Only ``eventType == TOPIC_POLICY`` events are topic policies; their
  ``topicPoliciesEvent.policies.offloadPolicies`` is an ``OffloadPoliciesImpl`` record (the
  same Java field names as a namespace's ``offload_policies``) or null;
- removal (``pulsar-admin topics remove-offload-policies`` keeps the key with the other
  policies; deleting a topic's policies altogether): a message with the key and a null value
  (``MessageMetadata.null_value``).

The topic is compacted: the latest message of each key is what is in force
(:class:`TopicPolicyTable`). The broker takes a topic's offload policies from its *local*
policy if that sets ``offloadPolicies``, else from its global one, and merges the chosen object
field by field over the namespace's (``BrokerService.getManagedLedgerConfig``):
:meth:`TopicPolicyTable.lookup` returns that object and which message it came from.

:data:`PULSAR_EVENT_SCHEMA` is the part of the broker's schema offloadd reads, used to *write*
events (``offloadd topic-policy`` on the embedded store, the tests' fake broker); reading always
uses the writer's schema from the registry, whatever other fields it has.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from offloadd.errors import FormatError
from offloadd.format import avro
from offloadd.metadata.pulsar_policies import PulsarOffloadPolicy, parse_offload_policies
from offloadd.model import TopicName
from offloadd.model.system_topics import CHANGE_EVENTS, partitioned_parent

__all__ = ["CHANGE_EVENTS", "GLOBAL_PREFIX", "PULSAR_EVENT_SCHEMA", "TopicLevel",
           "TopicPolicyEvent", "TopicPolicyTable", "change_events_topic", "decode_event",
           "encode_event", "event_key", "offload_policies_datum"]

GLOBAL_PREFIX = "__G__"  # TopicPolicies' global events (SystemTopicBasedTopicPoliciesService)
TOPIC_POLICY = "TOPIC_POLICY"
_NS = "org.apache.pulsar.common.events"
_POLICIES_NS = "org.apache.pulsar.common.policies.data"


def _opt(t: Any) -> list[Any]:
    return ["null", t]  # ReflectData.AllowNull: every field may be null


def _field(name: str, t: Any) -> dict[str, Any]:
    return {"name": name, "type": _opt(t), "default": None}


OFFLOAD_POLICIES_SCHEMA: dict[str, Any] = {
    "type": "record", "name": "OffloadPoliciesImpl", "namespace": _POLICIES_NS, "fields": [
        _field("offloadersDirectory", "string"),
        _field("managedLedgerOffloadDriver", "string"),
        _field("managedLedgerOffloadMaxThreads", "int"),
        _field("managedLedgerOffloadReadThreads", "int"),
        _field("managedLedgerOffloadPrefetchRounds", "int"),
        _field("managedLedgerOffloadThresholdInBytes", "long"),
        _field("managedLedgerOffloadThresholdInSeconds", "long"),
        _field("managedLedgerOffloadDeletionLagInMillis", "long"),
        _field("managedLedgerOffloadedReadPriority", {
            "type": "enum", "name": "OffloadedReadPriority", "namespace": _POLICIES_NS,
            "symbols": ["BOOKKEEPER_FIRST", "TIERED_STORAGE_FIRST"]}),
        _field("managedLedgerExtraConfigurations", {"type": "map", "values": "string"}),
        _field("s3ManagedLedgerOffloadRegion", "string"),
        _field("s3ManagedLedgerOffloadBucket", "string"),
        _field("s3ManagedLedgerOffloadServiceEndpoint", "string"),
        _field("s3ManagedLedgerOffloadMaxBlockSizeInBytes", "int"),
        _field("s3ManagedLedgerOffloadReadBufferSizeInBytes", "int"),
    ]}

PULSAR_EVENT_SCHEMA: dict[str, Any] = {
    "type": "record", "name": "PulsarEvent", "namespace": _NS, "fields": [
        _field("eventType", {"type": "enum", "name": "EventType", "namespace": _NS, "symbols": [
            TOPIC_POLICY, "TRANSACTION_BUFFER_SNAPSHOT", "TRANSACTION_BUFFER_SNAPSHOT_SEGMENTS",
            "TRANSACTION_BUFFER_SNAPSHOT_INDEXES"]}),
        _field("actionType", {"type": "enum", "name": "ActionType", "namespace": _NS,
                              "symbols": ["INSERT", "DELETE", "UPDATE", "NONE"]}),
        _field("topicPoliciesEvent", {
            "type": "record", "name": "TopicPoliciesEvent", "namespace": _NS, "fields": [
                _field("domain", "string"),
                _field("tenant", "string"),
                _field("namespace", "string"),
                _field("topic", "string"),
                _field("policies", {
                    "type": "record", "name": "TopicPolicies", "namespace": _POLICIES_NS,
                    "fields": [
                        _field("replicationClusters", {"type": "array", "items": "string"}),
                        _field("messageTTLInSeconds", "int"),
                        _field("compactionThreshold", "long"),
                        _field("offloadPolicies", OFFLOAD_POLICIES_SCHEMA),
                        _field("isGlobal", "boolean"),
                    ]}),
            ]}),
        _field("replicateTo", {"type": "array", "items": "string"}),
    ]}


def change_events_topic(ns: str) -> TopicName:
    """The namespace's ``__change_events`` topic (``ns`` is ``tenant/namespace``)."""
    tenant, _, namespace = ns.partition("/")
    return TopicName(tenant, namespace, CHANGE_EVENTS)


def event_key(topic: TopicName, *, is_global: bool = False) -> str:
    """The message key of ``topic``'s policy event (its partitioned parent's name)."""
    name = str(TopicName(topic.tenant, topic.namespace, partitioned_parent(topic.local)))
    return GLOBAL_PREFIX + name if is_global else name


@dataclass(frozen=True)
class TopicPolicyEvent:
    """The latest word on one key: ``policy`` (None: the policies set no offload policies, or
    the key's policies were removed: ``removed``)."""

    key: str
    policy: PulsarOffloadPolicy | None
    removed: bool = False
    where: str = ""  # the message: ``__change_events`` ledger:entry

    @property
    def is_global(self) -> bool:
        return self.key.startswith(GLOBAL_PREFIX)

    @property
    def topic(self) -> str:
        return self.key.removeprefix(GLOBAL_PREFIX)


def decode_event(key: str | None, payload: bytes | None, schema: Any, where: str
                 ) -> TopicPolicyEvent | None:
    """One ``__change_events`` message (its key, its value — None for a null value — and the
    writer's Avro schema; ``where`` names it in errors). None: not a topic policy event.
    ``FormatError`` for a value the schema does not decode."""
    if not key:
        return None  # the broker keys every event; a keyless one has no topic
    if payload is None:
        return TopicPolicyEvent(key, None, removed=True, where=where)
    try:
        datum = avro.decode(schema, payload)
    except avro.AvroError as exc:
        raise FormatError(where, 0, f"not a PulsarEvent of its schema: {exc}") from None
    if not isinstance(datum, dict) or datum.get("eventType") != TOPIC_POLICY:
        return None
    event = datum.get("topicPoliciesEvent") or {}
    policies = event.get("policies") if isinstance(event, dict) else None
    if not isinstance(policies, dict):
        return TopicPolicyEvent(key, None, where=where)
    offload = policies.get("offloadPolicies")
    if not isinstance(offload, dict):
        return TopicPolicyEvent(key, None, where=where)
    return TopicPolicyEvent(key, parse_offload_policies(offload, where), where=where)


def offload_policies_datum(p: PulsarOffloadPolicy) -> dict[str, Any]:
    """``OffloadPoliciesImpl`` as ``pulsar-admin topics set-offload-policies`` leaves it: the
    field initializers, and the values given."""
    rp = p.read_priority.upper().replace("-", "_") if p.read_priority else None
    return {
        "offloadersDirectory": "./offloaders", "managedLedgerOffloadDriver": "aws-s3",
        "managedLedgerOffloadMaxThreads": 2, "managedLedgerOffloadReadThreads": 2,
        "managedLedgerOffloadPrefetchRounds": 1,
        "managedLedgerOffloadThresholdInBytes": p.threshold_bytes,
        "managedLedgerOffloadThresholdInSeconds": p.threshold_seconds,
        "managedLedgerOffloadDeletionLagInMillis": p.deletion_lag_ms,
        "managedLedgerOffloadedReadPriority": rp,
        "managedLedgerExtraConfigurations": {},
        "s3ManagedLedgerOffloadMaxBlockSizeInBytes": 64 << 20,
        "s3ManagedLedgerOffloadReadBufferSizeInBytes": 1 << 20,
    }


def encode_event(topic: TopicName, policy: PulsarOffloadPolicy | None, *,
                 is_global: bool = False, cluster: str = "standalone") -> tuple[str, bytes]:
    """(key, Avro value) of the event the broker writes when ``topic``'s offload policies
    are set to ``policy`` (None: removed, the other policies kept), under
    :data:`PULSAR_EVENT_SCHEMA`."""
    parent = partitioned_parent(topic.local)
    datum = {
        "eventType": TOPIC_POLICY, "actionType": "UPDATE",
        "topicPoliciesEvent": {
            "domain": "persistent", "tenant": topic.tenant, "namespace": topic.namespace,
            "topic": parent,
            "policies": {"offloadPolicies": (offload_policies_datum(policy)
                                             if policy is not None else None),
                         "isGlobal": is_global}},
        "replicateTo": None if is_global else [cluster],
    }
    return event_key(topic, is_global=is_global), avro.encode(PULSAR_EVENT_SCHEMA, datum)


@dataclass(frozen=True)
class TopicLevel:
    """The offload policy a topic's Pulsar topic policies set, and which one it is."""

    policy: PulsarOffloadPolicy
    scope: str  # "local" or "global"
    where: str  # the namespace's ``__change_events`` topic

    @property
    def source(self) -> str:
        return f"pulsar topic policy ({self.scope}) {self.where}".rstrip()


class TopicPolicyTable:
    """The latest event of each key of one namespace's ``__change_events`` (compaction's
    view)."""

    def __init__(self) -> None:
        self._events: dict[str, TopicPolicyEvent] = {}

    def apply(self, events: Iterable[TopicPolicyEvent]) -> set[str]:
        """Apply events in log order; returns the topics (full names) whose level changed."""
        changed: set[str] = set()
        for ev in events:
            old = self._events.get(ev.key)
            if ev.removed:
                if self._events.pop(ev.key, None) is not None:
                    changed.add(ev.topic)
                continue
            self._events[ev.key] = ev
            if old is None or old.policy != ev.policy:
                changed.add(ev.topic)
        return changed

    def lookup(self, topic: TopicName) -> TopicLevel | None:
        """``topic``'s Pulsar topic-level offload policy: its local policy's if that sets one,
        else its global policy's; None when neither does."""
        for scope, key in (("local", event_key(topic)),
                           ("global", event_key(topic, is_global=True))):
            ev = self._events.get(key)
            if ev is not None and ev.policy is not None:
                return TopicLevel(ev.policy, scope, str(change_events_topic(topic.ns)))
        return None

    def snapshot(self) -> Mapping[str, TopicPolicyEvent]:
        return dict(self._events)
