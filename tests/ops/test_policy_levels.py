"""Which level sets each offload policy value, with Pulsar's topic and namespace policies among
offloadd's (pure: :func:`offloadd.config.effective.effective_policy`)::

    [topics."..."]  >  [namespaces."t/ns"]  >  Pulsar topic policy  >  Pulsar namespace policy
      >  [offload]  >  default
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from offloadd.config import Settings
from offloadd.config.effective import PULSAR_FIELDS, effective_policy, pulsar_level
from offloadd.metadata.pulsar_policies import PulsarOffloadPolicy
from offloadd.model import TopicName

TOPIC = TopicName.parse("persistent://t/ns/x")
WHERE = "/admin/policies/t/ns"
TOPIC_LEVEL = 'offloadd.toml [topics."persistent://t/ns/x"]'
NS_LEVEL = 'offloadd.toml [namespaces."t/ns"]'
PULSAR_LEVEL = f"pulsar namespace policy {WHERE}"
OFFLOAD_LEVEL = "offloadd.toml [offload]"
PULSAR_TOPIC_LEVEL = "pulsar topic policy (local) persistent://t/ns/__change_events"

values = {
    "threshold_bytes": st.none() | st.integers(-1, 2**40),
    "threshold_seconds": st.none() | st.integers(-1, 10**6).map(float),
    "deletion_lag_ms": st.none() | st.integers(0, 10**10),
}
level = st.fixed_dictionaries({k: v for k, v in values.items()})
pulsar = st.none() | st.builds(
    PulsarOffloadPolicy, st.none() | st.integers(-5, 2**40), st.none() | st.integers(-5, 10**6),
    st.none() | st.integers(-5, 10**10),
    st.none() | st.sampled_from(["bookkeeper-first", "tiered-storage-first"]))


def _set(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def _settings(topic: dict[str, Any], ns: dict[str, Any], off: dict[str, Any]) -> Settings:
    return Settings(offload=_set(off), namespaces={"t/ns": _set(ns)},
                    topics={str(TOPIC): _set(topic)})


@settings(max_examples=300, deadline=None)
@given(level, level, level, pulsar, pulsar)
def test_each_value_comes_from_the_most_specific_level_that_sets_it(
        topic: dict[str, Any], ns: dict[str, Any], off: dict[str, Any],
        p: PulsarOffloadPolicy | None, pt: PulsarOffloadPolicy | None) -> None:
    s = _settings(topic, ns, off)
    on_topic = (PULSAR_TOPIC_LEVEL, pt) if pt is not None else None
    eff = effective_policy(s, TOPIC, p, WHERE, pulsar_topic=on_topic)
    mapped = pulsar_level(p) if p is not None else {}
    mapped_topic = pulsar_level(pt) if pt is not None else {}
    defaults = Settings().offload
    for key in PULSAR_FIELDS:
        want = next(((v[key], name) for name, v in (
            (TOPIC_LEVEL, topic), (NS_LEVEL, ns), (PULSAR_TOPIC_LEVEL, mapped_topic),
            (PULSAR_LEVEL, mapped), (OFFLOAD_LEVEL, off))
            if v.get(key) is not None), (getattr(defaults, key), "default"))
        assert (getattr(eff.policy, key), eff.sources[key]) == want, key
    if p is None and pt is None:  # offloadd's own levels only: exactly what it always resolved
        assert eff.policy == s.policy_for(TOPIC)
    rp = eff.read_priority
    if pt is not None and pt.read_priority is not None:
        assert (rp.value, rp.source) == (pt.read_priority, PULSAR_TOPIC_LEVEL)
    elif p is not None and p.read_priority is not None:
        assert (rp.value, rp.source) == (p.read_priority, PULSAR_LEVEL)
    else:
        assert (rp.value, rp.source) == ("tiered-storage-first", "default")


def test_pulsar_values_onto_offloadd_fields() -> None:
    # thresholds as they are (negative: none); a negative lag (Pulsar: never delete by lag)
    # is not applied, the next level's is
    assert pulsar_level(PulsarOffloadPolicy(1 << 30, 3600, 60_000)) == {
        "threshold_bytes": 1 << 30, "threshold_seconds": 3600.0, "deletion_lag_ms": 60_000}
    assert pulsar_level(PulsarOffloadPolicy(-7, -2, -1)) == {
        "threshold_bytes": -1, "threshold_seconds": -1.0}
    assert pulsar_level(PulsarOffloadPolicy(read_priority="bookkeeper-first")) == {}


def test_the_sources_as_status_shows_them() -> None:
    s = Settings(offload={"threshold_seconds": 30},
                 namespaces={"t/ns": {"deletion_lag_ms": 5}})
    eff = effective_policy(s, TOPIC, PulsarOffloadPolicy(1 << 30, 600, 9, "bookkeeper-first"),
                           WHERE)
    assert eff.to_json() == {
        "threshold_bytes": {"value": 1 << 30, "source": PULSAR_LEVEL},
        "threshold_seconds": {"value": 600.0, "source": PULSAR_LEVEL},
        "deletion_lag_ms": {"value": 5, "source": NS_LEVEL},
        "read_priority": {"value": "bookkeeper-first", "source": PULSAR_LEVEL,
                          "applied": False}}
    plain = effective_policy(s, TopicName.parse("persistent://t/other/y"))
    assert plain.sources == {**plain.sources, "threshold_seconds": OFFLOAD_LEVEL,
                             "threshold_bytes": "default", "deletion_lag_ms": "default"}


class _Watched:
    """A stand-in for the watcher's view: the state object is replaced on each change."""

    on_change: Callable[[str], None] | None = None

    def __init__(self) -> None:
        from offloadd.ledger.bookkeeper.policies import NamespacePolicy

        self.state = NamespacePolicy(WHERE, PulsarOffloadPolicy(threshold_bytes=100))
        self.level: Any = None

    def get(self, ns: str) -> Any:
        return self.state if ns == "t/ns" else None

    def topic_level(self, topic: TopicName) -> Any:
        return self.level if topic == TOPIC else None

    async def prepare(self, ns: str) -> None:
        return None


