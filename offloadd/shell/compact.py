"""``offloadd compact``: merge each topic's small adjacent segments in the tier, and the daemon's
background merger (``[compact] enabled``). The merging itself is
:mod:`offloadd.offload.merge`'s; here: which topics, whose fence, which settings.

A topic is merged only by its owner: the command takes the topic's ownership like a backfill
(an epoch, so a stale merge's swap fails on the fence) and refuses a topic a running daemon
holds (that daemon's background merger does it, when enabled); the daemon merges only topics it
holds, under the fence its topic task holds.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from offloadd import wiring
from offloadd.blobstore.base import StoreView
from offloadd.commit import epochs
from offloadd.commit.fence import Fence, give_back_quietly, take
from offloadd.commit.ownership import process_owner_id
from offloadd.config import Settings
from offloadd.errors import ConfigError, OffloaddError
from offloadd.metadata import managed_ledger
from offloadd.metadata.base import MetadataStore
from offloadd.model import TopicName
from offloadd.model.sizes import MiB
from offloadd.offload.attempt import Uploads
from offloadd.offload.merge import MergeReport, MergeSettings, compact_topic
from offloadd.offload.throttle import Throttle
from offloadd.offload.upload import Acquire
from offloadd.read.reader import TierReader

log = logging.getLogger(__name__)

__all__ = ["compact_once", "merge_settings", "run_compact"]


def merge_settings(settings: Settings, topic: TopicName,
                   target_bytes: int | None = None) -> MergeSettings:
    policy = settings.policy_for(topic)
    max_block = policy.max_block_size_bytes
    return MergeSettings(
        target_bytes=target_bytes or max(int(settings.compact.target_mbytes * MiB), 1),
        max_block_size=max_block,
        min_block_size=min(settings.min_block_size(policy), max_block),
        deletion_lag_ms=policy.deletion_lag_ms)


async def compact_once(settings: Settings, topic: TopicName, metadata: MetadataStore,
                       tier: StoreView, fence: Fence, *, acquire: Acquire | None = None,
                       target_bytes: int | None = None, max_groups: int | None = None,
                       sizes: dict[uuid.UUID, int] | None = None,
                       deletion_lag_ms: int | None = None) -> MergeReport:
    """One merge pass over ``topic`` under ``fence`` (its owner's); ``sizes`` as
    :func:`~offloadd.offload.merge.compact_topic` takes it; ``deletion_lag_ms``: the topic's
    effective lag when the caller knows more levels than the file's (the daemon: Pulsar's)."""
    uploads = Uploads(tier.store, topic.managed_ledger, settings.offload.blocks_in_flight,
                      acquire, part_size=settings.blobstore.part_size_bytes)
    reader = TierReader(metadata, tier.store)
    merge = merge_settings(settings, topic, target_bytes)
    if deletion_lag_ms is not None:
        merge = replace(merge, deletion_lag_ms=deletion_lag_ms)
    return await compact_topic(topic, metadata, reader, uploads, fence, merge,
                               wall_ms=lambda: int(time.time() * 1000), max_groups=max_groups,
                               sizes=sizes)


async def run_compact(settings: Settings, topics: Sequence[TopicName] | None, *,
                      target_bytes: int | None = None) -> tuple[list[dict[str, Any]], bool]:
    """``offloadd compact``: each topic (default: every managed ledger) merged under its own
    ownership; (one JSON report per topic, True if every topic was merged)."""
    owner = process_owner_id("compact")
    off = settings.offload
    throttle = Throttle(off.flow_permits_per_second, off.burst_bytes)
    out: list[dict[str, Any]] = []
    ok = True
    md = await wiring.open_metadata(settings, must_exist=True)
    try:
        tier = await wiring.open_tier(settings, probe_writes=True)
        try:
            if topics is None:
                topics = []
                for ml in await managed_ledger.list_names(md):
                    try:
                        topics.append(TopicName.from_managed_ledger(ml))
                    except ConfigError:
                        continue
            for topic in topics:
                ml = topic.managed_ledger
                fence = await take(md, ml, owner)
                if fence is None:
                    holder = await epochs.current_owner(md, ml)
                    out.append({"topic": str(topic), "error": f"owned by {holder!r} (a running "
                                "daemon or backfill): its owner merges it ([compact] enabled), "
                                "or stop it and run compact again"})
                    ok = False
                    continue
                try:
                    async def acquire(n: int, t: str = str(topic)) -> float:
                        return await throttle.acquire(n, t)

                    rep = await compact_once(settings, topic, md, tier, fence, acquire=acquire,
                                             target_bytes=target_bytes)
                    out.append(rep.to_json())
                except OffloaddError as exc:
                    log.error("%s: compact failed: %s", topic, exc)
                    out.append({"topic": str(topic), "error": str(exc)})
                    ok = False
                finally:
                    await give_back_quietly(fence, topic)
        finally:
            await tier.store.close()
    finally:
        await md.close()
    return out, ok
