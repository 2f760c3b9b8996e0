"""Fencing across a real ZooKeeper session expiry, in one process::

    a: acquire (epoch 1) ── edit prepared ── (session expires: LOST) ········ commit → Fenced
    b:                                          acquire (epoch 2) ── commit → applied
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

import pytest
from kazoo.client import KazooClient

from offloadd.commit import edits as commit
from offloadd.commit.cluster import ClusterOwnership
from offloadd.commit.ownership import Revoke
from offloadd.errors import Fenced
from offloadd.metadata import managed_ledger
from offloadd.metadata.managed_ledger import ManagedLedgerInfo
from offloadd.metadata.zookeeper import ZooKeeperMetadataStore
from offloadd.model import TopicName
from tests.cluster._support import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

TOPIC = TopicName.parse("persistent://public/default/fenced")


def expire_session(hosts: str, store: ZooKeeperMetadataStore) -> None:
    """End ``store``'s session on the server, as a long stall does: a second client attaches
    to the same session and closes it (the classic ZooKeeper test trick)."""
    session_id, password = store._zk.client_id  # the test reaches into kazoo on purpose
    ghost = KazooClient(hosts=hosts, client_id=(session_id, password), timeout=10)
    ghost.start(timeout=10)
    ghost.stop()
    ghost.close()


def add_property(key: str, value: str) -> Callable[[ManagedLedgerInfo], bool]:
    def edit(info: ManagedLedgerInfo) -> bool:
        info.properties.add(key=key, value=value)
        return True

    return edit


async def test_a_late_commit_from_an_expired_session_is_rejected_after_takeover(
        zk_server: str) -> None:
    url = f"zk://{zk_server}/sessions-{uuid.uuid4().hex[:10]}"
    sa = await ZooKeeperMetadataStore.open(url, session_timeout_s=2.0)
    sb = await ZooKeeperMetadataStore.open(url, session_timeout_s=2.0)
    try:
        def seed(info: ManagedLedgerInfo) -> bool:
            info.ledgerInfo.add(ledgerId=1, entries=10, size=100)
            return True

        await managed_ledger.update(sb, TOPIC.managed_ledger, seed, create=True)
        a = ClusterOwnership(sa, "a", sessions=sa)
        told: list[dict[TopicName, Revoke]] = []
        a.bind(lambda verdicts: told.append(dict(verdicts)))
        await a.revoked([])
        fence_a = await a.acquire(TOPIC)
        assert fence_a is not None
        await commit.apply(sa, TOPIC.managed_ledger, add_property("by", "a"), fence_a)

        before = sa.session_id
        await asyncio.to_thread(expire_session, zk_server, sa)
        await until(lambda: {TOPIC: Revoke.LOST} in told, 20, "a to learn its session is lost")
        await until(lambda: sa.session_id not in (None, before), 20, "a's new session")
        assert await a.revoked([TOPIC]) == {TOPIC: Revoke.LOST}

        b = ClusterOwnership(sb, "b", sessions=sb)
        await b.revoked([])
        assert b.members == ("a", "b")  # a rejoined with its new session ...
        # ... and is the partitioner's choice or not; either way b may take the topic only
        # because a's owner node went with a's old session
        await a.revoked([])
        owner = a.owner_for(TOPIC)
        taker, taker_store = (a, sa) if owner == "a" else (b, sb)
        fence_new = await taker.acquire(TOPIC)
        assert fence_new is not None and fence_new.epoch == 2  # type: ignore[attr-defined]

        with pytest.raises(Fenced):  # a's late commit, under its old epoch
            await commit.apply(sa, TOPIC.managed_ledger, add_property("late", "a"), fence_a)
        await commit.apply(taker_store, TOPIC.managed_ledger, add_property("by", "new"),
                           fence_new)
        info, _ = await managed_ledger.load(sb, TOPIC.managed_ledger)
        assert [(p.key, p.value) for p in info.properties] == [("by", "a"), ("by", "new")]
    finally:
        await sa.close()
        await sb.close()
