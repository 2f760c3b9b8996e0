"""Pulsar's system topics (pure): never offloaded, as Pulsar's brokers never offload them.

Pulsar gives system topics and the system namespace a non-appendable offloader
(``BrokerService.getManagedLedgerConfig``; ``SystemTopicNames.isSystemTopic``): each namespace's
``__change_events`` (topic policies, read by offloadd in sidecar mode: docs/sidecar.md) and the
transaction buffer's snapshot topics, the transaction pending-ack stores
(``<topic>-<subscription>__transaction_pending_ack``), the transaction coordinator's logs
(``__transaction_log_<n>``) and anything in the ``pulsar/system`` namespace.
"""

from __future__ import annotations

import re

from offloadd.model.positions import TopicName

__all__ = ["CHANGE_EVENTS", "EVENT_TOPICS", "is_system_topic", "partitioned_parent"]

CHANGE_EVENTS = "__change_events"  # SystemTopicNames.NAMESPACE_EVENTS_LOCAL_NAME
EVENT_TOPICS = frozenset((CHANGE_EVENTS, "__transaction_buffer_snapshot",
                          "__transaction_buffer_snapshot_segments",
                          "__transaction_buffer_snapshot_indexes"))
_PARTITION = re.compile(r"-partition-\d+$")


def partitioned_parent(local: str) -> str:
    """``orders`` for ``orders-partition-3`` (a partition's topic policies are its parent's)."""
    return _PARTITION.sub("", local)


def is_system_topic(topic: TopicName) -> bool:
    local = partitioned_parent(topic.local)
    return (local in EVENT_TOPICS or local.endswith("__transaction_pending_ack")
            or local.startswith("__transaction_log_")
            or (topic.tenant, topic.namespace) == ("pulsar", "system"))
