"""Pulsar's offload policies in the daemon and in ``status --topic``.

The daemon asks :func:`effective` for a topic's policy on every roll decision: offloadd's
levels with the topic's Pulsar topic policy and its namespace's Pulsar policy between
``[namespaces."t/ns"]`` and ``[offload]`` (:mod:`offloadd.config.effective`). ``status --topic``
reads the same sources once (:func:`policy_detail`) and prints each value with its source
(:func:`policy_lines`).

Where they are read (``[source] pulsar_policies``): in sidecar mode the namespace policies in
Pulsar's configuration store (:mod:`offloadd.ledger.bookkeeper.policies`) and the topic policies
in each namespace's ``__change_events`` system topic, through a read-only BookKeeper source of
their own (:mod:`offloadd.ledger.change_events`); with the embedded store, the topic policies in
its ``__change_events`` topics (written by ``offloadd topic-policy``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from offloadd.config import Settings
from offloadd.config.effective import EffectivePolicy, effective_policy
from offloadd.errors import OffloaddError
from offloadd.ledger.base import LedgerSource
from offloadd.model import TopicName

if TYPE_CHECKING:
    from offloadd.ledger.bookkeeper.policies import (
        ConfigurationStore,
        NamespacePolicies,
        NamespacePolicy,
    )
    from offloadd.ledger.change_events import ChangeEvents, Peek, RegistrySchemas
    from offloadd.metadata.base import MetadataStore
    from offloadd.metadata.topic_policies import TopicLevel, TopicPolicyTable

log = logging.getLogger(__name__)

__all__ = ["EffectivePolicies", "PulsarPolicies", "PulsarPolicyView", "effective",
           "open_pulsar_policies", "policy_detail", "policy_lines"]


class PulsarPolicyView(Protocol):
    """What the daemon needs of :class:`PulsarPolicies`."""

    on_change: Callable[[str], None] | None

    def get(self, ns: str) -> NamespacePolicy | None: ...

    def topic_level(self, topic: TopicName) -> TopicLevel | None: ...

    async def prepare(self, ns: str) -> None: ...


def reads_pulsar_policies(settings: Settings) -> bool:
    return settings.source.kind == "bookkeeper" and settings.source.pulsar_policies


def reads_topic_policies(settings: Settings) -> bool:
    return settings.source.pulsar_policies


def effective(settings: Settings, topic: TopicName, state: NamespacePolicy | None,
              level: TopicLevel | None = None) -> EffectivePolicy:
    """``topic``'s policy: offloadd's levels, its Pulsar topic policy ``level`` and its
    namespace's Pulsar policy ``state``."""
    on_topic = (level.source, level.policy) if level is not None else None
    if state is None or state.policy is None:
        return effective_policy(settings, topic, pulsar_topic=on_topic)
    return effective_policy(settings, topic, state.policy, state.path, pulsar_topic=on_topic)


class PulsarPolicies:
    """The daemon's Pulsar policies: the watched namespace policies (sidecar mode) and the
    followed topic policies, either of them None when not read."""

    def __init__(self, namespaces: NamespacePolicies | None,
                 topics: ChangeEvents | None) -> None:
        self.namespaces = namespaces
        self.topics = topics
        self._on_change: Callable[[str], None] | None = None

    @property
    def on_change(self) -> Callable[[str], None] | None:
        return self._on_change

    @on_change.setter
    def on_change(self, fn: Callable[[str], None] | None) -> None:
        self._on_change = fn
        if self.namespaces is not None:
            self.namespaces.on_change = fn
        if self.topics is not None:
            self.topics.on_change = fn

    def get(self, ns: str) -> NamespacePolicy | None:
        return self.namespaces.get(ns) if self.namespaces is not None else None

    def topic_level(self, topic: TopicName) -> TopicLevel | None:
        return self.topics.get(topic) if self.topics is not None else None

    async def prepare(self, ns: str) -> None:
        if self.namespaces is not None:
            await self.namespaces.prepare(ns)
        if self.topics is not None:
            await self.topics.prepare(ns)

    async def close(self) -> None:
        try:
            if self.topics is not None:
                await self.topics.close()
        finally:
            if self.namespaces is not None:
                await self.namespaces.close()

    async def stop(self) -> None:  # as the runtime stops its extras
        await self.close()


