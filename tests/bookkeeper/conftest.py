"""A Pulsar-shaped cluster per test: a real ZooKeeper (the session's shared server, one chroot
for Pulsar's tree and another for offloadd's catalog), three fake bookies and a writer.

The bookies are of mixed versions, as during a rolling upgrade: two answer batched reads
(BookKeeper 4.17+), the third never answers one and logs an ERROR for it, as BookKeeper 4.15
does (its v2 decoder throws on the unknown opcode and leaves the connection open).

Pulsar's nodes are created with a digest ACL (``pulsar:broker-secret``) plus world-read, as a
secured cluster would grant a sidecar: offloadd connects without credentials, so any write it
attempted there would fail loudly with ``NoAuth``.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from offloadd.ledger.bookkeeper import (
    BookKeeperLedgerSource,
    BookKeeperOptions,
    ClientOptions,
    ReplicaPolicy,
)
from offloadd.metadata.zookeeper import DigestAcl, ZooKeeperMetadataStore
from tests.bookkeeper.cluster import FakePulsar
from tests.fixtures.fake_bookie import FakeBookie
from tests.fixtures.zookeeper import zk_ensemble, zk_server  # noqa: F401  (fixtures)

PULSAR_ACL = DigestAcl("pulsar", "broker-secret", world_readable=True)


@dataclass
class Cluster:
    hosts: str
    pulsar_url: str
    offloadd_url: str
    pulsar: FakePulsar
    bookies: list[FakeBookie]
    ours: ZooKeeperMetadataStore

    def source(self, **kw: object) -> BookKeeperLedgerSource:
        opts: dict[str, object] = dict(
            pulsar_zk=self.pulsar_url, session_timeout_s=4.0, connect_timeout_s=10.0,
            client=ClientOptions(read_timeout_s=1.0, connect_timeout_s=1.0,
                                 replicas=ReplicaPolicy(quarantine_s=5.0)))
        opts.update(kw)
        return BookKeeperLedgerSource(BookKeeperOptions(**opts), self.ours)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def open_cluster(hosts: str, bookies: int = 3, old_bookies: int = 1,
                       **pulsar: Any) -> AsyncIterator[Cluster]:
    """A cluster of ``bookies`` fake bookies on the ZooKeeper at ``hosts``, the last
    ``old_bookies`` of them without batched reads; ``pulsar`` sets :class:`FakePulsar`
    fields."""
    tag = uuid.uuid4().hex[:12]
    pulsar_url = f"zk://{hosts}/pulsar-{tag}"
    offloadd_url = f"zk://{hosts}/offloadd-{tag}"
    writer = await ZooKeeperMetadataStore.open(pulsar_url, session_timeout_s=4.0,
                                               connect_timeout_s=10.0, acl=PULSAR_ACL)
    ours = await ZooKeeperMetadataStore.open(offloadd_url, session_timeout_s=4.0,
                                             connect_timeout_s=10.0)
    started = [await FakeBookie(batch_reads="silent" if i >= bookies - old_bookies else "yes"
                                ).start() for i in range(bookies)]
    fake = FakePulsar(writer, started, **pulsar)
    await fake.setup()
    try:
        yield Cluster(hosts, pulsar_url, offloadd_url, fake, started, ours)
    finally:
        for b in started:
            b.thaw()
        await fake.close()
        for b in started:
            await b.kill()
        await asyncio.gather(writer.close(), ours.close(), return_exceptions=True)


@pytest.fixture
async def cluster(zk_server: str) -> AsyncIterator[Cluster]:  # noqa: F811
    async with open_cluster(zk_server) as c:
        yield c
