"""The ZooKeeper store against real servers: what the contract suite cannot show.

Chroots, digest ACLs and secrecy, connecting to nothing, watches, session expiry with fencing,
and a leader crash in a three-node ensemble. The generic semantics run in ``test_contract.py``.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from kazoo.client import KazooClient

from offloadd.commit import epochs
from offloadd.commit.fence import EpochFence
from offloadd.errors import Conflict, Fatal, Fenced, NotFound, OffloaddError, Retriable
from offloadd.metadata import cas
from offloadd.metadata.base import CreateOp, SetOp, Versioned
from offloadd.metadata.zookeeper import (
    DigestAcl,
    SessionState,
    ZooKeeperMetadataStore,
    ZooKeeperUrl,
)
from offloadd.model.keys import owner_path
from tests.fixtures.zookeeper import ZooKeeperEnsemble, free_port

ML = "public/default/persistent/orders"
SECRET = "s3cr3t-pa55word"


def chroot() -> str:
    return f"/zk-test/{uuid.uuid4().hex}"


@pytest.fixture
async def open_store(zk_server: str) -> AsyncIterator[Callable[..., Awaitable[
        ZooKeeperMetadataStore]]]:
    """Opens stores on the session server; closes them after the test."""
    opened: list[ZooKeeperMetadataStore] = []

    async def open_(path: str, **kwargs: Any) -> ZooKeeperMetadataStore:
        kwargs.setdefault("session_timeout_s", 4.0)
        kwargs.setdefault("connect_timeout_s", 10.0)
        store = await ZooKeeperMetadataStore.open(f"zk://{zk_server}{path}", **kwargs)
        opened.append(store)
        return store

    yield open_
    for store in opened:
        await store.close()


def kazoo_client(hosts: str, auth: str | None = None) -> KazooClient:
    """A plain kazoo client, digest-authenticated if ``auth`` (blocking; use from a thread)."""
    client = KazooClient(hosts=hosts, timeout=4.0,
                         auth_data=[("digest", auth)] if auth is not None else None)
    client.start(timeout=10)
    return client


async def eventually(check: Callable[[], Awaitable[bool]], within: float = 15.0) -> None:
    """Poll until ``check`` holds (the state lives in ZooKeeper: there is no event to await)."""
    async with asyncio.timeout(within):
        while not await check():
            await asyncio.sleep(0.05)


class TestUrl:
    """zk:// urls name the hosts and an optional chroot."""

    def test_hosts_ports_and_chroot_are_parsed(self) -> None:
        url = ZooKeeperUrl.parse("zk://a:2182,b,[::1]:2183/pulsar/offloadd/")
        assert url.hosts == (("a", 2182), ("b", 2181), ("::1", 2183))
        assert url.chroot == "/pulsar/offloadd"
        assert url.connect_string == "a:2182,b:2181,[::1]:2183"

    def test_no_chroot_means_the_root(self) -> None:
        assert ZooKeeperUrl.parse("zk://h:1").chroot == ""
        assert ZooKeeperUrl.parse("zk://h:1/").chroot == ""

    @pytest.mark.parametrize("url", ["http://h:2181", "zk://h:99999", "zk://h:x/a",
                                     "zk:///a", "zk://h//a", "zk://h/a/../b"])
    def test_malformed_urls_are_refused(self, url: str) -> None:
        with pytest.raises(ValueError, match="ZooKeeper url"):
            ZooKeeperUrl.parse(url)

    @pytest.mark.timeout(10)
    async def test_open_with_a_malformed_url_is_fatal(self) -> None:
        with pytest.raises(Fatal, match="zk://"):
            await ZooKeeperMetadataStore.open("zookeeper:2181")


class TestConnecting:
    """Opening fails within the connect timeout, naming what to check."""

    @pytest.mark.timeout(20)
    async def test_unreachable_servers_fail_within_the_connect_timeout(self) -> None:
        port = free_port()  # nothing listens here
        async with asyncio.timeout(10):
            with pytest.raises(Retriable) as caught:
                await ZooKeeperMetadataStore.open(f"zk://127.0.0.1:{port}/x",
                                                  connect_timeout_s=1.0,
                                                  acl=DigestAcl("u", SECRET))
        message = str(caught.value)
        assert f"127.0.0.1:{port}" in message
        assert "running and reachable" in message
        assert SECRET not in message


