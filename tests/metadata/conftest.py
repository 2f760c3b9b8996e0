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
from typing import Protocol

import pytest

from offloadd.metadata.base import MetadataStore, Sessions
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


# ---- optional capabilities ---------------------------------------------------------------------


class SessionStore(MetadataStore, Sessions, Protocol):
    """A store whose ephemeral nodes live in a session that can be suspended and lost."""


# Opens a session on a fresh store, and a way to make the backend end that session from outside
# (blocking; what a network partition longer than the session timeout does).
SessionFactory = Callable[[pytest.FixtureRequest],
                          Awaitable[tuple[SessionStore, Callable[[], None]]]]


async def _zookeeper_session(
        request: pytest.FixtureRequest) -> tuple[SessionStore, Callable[[], None]]:
    from kazoo.client import KazooClient

    from offloadd.metadata.zookeeper import ZooKeeperMetadataStore

    hosts = request.getfixturevalue("zk_server")
    store = await ZooKeeperMetadataStore.open(f"zk://{hosts}/contract/{uuid.uuid4().hex}",
                                              session_timeout_s=2.0, connect_timeout_s=10.0)

    def expire() -> None:
        # kazoo's test trick: a second client joins the session, then closes it
        twin = KazooClient(hosts=hosts, client_id=store.client.client_id, timeout=4.0)
        twin.start(timeout=10)
        twin.stop()
        twin.close()

    return store, expire


# Register HERE every implementation that declares Sessions.
SESSIONS = [pytest.param(_zookeeper_session, id="zookeeper", marks=pytest.mark.integration)]


@pytest.fixture(params=SESSIONS)
async def session_store(
        request: pytest.FixtureRequest) -> AsyncIterator[tuple[SessionStore, Callable[[], None]]]:
    factory: SessionFactory = request.param
    store, expire = await factory(request)
    yield store, expire
    await store.close()
