"""The pipeline's one handle on the configuration (``offload/policy.py``): a topic's policy from
its keys, read again on every use (a reload applies to running work), and throttle requests
whose waits are reported per topic."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from offloadd.model import TopicName
from offloadd.offload.context import OffloadMode
from offloadd.offload.policy import PolicyKeys, PolicySource, SchedulerSettings, topic_policy
from offloadd.offload.throttle import Throttle

pytestmark = pytest.mark.timeout(30)

TOPIC = TopicName.parse("persistent://public/default/policy")
KEYS = PolicyKeys(mode="streaming", max_size_per_segment_mbytes=0.5,
                  max_segment_rollover_time_minutes=2.0, max_block_size_bytes=4096,
                  min_block_size_bytes=8192, threshold_bytes=-1, threshold_seconds=30.0)


def test_keys_become_the_policy_in_the_pipeline_units() -> None:
    p = topic_policy(KEYS)
    assert (p.roll.max_bytes, p.roll.max_age_s, p.roll.max_block_size) == (1 << 19, 120.0, 4096)
    assert p.roll.min_block_size == 4096  # never above the largest block
    assert p.mode is OffloadMode.STREAMING
    assert (p.thresholds.bytes, p.thresholds.seconds) == (None, 30.0)  # negative: unset


def test_the_policy_is_read_again_on_every_use() -> None:
    current = [KEYS]
    source = PolicySource(Throttle(0), keys=lambda topic: current[0])
    policy = source.policy_fn(TOPIC)
    assert policy().mode is OffloadMode.STREAMING
    assert policy() is policy()  # the same keys: the policy made of them once
    current[0] = replace(KEYS, mode="ledger")  # a reload
    assert policy().mode is OffloadMode.LEDGER
    source.forget(TOPIC)
    assert policy().mode is OffloadMode.LEDGER
    assert source.scheduler_settings() == SchedulerSettings()


async def test_each_throttle_wait_is_reported_for_its_topic() -> None:
    waits: list[tuple[str, float]] = []
    source = PolicySource(Throttle(0), keys=lambda topic: KEYS,
                          on_wait=lambda topic, s: waits.append((topic, s)))
    assert await asyncio.wait_for(source.acquire(1000, str(TOPIC)), 5) == 0.0  # unlimited
    assert waits == [(str(TOPIC), 0.0)]
