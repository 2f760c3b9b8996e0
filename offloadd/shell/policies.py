"""Pulsar's offload policies in the daemon and in ``status --topic`` (sidecar mode).

The daemon asks :func:`effective` for a topic's policy on every roll decision: offloadd's
levels with the watched Pulsar namespace policy between ``[namespaces."t/ns"]`` and
``[offload]`` (:mod:`offloadd.config.effective`). ``status --topic`` reads the same nodes once
(:func:`policy_detail`) and prints each value with its source (:func:`policy_lines`).
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

log = logging.getLogger(__name__)

__all__ = ["EffectivePolicies", "PulsarPolicyView", "effective", "open_pulsar_policies",
           "policy_detail", "policy_lines"]


class PulsarPolicyView(Protocol):
    """What the daemon needs of :class:`~offloadd.ledger.bookkeeper.policies.NamespacePolicies`."""

    on_change: Callable[[str], None] | None

    def get(self, ns: str) -> NamespacePolicy | None: ...

    async def prepare(self, ns: str) -> None: ...


def reads_pulsar_policies(settings: Settings) -> bool:
    return settings.source.kind == "bookkeeper" and settings.source.pulsar_policies


def effective(settings: Settings, topic: TopicName,
              state: NamespacePolicy | None) -> EffectivePolicy:
    """``topic``'s policy: offloadd's levels and its namespace's Pulsar policy ``state``."""
    if state is None or state.policy is None:
        return effective_policy(settings, topic)
    return effective_policy(settings, topic, state.policy, state.path)


class EffectivePolicies:
    """Each topic's :func:`effective` policy, computed again only when the configuration (a
    reload) or its namespace's Pulsar policy changed: the daemon asks on every step of every
    topic, and resolving the levels costs some 40 µs."""

    def __init__(self, pulsar: PulsarPolicyView | None,
                 wake: Callable[[str], None] | None = None) -> None:
        self.pulsar = pulsar
        # keyed by the topic when the configuration has a [topics."..."] level for it, else
        # by its namespace: the policy is then the namespace's, one object shared by all of
        # its topics (not one each: issue 22, thousands of topics)
        self._memo: dict[TopicName | str, tuple[Settings, object, EffectivePolicy]] = {}
        if pulsar is not None and wake is not None:  # a namespace's policy changed
            pulsar.on_change = wake

    async def prepare(self, topic: TopicName) -> None:
        """Before ``topic`` starts: its namespace's Pulsar policy is watched (and read)."""
        if self.pulsar is not None:
            await self.pulsar.prepare(topic.ns)

    def get(self, settings: Settings, topic: TopicName) -> EffectivePolicy:
        state = self.pulsar.get(topic.ns) if self.pulsar is not None else None
        # the watcher replaces a namespace's state on each change: identity says "unchanged"
        key: TopicName | str = topic if settings.topics and str(topic) in settings.topics \
            else topic.ns
        hit = self._memo.get(key)
        if hit is not None and hit[0] is settings and hit[1] is state:
            return hit[2]
        eff = effective(settings, topic, state)
        self._memo[key] = (settings, state, eff)
        return eff

    def forget(self, topic: TopicName) -> None:
        self._memo.pop(topic, None)


def open_pulsar_policies(settings: Settings, source: LedgerSource) -> NamespacePolicies | None:
    """The daemon's watcher of Pulsar's namespace policies, on the BookKeeper source's session
    (None: not sidecar mode, or ``[source] pulsar_policies = false``). Watches are armed as
    namespaces' first topics start."""
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
                        topics: Sequence[TopicName]) -> dict[str, dict[str, Any]]:
    """Each topic's effective policy with each value's source (``status --topic``): one read
    of each namespace's Pulsar policy node, no watch."""
    states: dict[str, NamespacePolicy | None] = {}
    errors: dict[str, str] = {}
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
        doc = effective(settings, topic, state).to_json()
        problem = errors.get(topic.ns) or (state.error and f"{state.path}: {state.error}"
                                          if state is not None else None)
        if problem:
            doc["pulsar_error"] = problem
        out[str(topic)] = doc
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
