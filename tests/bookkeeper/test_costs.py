"""What a topic costs the BookKeeper source in ZooKeeper operations, counted (issue 22, "Sidecar
at scale"): first sight, a restart, and nothing at all while it does not change; and what it
leaves behind when Pulsar deletes it.
"""

from __future__ import annotations

import pytest

from offloadd.ledger.bookkeeper import BookKeeperLedgerSource
from offloadd.ledger.bookkeeper.mirror import LIST_FROM
from offloadd.metadata import managed_ledger
from offloadd.model import TopicName
from tests.bookkeeper.conftest import Cluster
from tests.bookkeeper.scale import ZkOps, populate, topic_names
from tests.bookkeeper.test_mirror import until
from tests.bookkeeper.test_source import payloads

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

A = TopicName.parse("persistent://public/default/alpha")
PUBLIC = ["persistent://public/*"]


async def counted(src: BookKeeperLedgerSource, cluster: Cluster) -> ZkOps:
    """Count the source's Pulsar session ("pulsar") and offloadd's store ("offloadd")."""
    ops = ZkOps()
    await src._open()
    ops.attach(src.zk._store, "pulsar")
    ops.attach(cluster.ours, "offloadd")
    return ops


async def mirrored_ids(cluster: Cluster, topic: TopicName) -> list[int]:
    info, _ = await managed_ledger.load(cluster.ours, topic.managed_ledger)
    return [li.ledgerId for li in info.ledgerInfo]


async def test_first_sight_reads_each_node_once_and_writes_each_mirror_once(
        cluster: Cluster) -> None:
    """A topic first seen costs Pulsar's ZooKeeper one read of its ledger list (the watch's)
    and one per ledger's metadata, and offloadd's store one ``create`` of its mirror (plus one
    children read per namespace with many new topics). It cost a second read of the list
    (a confirmation) and create-empty + read + write of the mirror."""
    n = 2 * (LIST_FROM + 2)
    topics = topic_names(n, namespaces=2)
    await populate(cluster.pulsar, topics)
    ledgers = sum(1 + i % 2 for i in range(n))
    src = cluster.source(topics=PUBLIC)
    try:
        ops = await counted(src, cluster)
        assert sorted(await src.list_topics()) == sorted(topics)
        got = ops.snapshot()
        assert got.get("pulsar.get") == n + ledgers, got
        assert got.get("offloadd.create") == n, got
        assert got.get("offloadd.children") == 2, got  # one per namespace
        assert not {"offloadd.get", "offloadd.set", "offloadd.exists"} & set(got), got
        for i, t in enumerate(topics):
            assert len(await mirrored_ids(cluster, t)) == 1 + i % 2
    finally:
        await src.close()

    # a restart: every mirror exists and follows Pulsar's list already
    again = cluster.source(topics=PUBLIC)
    try:
        ops = await counted(again, cluster)
        assert sorted(await again.list_topics()) == sorted(topics)
        got = ops.snapshot()
        assert got.get("pulsar.get") == n + ledgers, got
        assert got.get("offloadd.get") == n, got  # each mirror read once, none written
        assert got.get("offloadd.children") == 2, got
        assert not {"offloadd.create", "offloadd.set", "offloadd.exists"} & set(got), got
    finally:
        await again.close()


async def test_a_lone_new_topic_is_one_create_and_a_known_one_still_works(
        cluster: Cluster) -> None:
    """Below ``LIST_FROM`` new topics in a namespace nothing is listed: the mirror is created
    at once, and where it exists already (offloadd ran before) that create's refusal falls
    back to read and compare-and-set."""
    p = cluster.pulsar
    await p.append(A, payloads(3, "a"))
    await p.close_ledger(A)
    first = cluster.source()
    try:
        ops = await counted(first, cluster)
        assert await first.list_topics() == [A]
        assert ops.counts["offloadd.create"] == 1 and ops.reads_of("offloadd") == 0
    finally:
        await first.close()
    await p.append(A, payloads(2, "b"))  # ledger 2 while no source ran
    second = cluster.source()
    try:
        ops = await counted(second, cluster)
        assert await second.list_topics() == [A]
        assert await mirrored_ids(cluster, A) == [1, 2]
        assert ops.counts["offloadd.create"] == 1  # refused: it exists
        assert ops.counts["offloadd.set"] == 1
    finally:
        await second.close()


async def test_generation_moves_only_when_the_ledgers_do(cluster: Cluster) -> None:
    """The change feed the daemon's idle topics rely on instead of polling: the same
    generation while nothing changes, another one for a new ledger and for a close."""
    p = cluster.pulsar
    await p.append(A, payloads(3, "a"))
    await p.close_ledger(A)
    src = cluster.source()
    try:
        assert src.generation(A) is None  # not watched yet
        assert src.idle_poll_s >= 60
        await src.list_topics()
        await src.ledgers(A)
        g = src.generation(A)
        assert g is not None
        await src.ledgers(A)
        await src.list_topics()
        assert src.generation(A) == g
        await p.append(A, payloads(2, "b"))  # ledger 2, open
        await until(lambda: src.generation(A) != g, "a new ledger seen")
        descs = await src.ledgers(A)
        assert [d.ledger_id for d in descs] == [1, 2]
        g = src.generation(A)
        await src.ledgers(A)
        assert src.generation(A) == g
        await p.close_ledger(A)
        await until(lambda: src.generation(A) != g, "the close seen")
    finally:
        await src.close()


async def test_lag_series_goes_when_pulsar_deletes_the_topic(cluster: Cluster) -> None:
    p = cluster.pulsar
    await p.append(A, payloads(4, "a"))
    lid = await p.close_ledger(A)
    src = cluster.source()
    try:
        await src.list_topics()
        await src.ledgers(A)
        await src.read(A, lid, 0, 1)
        await src.ledgers(A)
        assert src.metrics.snapshot()["lac_lag"] == {str(A): 2}
        await p.delete_ledger(A, lid)
        await p.zk.delete(p.ml_path(A))  # Pulsar deletes the topic
        await until(lambda: str(A) not in src.metrics.lac_lag, "the series dropped")
        assert "lac_lag_entries{" not in "".join(
            str(m.samples) for m in src.metrics.collect())
    finally:
        await src.close()