@pytest.mark.integration
@pytest.mark.timeout(30)
class TestChroot:
    """Each store sees only its chroot, which is created on open."""

    async def test_nested_chroot_is_created_and_isolates_stores(
            self, open_store: Callable[..., Awaitable[ZooKeeperMetadataStore]],
            zk_server: str) -> None:
        base = chroot()
        first = await open_store(f"{base}/one/deep")
        second = await open_store(f"{base}/two")
        await first.create("/a/b", b"first")
        await second.create("/a/b", b"second")
        assert await first.get("/a/b") == Versioned(b"first", 0)
        assert await second.get("/a/b") == Versioned(b"second", 0)
        assert await first.children("/") == ["a"]
        root = await open_store("")
        assert await root.children(base) == ["one", "two"]
        assert await root.get(f"{base}/one/deep/a/b") == Versioned(b"first", 0)

    async def test_sequential_and_multi_results_are_relative_to_the_chroot(
            self, open_store: Callable[..., Awaitable[ZooKeeperMetadataStore]]) -> None:
        store = await open_store(chroot())
        await store.create("/q", b"")
        assert await store.create("/q/n-", b"", sequential=True) == "/q/n-0000000000"
        assert await store.multi([CreateOp("/q/m", b"")]) == ["/q/m"]

    async def test_failed_multi_names_the_failing_op(
            self, open_store: Callable[..., Awaitable[ZooKeeperMetadataStore]]) -> None:
        store = await open_store(chroot())
        await store.create("/a", b"")
        with pytest.raises(Conflict, match=r"multi op 1 \(set /a at version 5\)"):
            await store.multi([CreateOp("/b", b""), SetOp("/a", b"x", 5)])
        with pytest.raises(NotFound, match="multi op 0"):
            await store.multi([SetOp("/missing", b"")])

    async def test_recursive_delete_checks_the_version_and_existence(
            self, open_store: Callable[..., Awaitable[ZooKeeperMetadataStore]]) -> None:
        store = await open_store(chroot())
        await store.create("/p/c", b"")
        await store.set("/p", b"v1")
        with pytest.raises(Conflict):
            await store.delete("/p", 0, recursive=True)
        await store.delete("/p", 1, recursive=True)
        with pytest.raises(NotFound):
            await store.delete("/p", recursive=True)

    async def test_a_closed_store_refuses_calls(
            self, open_store: Callable[..., Awaitable[ZooKeeperMetadataStore]]) -> None:
        store = await open_store(chroot())
        await store.close()
        with pytest.raises(Fatal, match="closed"):
            await store.get("/")


