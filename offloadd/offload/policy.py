"""What the pipeline asks of the configuration, in one object the daemon hands it: each topic's
policy, the broker-wide throttle, the scheduler's settings.

The shell resolves the configuration (offloadd's levels and Pulsar's, ``config/effective.py``)
into a :class:`PolicyKeys` per topic and a :class:`SchedulerSettings` (``wiring.py``: the
middle takes no configuration type). What the topic tasks read is assembled here, beside the
pipeline: the roll policy, the mode, the thresholds, and the throttle requests with their waits
reported. Both are read again on every use, so a reload (SIGHUP) applies to running work.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from offloadd.model import TopicName
from offloadd.model.sizes import MiB
from offloadd.offload.context import OffloadMode, TopicPolicy
from offloadd.offload.roller import RollPolicy
from offloadd.offload.threshold import Thresholds
from offloadd.offload.throttle import Throttle

POLICY_MEMO = 4096  # TopicPolicy objects kept (one per namespace and per topic of its own)

__all__ = ["PolicyKeys", "PolicySource", "SchedulerSettings", "topic_policy"]


@dataclass(frozen=True)
class SchedulerSettings:
    """``[daemon]`` keys the scheduler reads when it needs them (a reload applies)."""

    shutdown_deadline_s: float = 30.0
    # of the deadline, how long open segments close at a stop (None: half the deadline)
    stop_close_budget_s: float | None = None
    status_interval_s: float = 30.0

    def stop_close_budget(self) -> float:
        b = self.stop_close_budget_s
        return min(b if b is not None else self.shutdown_deadline_s / 2,
                   self.shutdown_deadline_s)


@dataclass(frozen=True)
class PolicyKeys:
    """A topic's offload policy resolved over every level, in the configuration's units
    (``[offload]`` keys; ``min_block_size_bytes`` with its default applied)."""

    mode: str
    max_size_per_segment_mbytes: float
    max_segment_rollover_time_minutes: float
    max_block_size_bytes: int
    min_block_size_bytes: int
    threshold_bytes: int  # negative: unset (Pulsar's convention)
    threshold_seconds: float


def topic_policy(k: PolicyKeys) -> TopicPolicy:
    """The policy a topic task reads, from its keys."""
    return TopicPolicy(RollPolicy(max_bytes=max(int(k.max_size_per_segment_mbytes * MiB), 1),
                                  max_age_s=k.max_segment_rollover_time_minutes * 60,
                                  max_block_size=k.max_block_size_bytes,
                                  min_block_size=min(k.min_block_size_bytes,
                                                     k.max_block_size_bytes)),
                       mode=OffloadMode(k.mode),
                       thresholds=Thresholds.from_config(k.threshold_bytes, k.threshold_seconds))


class PolicySource:
    """The pipeline's handle on the configuration: ``keys(topic)`` and ``scheduler()`` read
    the current configuration; ``on_wait(topic, seconds)`` is told each throttle wait."""

    def __init__(self, throttle: Throttle, *, keys: Callable[[TopicName], PolicyKeys],
                 scheduler: Callable[[], SchedulerSettings] = SchedulerSettings,
                 on_wait: Callable[[str, float], None] | None = None) -> None:
        self.throttle = throttle
        self._keys = keys
        self._scheduler = scheduler
        self._on_wait = on_wait
        # the policy made of each set of keys: a topic task asks on every step, and making the
        # policy costs some 12 µs where hashing the keys costs 1; topics with the same keys (a
        # namespace's, mostly) share one object rather than hold one each (issue 22)
        self._made: dict[PolicyKeys, TopicPolicy] = {}

    async def acquire(self, nbytes: int, topic: str) -> float:
        """Take a block's bytes from the broker-wide budget in one request, reporting the wait
        per topic.

        One request, not pieces: a part goes to the store whole once its bytes are granted, and
        a topic has several parts waiting at once. Pieces of those parts would be served
        interleaved, so all of them would finish their pieces together and go to the store
        in one burst (4 MiB blocks at 1 MB/s: nothing for 50 s, then 50 MB). Whole requests
        leave the store one block at a time, evenly spaced; a block larger than the throttle's
        burst is granted on credit and paid back by the requests after it (throttle.py).
        """
        waited = await self.throttle.acquire(nbytes, topic)
        if self._on_wait is not None:
            self._on_wait(topic, waited)
        return waited

    def policy(self, topic: TopicName) -> TopicPolicy:
        """``topic``'s policy under the configuration as it is now."""
        keys = self._keys(topic)
        policy = self._made.get(keys)
        if policy is None:
            if len(self._made) >= POLICY_MEMO:  # reloads and policy changes left old ones
                self._made.clear()
            policy = self._made[keys] = topic_policy(keys)
        return policy

    def forget(self, topic: TopicName) -> None:
        """``topic`` stopped running here (its policy may be another topic's too: kept)."""

    def policy_fn(self, topic: TopicName) -> Callable[[], TopicPolicy]:
        """What one topic task calls on each roll decision."""
        return functools.partial(self.policy, topic)  # (smaller than a closure)

    def scheduler_settings(self) -> SchedulerSettings:
        return self._scheduler()
