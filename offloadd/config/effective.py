"""A topic's effective offload policy and where each value comes from (pure).

Per field, the first level that sets it wins, most specific first (docs/sidecar.md,
"Pulsar's offload policies")::

    offloadd.toml [topics."persistent://t/ns/x"]
    offloadd.toml [namespaces."t/ns"]
    pulsar topic policy (persistent://t/ns/__change_events: local, else global)
    pulsar namespace policy (/admin/policies/t/ns; sidecar mode)
    offloadd.toml [offload]   (a key written there, or in OFFLOADD_OFFLOAD__...)
    default

As in Pulsar (topic over namespace over broker.conf, merged field by field), a topic's policy
beats its namespace's and a namespace's beats the broker-wide ``[offload]``; at the same level
offloadd's own file beats Pulsar's policies, so an operator can always override what a Pulsar
admin set. Without a Pulsar policy this is exactly
:meth:`offloadd.config.Settings.policy_for`.

Pulsar's values map onto offloadd's fields so (:func:`pulsar_level`): the thresholds as they are
(negative: no threshold, offloadd's -1); the deletion lag when it is 0 or more (negative, Pulsar's
"never delete by lag", is not applied: the next level's lag is). The read priority has no
offloadd field: it is reported, not applied (Pulsar's brokers do not read offloadd's tier, and
offloadd's readers read only the tier).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from offloadd.config.fields import key_text
from offloadd.config.policy import OffloadPolicy
from offloadd.config.settings import Settings
from offloadd.metadata.pulsar_policies import PulsarOffloadPolicy
from offloadd.model import TopicName

__all__ = ["DEFAULT", "PULSAR_FIELDS", "EffectivePolicy", "Sourced", "effective_policy",
           "pulsar_level", "resolve"]

DEFAULT = "default"
# the fields a Pulsar offload policy can set, in offloadd's names
PULSAR_FIELDS = ("threshold_bytes", "threshold_seconds", "deletion_lag_ms")
# Pulsar's broker.conf default (managedLedgerDataReadPriority)
DEFAULT_READ_PRIORITY = "tiered-storage-first"


@dataclass(frozen=True)
class Sourced:
    value: Any
    source: str  # the level that set it, e.g. 'offloadd.toml [offload]' or 'default'


@dataclass(frozen=True)
class EffectivePolicy:
    policy: OffloadPolicy
    sources: Mapping[str, str]  # field -> the level it comes from
    read_priority: Sourced

    def to_json(self) -> dict[str, Any]:
        out = {k: {"value": getattr(self.policy, k), "source": self.sources[k]}
               for k in PULSAR_FIELDS}
        out["read_priority"] = {"value": self.read_priority.value,
                                "source": self.read_priority.source, "applied": False}
        return out


def resolve(levels: Sequence[tuple[str, Mapping[str, Any]]], defaults: Mapping[str, Any]
            ) -> dict[str, Sourced]:
    """Per field of ``defaults``: the value of the first level (highest first) that sets it,
    else the default."""
    out: dict[str, Sourced] = {}
    for key, default in defaults.items():
        out[key] = next((Sourced(values[key], name) for name, values in levels
                         if values.get(key) is not None), Sourced(default, DEFAULT))
    return out


def pulsar_level(p: PulsarOffloadPolicy) -> dict[str, Any]:
    """What a Pulsar policy sets, as offloadd's policy fields."""
    out: dict[str, Any] = {}
    if p.threshold_bytes is not None:
        out["threshold_bytes"] = p.threshold_bytes if p.threshold_bytes >= 0 else -1
    if p.threshold_seconds is not None:
        out["threshold_seconds"] = float(p.threshold_seconds) if p.threshold_seconds >= 0 \
            else -1.0
    if p.deletion_lag_ms is not None and p.deletion_lag_ms >= 0:
        out["deletion_lag_ms"] = p.deletion_lag_ms
    return out


def effective_policy(settings: Settings, topic: TopicName,
                     pulsar_ns: PulsarOffloadPolicy | None = None,
                     pulsar_where: str = "",
                     pulsar_topic: tuple[str, PulsarOffloadPolicy] | None = None
                     ) -> EffectivePolicy:
    """``topic``'s policy over every level, with each value's source; ``pulsar_ns``: the
    Pulsar policy of its namespace (read from node ``pulsar_where``), if any; ``pulsar_topic``:
    (its source's name, the policy) of the topic's own Pulsar policy, if any."""
    levels: list[tuple[str, Mapping[str, Any]]] = []
    over = settings.topics.get(str(topic))
    if over is not None:
        levels.append((f"offloadd.toml [topics.{key_text(str(topic))}]",
                       over.model_dump(exclude_none=True)))
    over = settings.namespaces.get(topic.ns)
    if over is not None:
        levels.append((f"offloadd.toml [namespaces.{key_text(topic.ns)}]",
                       over.model_dump(exclude_none=True)))
    pulsar_name = f"pulsar namespace policy {pulsar_where}".rstrip()
    if pulsar_topic is not None:
        levels.append((pulsar_topic[0], pulsar_level(pulsar_topic[1])))
    if pulsar_ns is not None:
        levels.append((pulsar_name, pulsar_level(pulsar_ns)))
    off = settings.offload
    levels.append(("offloadd.toml [offload]",
                   {k: getattr(off, k) for k in off.model_fields_set
                    if k in OffloadPolicy.model_fields}))
    defaults = {k: getattr(off, k) for k in OffloadPolicy.model_fields}
    chosen = resolve(levels, defaults)
    policy = OffloadPolicy.model_validate({k: s.value for k, s in chosen.items()})
    if pulsar_topic is not None and pulsar_topic[1].read_priority is not None:
        priority = Sourced(pulsar_topic[1].read_priority, pulsar_topic[0])
    elif pulsar_ns is not None and pulsar_ns.read_priority is not None:
        priority = Sourced(pulsar_ns.read_priority, pulsar_name)
    else:
        priority = Sourced(DEFAULT_READ_PRIORITY, DEFAULT)
    return EffectivePolicy(policy, {k: s.source for k, s in chosen.items()}, priority)