@pytest.mark.integration
@pytest.mark.timeout(30)
class TestDigestAcl:
    """Nodes carry the digest ACL; others cannot write them; the password never leaks."""

    async def test_created_nodes_carry_the_digest_acl(
            self, open_store: Callable[..., Awaitable[ZooKeeperMetadataStore]],
            zk_server: str) -> None:
        base = chroot()
        store = await open_store(base, acl=DigestAcl("offloadd", SECRET))
        await store.create("/a/b", b"x")
        await store.multi([CreateOp("/a/c", b"")])
        # Reading an ACL needs READ or ADMIN on the node, so this client authenticates too.
        client = await asyncio.to_thread(kazoo_client, zk_server, f"offloadd:{SECRET}")
        try:
            for path in [base, f"{base}/a", f"{base}/a/b", f"{base}/a/c"]:
                acls, _ = await asyncio.to_thread(client.get_acls, path)
                assert [(a.id.scheme, a.id.id.split(":")[0], a.perms) for a in acls] == [
                    ("digest", "offloadd", 31)], path
        finally:
            await asyncio.to_thread(client.stop)
            await asyncio.to_thread(client.close)

    async def test_an_unauthenticated_store_can_neither_read_nor_write(
            self, open_store: Callable[..., Awaitable[ZooKeeperMetadataStore]]) -> None:
        base = chroot()
        owner = await open_store(base, acl=DigestAcl("offloadd", SECRET))
        await owner.create("/a", b"x")
        stranger = await open_store(base)
        with pytest.raises(Fatal, match="not authorized"):
            await stranger.set("/a", b"y")
        with pytest.raises(Fatal, match="not authorized"):
            await stranger.get("/a")
        assert await owner.get("/a") == Versioned(b"x", 0)

    async def test_world_readable_acl_lets_others_read_only(
            self, open_store: Callable[..., Awaitable[ZooKeeperMetadataStore]]) -> None:
        base = chroot()
        owner = await open_store(base, acl=DigestAcl("offloadd", SECRET, world_readable=True))
        await owner.create("/a", b"x")
        reader = await open_store(base)
        assert await reader.get("/a") == Versioned(b"x", 0)
        with pytest.raises(Fatal):
            await reader.delete("/a")

    async def test_password_is_absent_from_repr_logs_and_errors(
            self, open_store: Callable[..., Awaitable[ZooKeeperMetadataStore]],
            caplog: pytest.LogCaptureFixture) -> None:
        caplog.set_level(1)  # everything, kazoo's DEBUG and BLATHER included
        # logs.configure() (run by an earlier test of the same process) holds the client
        # libraries' loggers at WARNING: open them up for this test only
        for name in ("kazoo", "offloadd.metadata.zookeeper.kazoo"):
            caplog.set_level(1, logger=name)
        acl = DigestAcl.parse(f"offloadd:{SECRET}")
        store = await open_store(chroot(), acl=acl)
        await store.create("/a", b"")
        errors: list[OffloaddError] = []
        for failing in (store.create("/a", b""), store.get("/missing"),
                        store.multi([SetOp("/a", b"", 9)])):
            with pytest.raises(OffloaddError) as caught:
                await failing
            errors.append(caught.value)
        # kazoo did log its auth request; the filter blanked the credential in it.
        assert any("Auth(" in r.getMessage() and "***" in r.getMessage() for r in caplog.records)
        for text in [caplog.text, repr(store), repr(acl), str(acl), *map(str, errors)]:
            assert SECRET not in text
        assert "offloadd" in repr(store)


@pytest.mark.integration
@pytest.mark.timeout(30)
class TestWatches:
    """Watches deliver the current state on the event loop, now and after each change."""

    async def test_children_watch_sees_creation_changes_and_deletion(
            self, open_store: Callable[..., Awaitable[ZooKeeperMetadataStore]]) -> None:
        store = await open_store(chroot())
        seen: list[list[str] | None] = []
        threads: set[int] = set()

        def on_children(names: list[str] | None) -> None:
            threads.add(threading.get_ident())
            seen.append(names)

        watch = await store.watch_children("/p", on_children)
        assert seen == [None]
        await store.create("/p", b"")
        await eventually(lambda: _is(seen, [None, []]))
        await store.create("/p/b", b"")
        await eventually(lambda: _is(seen[-1:], [["b"]]))
        await store.create("/p/a", b"")
        await eventually(lambda: _is(seen[-1:], [["a", "b"]]))
        await store.delete("/p", recursive=True)
        await eventually(lambda: _is(seen[-1:], [None]))
        assert threads == {threading.get_ident()}
        watch.cancel()
        await store.create("/p", b"")
        await asyncio.sleep(0.3)
        assert seen[-1] is None

    async def test_data_watch_delivers_versions_and_async_callbacks_run(
            self, open_store: Callable[..., Awaitable[ZooKeeperMetadataStore]]) -> None:
        store = await open_store(chroot())
        await store.create("/n", b"v0")
        seen: list[Versioned | None] = []

        async def on_data(node: Versioned | None) -> None:
            await asyncio.sleep(0)
            seen.append(node)

        await store.watch_data("/n", on_data)
        await store.set("/n", b"v1")
        await eventually(lambda: _is(seen, [Versioned(b"v0", 0), Versioned(b"v1", 1)]))


async def _is(value: object, expected: object) -> bool:
    return value == expected


