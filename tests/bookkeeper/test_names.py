"""The source's topics come from children watches on Pulsar's ``/managed-ledgers`` tree: new
tenants, namespaces and topics are listed once their watches fire, deleted ones drop out, and a
listing while nothing changed reads nothing from Pulsar's ZooKeeper (it read every namespace's
children each time before)."""

from __future__ import annotations

from typing import Any

import pytest

from offloadd.model import TopicName
from tests.bookkeeper.conftest import Cluster
from tests.bookkeeper.scale import ZkOps
from tests.bookkeeper.test_source import eventually, payloads

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

A = TopicName.parse("persistent://public/default/a")
B = TopicName.parse("persistent://other/ns-2/b")  # a tenant and namespace that come later
C = TopicName.parse("persistent://public/ns-3/c")


async def test_new_and_deleted_topics_are_followed_by_watches(cluster: Cluster) -> None:
    p = cluster.pulsar
    await p.append(A, payloads(2, "a"))
    await p.close_ledger(A)
    src: Any = cluster.source()
    try:
        assert await src.list_topics() == [A]
        ops = ZkOps()
        ops.attach(src.zk._store, "pulsar")
        for _ in range(5):  # discovery passes while nothing changes
            assert await src.list_topics() == [A]
        assert ops.reads == 0, ops.snapshot()

        await p.append(B, payloads(1, "b"))
        await p.create_topic(C)

        async def listed(want: list[TopicName]) -> bool:
            return bool(await src.list_topics() == sorted(want))

        await eventually(lambda: listed([A, B, C]), "the new tenant's and namespace's topics")
        assert [d.ledger_id for d in await src.ledgers(B)] == [p.ledgers_of(B)[0].ledger_id]

        await p.zk.delete(p.ml_path(C))
        await eventually(lambda: listed([A, B]), "the deleted topic gone")
        await p.zk.delete("/managed-ledgers/public", recursive=True)
        await eventually(lambda: listed([B]), "the deleted tenant's topics gone")
    finally:
        await src.close()