class EffectivePolicies:
    """Each topic's :func:`effective` policy, computed again only when the configuration (a
    reload) or its namespace's Pulsar policy changed: the daemon asks on every step of every
    topic, and resolving the levels costs some 40 µs."""

    def __init__(self, pulsar: PulsarPolicyView | None,
                 wake: Callable[[str], None] | None = None) -> None:
        self.pulsar = pulsar
        # keyed by the topic when it has a level of its own (a [topics."..."] table or a Pulsar
        # topic policy), else by its namespace: the policy is then the namespace's, one object
        # shared by all of its topics (not one each: issue 22, thousands of topics)
        self._memo: dict[TopicName | str, tuple[Settings, object, object, EffectivePolicy]] = {}
        if pulsar is not None and wake is not None:  # a namespace's policy changed
            pulsar.on_change = wake

    async def prepare(self, topic: TopicName) -> None:
        """Before ``topic`` starts: its namespace's Pulsar policy is watched (and read)."""
        if self.pulsar is not None:
            await self.pulsar.prepare(topic.ns)

    def get(self, settings: Settings, topic: TopicName) -> EffectivePolicy:
        pulsar = self.pulsar
        state = pulsar.get(topic.ns) if pulsar is not None else None
        level = pulsar.topic_level(topic) if pulsar is not None else None
        # the watcher replaces a namespace's state on each change: identity says "unchanged";
        # a topic level is a small frozen value
        key: TopicName | str = topic if level is not None or (
            settings.topics and str(topic) in settings.topics) else topic.ns
        hit = self._memo.get(key)
        if hit is not None and hit[0] is settings and hit[1] is state and hit[2] == level:
            return hit[3]
        eff = effective(settings, topic, state, level)
        self._memo[key] = (settings, state, level, eff)
        return eff

    def forget(self, topic: TopicName) -> None:
        self._memo.pop(topic, None)


def open_pulsar_policies(settings: Settings, source: LedgerSource,
                         metadata: MetadataStore | None = None) -> PulsarPolicies | None:
    """The daemon's Pulsar policies (None: ``[source] pulsar_policies = false``): in sidecar
    mode the watcher of the namespace policies, on the BookKeeper source's session, and the
    follower of the topic policies; with the embedded store (given its ``metadata``: the
    schema registry) the follower of its own ``__change_events`` topics. Namespaces are
    watched and followed as their first topics start."""
    if not reads_topic_policies(settings):
        return None
    namespaces = _namespace_watcher(settings, source)
    topics = topic_follower(settings, source, metadata, daemon=True)
    if namespaces is None and topics is None:
        return None
    return PulsarPolicies(namespaces, topics)


def _namespace_watcher(settings: Settings, source: LedgerSource) -> NamespacePolicies | None:
    if not reads_pulsar_policies(settings):
        return None
    from offloadd.ledger.bookkeeper import BookKeeperLedgerSource
    from offloadd.ledger.bookkeeper.policies import NamespacePolicies

    if not isinstance(source, BookKeeperLedgerSource):
        return None
    store = configuration_store(settings, source)
    if store is None:
        return NamespacePolicies(source.pulsar_zk)
    return NamespacePolicies(store, close_zk=store.close)


def topic_follower(settings: Settings, source: LedgerSource, metadata: MetadataStore | None,
                   *, daemon: bool = False) -> ChangeEvents | None:
    """The follower of the topic policies (None: not read). A daemon's BookKeeper source
    writes offloadd's catalog: the follower reads through a read-only one of its own, which
    never mirrors the system topic."""
    from offloadd.ledger.change_events import ChangeEvents

    got = _topic_reader(settings, source, metadata, daemon=daemon)
    if got is None:
        return None
    reader, schemas, peek = got
    return ChangeEvents(reader, schemas, close_source=reader is not source, peek=peek)


def _topic_reader(settings: Settings, source: LedgerSource, metadata: MetadataStore | None,
                  *, daemon: bool) -> tuple[LedgerSource, RegistrySchemas, Peek | None] | None:
    """What reads the topic policies: the source, the schema registry, and (BookKeeper) the
    peek at the entry past the LAC."""
    from offloadd.ledger.change_events import RegistrySchemas, entry_payloads

    if not reads_topic_policies(settings):
        return None
    if settings.source.kind == "bookkeeper":
        from offloadd.ledger.bookkeeper import BookKeeperLedgerSource

        if not isinstance(source, BookKeeperLedgerSource):
            return None
        bk = source
        if daemon or not source.read_only:
            md = metadata if metadata is not None else source._md
            bk = BookKeeperLedgerSource(source.options, md, read_only=True)

        async def get_bk(path: str) -> Any:
            return await (await bk.pulsar_zk()).get(path)

        async def read_bk(topic: TopicName, ledger_id: int, entry_id: int) -> bytes:
            # the schema's ledger, read for ``topic`` (its errors name the topic)
            run = await bk.read(topic, ledger_id, entry_id, entry_id)
            return bytes(entry_payloads(run)[0][1])

        async def peek(topic: TopicName, ledger_id: int, entry_id: int) -> bytes | None:
            from offloadd.ledger.bookkeeper.change_tail import durable_entry

            return await durable_entry(bk, topic, ledger_id, entry_id)

        return bk, RegistrySchemas(get_bk, read_bk), peek
    if metadata is None:
        return None
    from offloadd.metadata.schemas import embedded_entry_reader

    embedded = embedded_entry_reader(metadata)

    async def read_embedded(topic: TopicName, ledger_id: int, entry_id: int) -> bytes:
        return await embedded(ledger_id, entry_id)

    return source, RegistrySchemas(metadata.get, read_embedded), None


