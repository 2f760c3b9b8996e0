"""``offloadd topic-policy``: set or remove a topic's offload policy in the embedded store, the
way a Pulsar broker does for ``pulsar-admin topics set-offload-policies`` /
``remove-offload-policies``.

The broker writes the policy as a ``PulsarEvent`` message to the namespace's system topic
``persistent://<tenant>/<namespace>/__change_events`` (:mod:`offloadd.metadata.topic_policies`):
keyed by the topic (``__G__``-prefixed with ``--global``), Avro under the schema it registers
for that topic, a null value to remove. This command does the same in the embedded store — the
schema registered in its registry (:mod:`offloadd.metadata.schemas`), the message appended by
the embedded writer — so a daemon over the embedded store follows it exactly as a sidecar
follows Pulsar's (docs/config.md, "Pulsar's offload policies").
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from offloadd._proto import pulsar_api_pb2 as pb
from offloadd.format.message import encode_entry
from offloadd.format.schema_storage import SchemaInfo, SchemaType, version_bytes
from offloadd.metadata.base import MetadataStore
from offloadd.metadata.pulsar_policies import PulsarOffloadPolicy
from offloadd.metadata.schemas import register, topic_schema_id
from offloadd.metadata.topic_policies import (
    PULSAR_EVENT_SCHEMA,
    change_events_topic,
    encode_event,
)
from offloadd.model import Position, TopicName

__all__ = ["event_entry", "register_event_schema", "set_topic_policy"]

PRODUCER = "offloadd-topic-policy"


async def register_event_schema(md: MetadataStore, ns: str,
                                allocate_ledger: Callable[[], Awaitable[int]]) -> int:
    """The ``PulsarEvent`` schema's version for ``ns``'s ``__change_events`` (registered as the
    broker's producer registers it, once)."""
    topic = change_events_topic(ns)
    info = SchemaInfo(schema_id=topic_schema_id(topic), type=SchemaType.AVRO,
                      schema=json.dumps(PULSAR_EVENT_SCHEMA, separators=(",", ":")).encode(),
                      timestamp=int(time.time() * 1000),
                      props=(("__alwaysAllowNull", "true"),
                             ("__jsr310ConversionEnabled", "false")))
    return await register(md, topic, info, allocate_ledger)


def event_entry(topic: TopicName, policy: PulsarOffloadPolicy | None, *, version: int,
                is_global: bool = False, remove: bool = False,
                cluster: str = "standalone") -> bytes:
    """The ``__change_events`` entry the broker writes: ``topic``'s offload policies set to
    ``policy`` (None: none), or with ``remove`` the key's null value."""
    key, value = encode_event(topic, policy, is_global=is_global, cluster=cluster)
    now_ms = int(time.time() * 1000)
    md = pb.MessageMetadata(producer_name=PRODUCER, sequence_id=now_ms, publish_time=now_ms,
                            partition_key=key)
    if not is_global:
        md.replicate_to.append(cluster)
    if remove:
        md.null_value = True
        return encode_entry(md, b"")
    md.schema_version = version_bytes(version)
    md.uncompressed_size = len(value)
    return encode_entry(md, value)


async def set_topic_policy(md: MetadataStore, append: Callable[[TopicName, list[bytes]],
                                                                Awaitable[Any]],
                           allocate_ledger: Callable[[], Awaitable[int]], topic: TopicName,
                           policy: PulsarOffloadPolicy | None, *, is_global: bool = False,
                           remove: bool = False) -> dict[str, Any]:
    """Write the event; ``append(topic, entries)`` is the embedded writer's. Returns what was
    written (``offloadd topic-policy --json``)."""
    ns = topic.ns
    version = await register_event_schema(md, ns, allocate_ledger)
    events = change_events_topic(ns)
    got = await append(events, [event_entry(topic, policy, version=version,
                                            is_global=is_global, remove=remove)])
    out: dict[str, Any] = {
        "topic": str(topic), "scope": "global" if is_global else "local",
        "action": "removed" if remove else "set", "system_topic": str(events),
        "schema_version": version}
    if isinstance(got, Position):
        out["position"] = str(got)
    if not remove:
        out["offload_policies"] = {k: v for k, v in (
            ("threshold_bytes", policy.threshold_bytes if policy else None),
            ("threshold_seconds", policy.threshold_seconds if policy else None),
            ("deletion_lag_ms", policy.deletion_lag_ms if policy else None),
            ("read_priority", policy.read_priority if policy else None)) if v is not None}
    return out


def cmd_topic_policy(args: Any) -> int:
    """``offloadd topic-policy``: the embedded store's writer lock, the event, the answer."""
    import sys

    from offloadd import wiring
    from offloadd.errors import ConfigError
    from offloadd.ledger.local import LocalLedgerWriter, StoreLock
    from offloadd.ledger.local.meta import LedgerIds
    from offloadd.shell.commands import _run, _settings, setup_logs

    settings = _settings(args)
    setup_logs(settings, args)
    if settings.source.kind != "local":
        raise ConfigError("topic-policy writes the embedded store's __change_events; in "
                          "sidecar mode use pulsar-admin topics set-offload-policies")
    values = (args.threshold, args.threshold_seconds, args.deletion_lag_ms, args.read_priority)
    if args.remove and any(v is not None for v in values):
        raise ConfigError("--remove takes no policy value")
    if not args.remove and all(v is None for v in values):
        raise ConfigError("give a policy value (--threshold, --threshold-seconds, "
                          "--deletion-lag-ms, --read-priority) or --remove")
    policy = None if args.remove else PulsarOffloadPolicy(*values)
    lock = StoreLock.acquire(settings.source.path, StoreLock.WRITER,
                             holder="offloadd topic-policy")

    async def go() -> int:
        md = await wiring.open_metadata(settings)
        try:
            writer = LocalLedgerWriter(settings.source.path, md,
                                       wiring.rollover_policy(settings),
                                       max_entry_bytes=settings.source.max_entry_bytes)
            ids = LedgerIds(md, 1)
            try:
                out = await set_topic_policy(md, writer.append, lambda: ids.allocate(-1),
                                             args.topic, policy, is_global=args.is_global,
                                             remove=args.remove)
            finally:
                await writer.close()
        finally:
            await md.close()
        if args.json:
            print(json.dumps(out))
        else:
            what = ", ".join(f"{k} {v}" for k, v in out.get("offload_policies", {}).items())
            print(f"{out['topic']}: {out['scope']} offload policy "
                  f"{'removed' if args.remove else 'set: ' + what} "
                  f"(in {out['system_topic']} at {out.get('position', '?')})",
                  file=sys.stdout)
        return 0

    try:
        return _run(go())
    finally:
        lock.release()