def test_the_daemon_memo_follows_reloads_and_pulsar_changes() -> None:
    from offloadd.ledger.bookkeeper.policies import NamespacePolicy
    from offloadd.shell.policies import EffectivePolicies

    watched = _Watched()
    memo = EffectivePolicies(watched)
    s = Settings()
    first = memo.get(s, TOPIC)
    assert first.policy.threshold_bytes == 100 and memo.get(s, TOPIC) is first
    reloaded = Settings(topics={str(TOPIC): {"threshold_bytes": 7}})
    assert memo.get(reloaded, TOPIC).policy.threshold_bytes == 7
    watched.state = NamespacePolicy(WHERE, PulsarOffloadPolicy(threshold_bytes=200))
    assert memo.get(s, TOPIC).policy.threshold_bytes == 200
    assert memo.get(s, TOPIC).sources["threshold_bytes"] == PULSAR_LEVEL
    memo.forget(TOPIC)
    assert memo.get(s, TOPIC).policy.threshold_bytes == 200
    # a Pulsar topic policy appears, changes (a new value each time), goes
    from offloadd.metadata.topic_policies import TopicLevel

    watched.level = TopicLevel(PulsarOffloadPolicy(threshold_bytes=300), "local",
                               "persistent://t/ns/__change_events")
    assert memo.get(s, TOPIC).policy.threshold_bytes == 300
    assert memo.get(s, TOPIC).sources["threshold_bytes"] == PULSAR_TOPIC_LEVEL
    watched.level = TopicLevel(PulsarOffloadPolicy(threshold_bytes=400), "global",
                               "persistent://t/ns/__change_events")
    assert memo.get(s, TOPIC).policy.threshold_bytes == 400
    watched.level = None
    assert memo.get(s, TOPIC).policy.threshold_bytes == 200