def configuration_store(settings: Settings, source: Any) -> ConfigurationStore | None:
    """A session of its own to ``[source] pulsar_configuration_zk``, with the source's
    credentials and timeouts (None: the policies are read on the source's session);
    ``ConfigError`` for a bad URL."""
    url = settings.source.pulsar_configuration_zk
    if not url:
        return None
    from offloadd.ledger.bookkeeper.policies import ConfigurationStore

    o = source.options
    return ConfigurationStore(url, session_timeout_s=o.session_timeout_s,
                              connect_timeout_s=o.connect_timeout_s, auth=o.zk_auth)


async def policy_detail(settings: Settings, source: LedgerSource,
                        topics: Sequence[TopicName],
                        metadata: MetadataStore | None = None) -> dict[str, dict[str, Any]]:
    """Each topic's effective policy with each value's source (``status --topic``): one read
    of each namespace's Pulsar policy node and ``__change_events`` topic, no watch."""
    states: dict[str, NamespacePolicy | None] = {}
    errors: dict[str, str] = {}
    tables = await _topic_tables(settings, source, metadata, topics, errors)
    if reads_pulsar_policies(settings):
        from offloadd.ledger.bookkeeper import BookKeeperLedgerSource
        from offloadd.ledger.bookkeeper.policies import read_namespace_policy

        if isinstance(source, BookKeeperLedgerSource):
            store = configuration_store(settings, source)
            try:
                for ns in sorted({t.ns for t in topics}):
                    try:
                        zk = await (store() if store is not None else source.pulsar_zk())
                        states[ns] = await read_namespace_policy(zk, ns)
                    except OffloaddError as exc:
                        errors[ns] = f"Pulsar's namespace policy not read: {exc}"
            finally:
                if store is not None:
                    await store.close()
    out: dict[str, dict[str, Any]] = {}
    for topic in topics:
        state = states.get(topic.ns)
        table = tables.get(topic.ns)
        doc = effective(settings, topic, state,
                        table.lookup(topic) if table is not None else None).to_json()
        problem = errors.get(topic.ns) or (state.error and f"{state.path}: {state.error}"
                                          if state is not None else None)
        if problem:
            doc["pulsar_error"] = problem
        out[str(topic)] = doc
    return out


async def _topic_tables(settings: Settings, source: LedgerSource,
                        metadata: MetadataStore | None, topics: Sequence[TopicName],
                        errors: dict[str, str]) -> dict[str, TopicPolicyTable]:
    """Each namespace's topic policies, read once to the end of its ``__change_events``."""
    got = _topic_reader(settings, source, metadata, daemon=False)
    if got is None:
        return {}
    from offloadd.ledger.change_events import read_table

    reader, schemas, peek = got
    out: dict[str, TopicPolicyTable] = {}
    try:
        for ns in sorted({t.ns for t in topics}):
            try:
                out[ns] = (await read_table(reader, schemas, ns, peek)).table
            except OffloaddError as exc:
                errors[ns] = f"Pulsar's topic policies not read: {exc}"
    finally:
        if reader is not source:
            await reader.close()
    return out


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def _duration(seconds: float) -> str:
    for unit, scale in (("h", 3600), ("min", 60)):
        if seconds >= scale and seconds % scale == 0:
            return f"{seconds / scale:g} {unit}"
    return f"{seconds:g} s"


def policy_lines(doc: dict[str, Any]) -> list[str]:
    """``status --topic`` text: the mapped values, each with its source."""
    def one(key: str, text: str) -> str:
        return f"{text} ({doc[key]['source']})"

    nbytes = doc["threshold_bytes"]["value"]
    seconds = doc["threshold_seconds"]["value"]
    lag = doc["deletion_lag_ms"]["value"]
    rp = doc["read_priority"]
    lines = ["  policy: " + "; ".join([
        one("threshold_bytes", "threshold " + (_size(nbytes) if nbytes >= 0 else "none")),
        one("threshold_seconds",
            "age threshold " + (_duration(seconds) if seconds >= 0 else "none")),
        one("deletion_lag_ms", f"deletion lag {_duration(lag / 1000)}"),
        f"read priority {rp['value']} ({rp['source']}; not used by offloadd)"])]
    if doc.get("pulsar_error"):
        lines.append(f"  policy warning: {doc['pulsar_error']}")
    return lines