@pytest.mark.integration
@pytest.mark.timeout(40)
class TestSessionExpiry:
    """An expired session is LOST: its owner node is gone, its epoch fenced, its watches kept."""

    async def test_expired_owner_is_fenced_by_the_next_owner(
            self, open_store: Callable[..., Awaitable[ZooKeeperMetadataStore]],
            zk_server: str) -> None:
        base = chroot()
        a = await open_store(base, session_timeout_s=2.0)
        b = await open_store(base)
        states: list[SessionState] = []
        a.add_session_listener(states.append)
        stale = await epochs.try_acquire(a, ML, "daemon-a")
        assert stale == 1
        await a.create("/segments/s1", b"assigned")
        seen: list[list[str] | None] = []
        await a.watch_children("/segments", seen.append)
        old_session = a.session_id
        assert old_session is not None

        await asyncio.to_thread(expire_session, a, zk_server)
        await eventually(lambda: _is(SessionState.LOST in states, True))
        await eventually(lambda: _not(b.exists(owner_path(ML))))
        assert await epochs.try_acquire(b, ML, "daemon-b") == 2

        # kazoo reconnects A with a new session; A is usable but no longer the owner.
        async with asyncio.timeout(15):
            await a.connected_event.wait()
        assert a.session_state is SessionState.CONNECTED
        assert a.session_id not in (None, old_session)
        fence = EpochFence(a, ML, stale)
        with pytest.raises(Fenced):
            await cas.update(a, "/segments/s1", lambda node: b"stale",
                             guard=fence.guard_ops(), on_conflict=fence.verify)
        assert await b.get("/segments/s1") == Versioned(b"assigned", 0)
        assert states[-1] is SessionState.CONNECTED
        assert await epochs.current_owner(a, ML) == "daemon-b"
        # The watch was re-armed on the new session.
        await b.create("/segments/s2", b"")
        await eventually(lambda: _is(seen[-1:], [["s1", "s2"]]))


def expire_session(store: ZooKeeperMetadataStore, hosts: str) -> None:
    """kazoo's test trick: a second client joins the session, then closes it (blocking)."""
    client_id = store._zk.client_id
    assert client_id is not None
    twin = KazooClient(hosts=hosts, client_id=client_id, timeout=4.0)
    twin.start(timeout=10)
    twin.stop()
    twin.close()


async def _not(check: Awaitable[bool]) -> bool:
    return not await check


@pytest.mark.integration
@pytest.mark.timeout(60)
class TestEnsemble:
    """With three servers, killing the leader interrupts the store only until re-election."""

    async def test_operations_continue_after_the_leader_is_killed(
            self, zk_ensemble: Callable[[int], ZooKeeperEnsemble]) -> None:
        ensemble = await asyncio.to_thread(zk_ensemble, 3)
        store = await ZooKeeperMetadataStore.open(f"zk://{ensemble.hosts}/ens",
                                                  session_timeout_s=5.0)
        try:
            states: list[SessionState] = []
            store.add_session_listener(states.append)
            await store.create("/counter", b"0")
            leader = await asyncio.to_thread(ensemble.leader)
            await asyncio.to_thread(leader.kill)
            # Every member drops its clients when the quorum loses its leader.
            await eventually(lambda: _is(SessionState.SUSPENDED in states, True))

            async def write(value: bytes) -> None:
                # Compare-and-set from the previous value; after an ambiguous failure the
                # re-read tells whether the write landed, so no value is written twice.
                while True:
                    try:
                        node = await store.get("/counter")
                        if node.data == value:
                            return
                        await store.set("/counter", value, node.version)
                        return
                    except Retriable:
                        await asyncio.sleep(0.1)
                    except Conflict:
                        continue

            async with asyncio.timeout(40):
                for i in range(1, 6):
                    await write(str(i).encode())
            assert await store.get("/counter") == Versioned(b"5", 5)
            assert store.session_state is SessionState.CONNECTED
            new_leader = await asyncio.to_thread(ensemble.leader)
            assert new_leader is not leader
            # The crashed member rejoins as a follower and serves the same data.
            await asyncio.to_thread(ensemble.restart, leader)
            assert leader.mode() == "follower"
            rejoined = await ZooKeeperMetadataStore.open(f"zk://{leader.address}/ens")
            try:
                assert await rejoined.get("/counter") == Versioned(b"5", 5)
            finally:
                await rejoined.close()
        finally:
            await store.close()
