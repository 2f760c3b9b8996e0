"""Many small Pulsar-style topics on the fake cluster, and a count of the ZooKeeper reads a
daemon makes: what the scale test (``test_scale.py``) and ``bench/sidecar_scale.py`` share.

Each topic gets one or two closed ledgers of a few small entries, as in the report of issue 22
(1,000 topics, 1-2 small closed ledgers each, 6,000 entries in all).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from offloadd.metadata.zookeeper import ZooKeeperMetadataStore
from offloadd.model import Position, TopicName
from tests.bookkeeper.cluster import FakePulsar

if TYPE_CHECKING:
    from offloadd.shell.runtime import Runtime

__all__ = [
    "READS", "SCALE_CONFIG", "SIDECAR_HEAD", "SMALL_SEGMENTS", "ZkOps", "count_ledgers_calls",
    "find_zookeeper", "populate", "topic_names",
]

# Config fragments the sidecar tests and benches share (``str.format`` fields left open). The
# head ends inside ``[source]`` so each user adds its own topics and source keys.
SIDECAR_HEAD = """
[metadata]
url = "{offloadd_url}"
session_timeout_s = 10
[source]
kind = "bookkeeper"
pulsar_zk = "{pulsar_url}"
"""
# the scale test and bench: every public topic, a filesystem tier, no metrics; [daemon] is theirs
SCALE_CONFIG = SIDECAR_HEAD + """topics = ["persistent://public/*"]
[blobstore]
driver = "filesystem"
path = "{tier}"
[offload]
max_size_per_segment_mbytes = 1
max_segment_rollover_time_minutes = 0.02
[metrics]
enabled = false
"""
# the soak and pause tests: tiny segments and blocks, so a short run closes many of them; the
# fragment continues ``[source]`` and ends inside ``[offload]``
SMALL_SEGMENTS = """reads_in_flight = 32
readahead_bytes = 262144
[blobstore]
driver = "filesystem"
path = "{tier}"
[offload]
max_size_per_segment_mbytes = 0.06
max_segment_rollover_time_minutes = 0.01
max_block_size_bytes = 16384
"""

# what a ZooKeeperMetadataStore.call names its kazoo calls by; the rest are writes
READS = frozenset({"get", "children", "exists"})


def topic_names(n: int, namespaces: int = 10) -> list[TopicName]:
    return [TopicName.parse(f"persistent://public/ns-{i % namespaces}/t-{i}") for i in range(n)]


async def populate(pulsar: FakePulsar, topics: Iterable[TopicName], *, entries: int = 3,
                   payload: int = 100, concurrency: int = 64,
                   open_ledger: bool = False) -> dict[TopicName, Position]:
    """Topic ``i`` gets ``1 + i % 2`` closed ledgers of ``entries`` entries, and with
    ``open_ledger`` then an empty open one, as a broker's topic always has (the source
    long-polls it while idle); returns each topic's last position."""
    limit = asyncio.Semaphore(concurrency)
    ends: dict[TopicName, Position] = {}

    async def one(i: int, topic: TopicName) -> None:
        async with limit:
            await pulsar.create_topic(topic)
            for k in range(1 + i % 2):
                body = [bytes([(i + k + e) % 256]) * payload for e in range(entries)]
                ends[topic] = await pulsar.append(topic, body)
                await pulsar.close_ledger(topic)
            if open_ledger:
                await pulsar.open_ledger(topic)

    await asyncio.gather(*(one(i, t) for i, t in enumerate(topics)))
    return ends


class ZkOps:
    """Counts the kazoo calls of ZooKeeper stores by kind (``get``, ``children``, ``exists``,
    ``set``...), watch re-reads included: it wraps each store's ``call``, through which every
    request goes."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.by_tree: collections.Counter[str] = collections.Counter()  # label.what /top-node

    def attach(self, store: ZooKeeperMetadataStore, label: str) -> None:
        inner = store.call

        async def call(start: Callable[[], Any], what: str, path: str) -> Any:
            self.counts[f"{label}.{what}"] += 1
            self.by_tree[f"{label}.{what} /{path.lstrip('/').partition('/')[0]}"] += 1
            return await inner(start, what, path)

        store.call = call  # type: ignore[method-assign]

    async def attach_runtime(self, rt: Runtime) -> Any:
        """Count both ZooKeeper stores of a sidecar runtime: ours as "offloadd", Pulsar's (opened
        here, before the daemon runs) as "pulsar". Returns the runtime's source."""
        ours = find_zookeeper(rt.metadata)
        assert ours is not None, rt.metadata
        self.attach(ours, "offloadd")
        src: Any = rt.source
        await src._open()
        self.attach(src.zk._store, "pulsar")
        return src

    def reset(self) -> None:
        self.counts.clear()
        self.by_tree.clear()

    def reads_of(self, label: str) -> int:
        return sum(n for k, n in self.counts.items()
                   if k.partition(".")[0] == label and k.rpartition(".")[2] in READS)

    @property
    def reads(self) -> int:
        return sum(n for k, n in self.counts.items() if k.rpartition(".")[2] in READS)

    def snapshot(self) -> dict[str, int]:
        return dict(sorted(self.counts.items()))


def count_ledgers_calls(src: Any) -> list[int]:
    """Count the source's ``ledgers()`` calls from now on (the topic tasks' and the daemon's
    lag loop's: what idle topics cost when they are polled); the count is the list's item."""
    calls = [0]
    inner = src.ledgers

    async def ledgers(topic: TopicName) -> Any:
        calls[0] += 1
        return await inner(topic)

    src.ledgers = ledgers
    return calls


def find_zookeeper(store: object, depth: int = 4) -> ZooKeeperMetadataStore | None:
    """The ZooKeeper store inside a (possibly wrapped) metadata store."""
    if isinstance(store, ZooKeeperMetadataStore):
        return store
    if depth == 0 or store is None:
        return None
    for name in ("inner", "_inner", "store", "_store", "base", "_base"):
        found = find_zookeeper(getattr(store, name, None), depth - 1)
        if found is not None:
            return found
    return None
