"""Fixtures for the metadata-store contract suite.

Every implementation is reached through an *opener*: a zero-argument coroutine function that
opens a new session (a new store instance) on the same backing data. The contract tests use it to
play several clients at once (ephemeral nodes of one session vanishing for another, concurrent
compare-and-set).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from offloadd.metadata.base import MetadataStore
from offloadd.metadata.embedded import EmbeddedMetadataStore
from offloadd.metadata.memory import MemoryMetadataStore, MemoryTree
from tests.fixtures.zookeeper import zk_ensemble, zk_server  # noqa: F401  (fixtures)

Opener = Callable[[], Awaitable[MetadataStore]]
# Builds an opener for one test; may pull other fixtures through request.getfixturevalue (a
# server, say) and register clean-up with request.addfinalizer.
OpenerFactory = Callable[[pytest.FixtureRequest, Path], Opener]


def _memory(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    tree = MemoryTree()

    async def open_session() -> MetadataStore:
        return MemoryMetadataStore(tree)

    return open_session


def _embedded(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    async def open_session() -> MetadataStore:
        return await EmbeddedMetadataStore.open(tmp_path / "metadata")

    return open_session


# Register new implementations HERE: one pytest.param per implementation, whose value is an
# OpenerFactory. Mark ones that start real servers, e.g. for ZooKeeper:
#     pytest.param(_zookeeper, id="zookeeper", marks=pytest.mark.integration)
# where _zookeeper(request, tmp_path) gets the server with request.getfixturevalue(...) and
# returns an opener connecting a new client under a chroot unique to the test.
def _zookeeper(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    from offloadd.metadata.zookeeper import ZooKeeperMetadataStore

    url = f"zk://{request.getfixturevalue('zk_server')}/contract/{uuid.uuid4().hex}"

    async def open_session() -> MetadataStore:
        return await ZooKeeperMetadataStore.open(url, session_timeout_s=4.0,
                                                 connect_timeout_s=10.0)

    return open_session


IMPLEMENTATIONS = [
    pytest.param(_memory, id="memory"),
    pytest.param(_embedded, id="embedded"),
    pytest.param(_zookeeper, id="zookeeper", marks=pytest.mark.integration),
]


@pytest.fixture(params=IMPLEMENTATIONS)
async def open_session(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Opener]:
    """Opens sessions on one fresh, empty store; closes whatever is still open afterwards."""
    factory: OpenerFactory = request.param
    opener = factory(request, tmp_path)
    opened: list[MetadataStore] = []

    async def open_tracked() -> MetadataStore:
        store = await opener()
        opened.append(store)
        return store

    yield open_tracked
    for store in opened:
        await store.close()


@pytest.fixture
async def store(open_session: Opener) -> MetadataStore:
    return await open_session()
