"""The ZooKeeper store: :class:`ZooKeeperMetadataStore` (one session; the protocol's operations)."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Literal

from kazoo.client import KazooClient
from kazoo.exceptions import RolledBackError, RuntimeInconsistency
from kazoo.retry import KazooRetry

from offloadd.errors import Conflict, Fatal, NotFound, OffloaddError, Retriable
from offloadd.metadata.base import (
    BatchedMulti,
    BatchedReads,
    CheckOp,
    CreateOp,
    DeleteOp,
    GroupResult,
    MetadataStore,
    Op,
    Sessions,
    SetOp,
    Versioned,
)
from offloadd.metadata.nodes import check_path
from offloadd.metadata.zookeeper.acl import DigestAcl, kazoo_logger, release_logger
from offloadd.metadata.zookeeper.bridge import Bridge
from offloadd.metadata.zookeeper.errors import describe, translate
from offloadd.metadata.zookeeper.session import Session, SessionListener, SessionState
from offloadd.metadata.zookeeper.url import ZooKeeperUrl
from offloadd.metadata.zookeeper.watch import ChildrenCallback, DataCallback, Watch

log = logging.getLogger(__name__)

# Largest subtree a recursive delete removes in one atomic multi; beyond it the descendants go in
# batches and only the last batch (with the node itself, at its version) is atomic. ZooKeeper
# caps a request at jute.maxbuffer (1 MiB by default), which a few thousand deletes approach.
_ATOMIC_DELETE_LIMIT = 1000
# Reads get_many keeps outstanding on the session at once.
_READS_IN_FLIGHT = 256
# how long closing a session waits for the server (see ZooKeeperMetadataStore.close): a
# healthy server answers in milliseconds, but on a loaded machine one close took over 1 s
CLOSE_TIMEOUT_S = 2.0


class ZooKeeperMetadataStore(MetadataStore, Sessions, BatchedMulti, BatchedReads):
    """One ZooKeeper session. Open with :meth:`open`; the constructor is internal."""

    def __init__(self, *, url: ZooKeeperUrl, client: KazooClient, acl: DigestAcl | None,
                 loop: asyncio.AbstractEventLoop, op_timeout_s: float,
                 kazoo_logger: logging.Logger) -> None:
        self._url = url
        self._zk = client
        self._digest = acl
        self._acls = acl.acls() if acl is not None else None
        self._kazoo_logger = kazoo_logger
        self.bridge = Bridge(loop, op_timeout_s, lambda: self._session.state.value)
        self._session = Session(self.bridge, url, client, self._rearm_watches)
        self.watches: set[Watch] = set()
        self._closed = False

    # -- lifecycle ------------------------------------------------------------------------

    @classmethod
    async def open(cls, url: str, *, session_timeout_s: float = 10.0,
                   connect_timeout_s: float = 10.0, op_timeout_s: float | None = None,
                   acl: DigestAcl | None = None,
                   auth: Sequence[tuple[str, str]] = (),
                   create_chroot: bool = True) -> ZooKeeperMetadataStore:
        """Connect, authenticate, create the chroot if missing (``NotFound`` instead when
        ``create_chroot`` is False: the read-only commands never create anything).

        ``session_timeout_s`` is asked of the server (which clamps it to 2..20 tick times).
        Fails with ``Retriable`` when no server answers within ``connect_timeout_s``.
        ``op_timeout_s`` (default: the session timeout) bounds every call. ``auth`` adds
        ``(scheme, credential)`` pairs beyond the ACL's own digest, e.g. to read a broker's
        protected nodes; credentials are treated as secrets like the password.
        """
        try:
            parsed = ZooKeeperUrl.parse(url)
        except ValueError as exc:
            raise Fatal(str(exc)) from None
        auth_data = [(scheme, cred) for scheme, cred in auth]
        if acl is not None:
            auth_data.append(("digest", acl.credential))
        secrets = [cred for _, cred in auth_data]
        if acl is not None:
            secrets.append(acl.password)
        logger = kazoo_logger(secrets)
        retry = KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0)
        client = KazooClient(
            hosts=parsed.connect_string,
            timeout=session_timeout_s,
            connection_retry=retry,
            command_retry=KazooRetry(max_tries=0),
            auth_data=auth_data,
            default_acl=acl.acls() if acl is not None else None,
            logger=logger,
        )
        store = cls(url=parsed, client=client, acl=acl, loop=asyncio.get_running_loop(),
                    op_timeout_s=op_timeout_s if op_timeout_s is not None else session_timeout_s,
                    kazoo_logger=logger)
        client.add_listener(store._session.kazoo_listener)
        try:
            await asyncio.to_thread(client.start_async)
            try:
                async with asyncio.timeout(connect_timeout_s):
                    await store._session.connected.wait()
            except TimeoutError:
                raise Retriable(
                    f"could not connect to ZooKeeper at {parsed.connect_string} within "
                    f"{connect_timeout_s:g}s: check that the servers are running and reachable "
                    "from this host and that the [metadata] url lists their client ports"
                ) from None
            await store._ensure_chroot(create=create_chroot)
        except BaseException:
            store._abandon()
            raise
        log.info("connected to ZooKeeper %s (session 0x%x)", parsed, store.session_id or 0)
        return store

    async def _ensure_chroot(self, create: bool = True) -> None:
        chroot = self._url.chroot
        if not chroot:
            return
        zk = self._zk
        parts = chroot.split("/")[1:]
        # Deepest first: usually the chroot exists and one read settles it. Existing ancestors
        # are never re-created, since that needs CREATE on their parents, which a shared
        # ZooKeeper's owners (e.g. Pulsar's /) may not grant us.
        prefixes = ["/" + "/".join(parts[:i]) for i in range(len(parts), 0, -1)]
        missing: list[str] = []
        for prefix in prefixes:
            stat = await self.bridge.call(partial(zk.exists_async, prefix), "exists", prefix)
            if stat is not None:
                break
            missing.append(prefix)
        if missing and not create:
            raise NotFound(f"ZooKeeper {self._url.connect_string} has no {chroot}: nothing has "
                           "been offloaded with this [metadata] url")
        for prefix in reversed(missing):
            try:
                await self.bridge.call(partial(zk.create_async, prefix, b"", acl=self._acls),
                                       "create", prefix)
            except Conflict:
                continue
            except Fatal as exc:
                raise Fatal(f"cannot create the chroot {chroot} of the ZooKeeper url: "
                            f"{exc}") from None

    async def close(self, *, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """End the session (our ephemeral nodes vanish). Listeners are not told.

        A server that has not answered the close within ``timeout_s`` (hung, unreachable) is
        not waited for: the client goes on stopping in a thread of its own and the session's
        ephemeral nodes go when it expires. A daemon stopping while ZooKeeper hung spent ~5 s
        per session here (it has three), after its stop's deadline
        (``tests/bookkeeper/test_stop.py``)."""
        if self._closed:
            return
        self._closed = self._session.closed = True
        for watch in list(self.watches):
            watch.cancel()
        self._zk.remove_listener(self._session.kazoo_listener)
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[None] = loop.create_future()
        client, logger = self._zk, self._kazoo_logger

        def settle(exc: BaseException | None) -> None:
            if ended.done():
                return
            if exc is None:
                ended.set_result(None)
            else:
                ended.set_exception(exc)

        def stop() -> None:  # a thread of its own: the interpreter's exit does not wait for it
            exc: BaseException | None = None
            try:
                client.stop()
                client.close()
            except Exception as e:
                exc = e
            finally:
                release_logger(logger)
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                    loop.call_soon_threadsafe(settle, exc)

        threading.Thread(target=stop, name="offloadd-zk-close", daemon=True).start()
        try:
            await asyncio.wait_for(asyncio.shield(ended), timeout_s)
        except TimeoutError:
            log.warning("ZooKeeper %s: no answer to the session's close within %gs; not "
                        "waiting (its ephemeral nodes go when the session expires)",
                        self._url, timeout_s)
        finally:
            self._session.ended()
            self.bridge.cancel()

    def _abandon(self) -> None:
        """Stop a client that failed to open without waiting for it.

        kazoo's ``stop`` waits for its connection thread, which may sit in a TCP connect to an
        unresponsive address for up to the session timeout; a failed open must not.
        """
        self._closed = self._session.closed = True
        self._zk.remove_listener(self._session.kazoo_listener)
        client, logger = self._zk, self._kazoo_logger

        def stop() -> None:
            try:
                client.stop()
                client.close()
            except Exception:  # best effort: the client is being thrown away
                log.debug("stopping an abandoned ZooKeeper client failed", exc_info=True)
            finally:
                release_logger(logger)

        threading.Thread(target=stop, name="offloadd-zk-abandon", daemon=True).start()

    @property
    def url(self) -> ZooKeeperUrl:
        return self._url

    def __repr__(self) -> str:
        user = f", user={self._digest.username!r}" if self._digest is not None else ""
        state = "closed" if self._closed else self._session.state.value
        return (f"ZooKeeperMetadataStore(hosts={self._url.connect_string!r}, "
                f"chroot={self._url.chroot or '/'!r}{user}, state={state})")

    # -- session (the Sessions capability) -----------------------------------------------------

    @property
    def session_state(self) -> SessionState:
        """``connected``, ``suspended`` or ``lost`` (see :mod:`.session`)."""
        return self._session.state

    def add_session_listener(self, listener: SessionListener) -> Callable[[], None]:
        """Call ``listener(state)`` on the event loop at each transition; returns the remover."""
        return self._session.add_listener(listener)

    @property
    def session_id(self) -> int | None:
        """The current session's id while connected (it changes after ``lost``)."""
        return self._session.id

    @property
    def connected_event(self) -> asyncio.Event:
        """Set while the session is connected; await ``.wait()`` to wait for a reconnect."""
        return self._session.connected

    def _rearm_watches(self) -> None:
        for watch in list(self.watches):
            if not watch.armed:
                watch.rearm()

    # -- watches ---------------------------------------------------------------------------

    async def watch_children(self, path: str, callback: ChildrenCallback) -> Watch:
        """Deliver ``path``'s sorted child names (``None`` while absent) now and on change."""
        return await self._watch(path, "children", callback)

    async def watch_data(self, path: str, callback: DataCallback) -> Watch:
        """Deliver ``path``'s bytes and version (``None`` while absent) now and on change."""
        return await self._watch(path, "data", callback)

    async def _watch(self, path: str, kind: Literal["children", "data"],
                     callback: Callable[[Any], object]) -> Watch:
        self._check_open()
        check_path(path)
        watch = Watch(self, path, kind, callback)
        self.watches.add(watch)
        try:
            await watch.arm()
        except BaseException:
            watch.cancel()
            raise
        return watch

    # -- the protocol ----------------------------------------------------------------------

    async def get(self, path: str) -> Versioned:
        full = self.absolute(path)
        data, stat = await self.call(lambda: self._zk.get_async(full), "get", path)
        return Versioned(bytes(data or b""), stat.version, stat.mzxid)

    async def exists(self, path: str) -> bool:
        full = self.absolute(path)
        return await self.call(lambda: self._zk.exists_async(full), "exists", path) is not None

    async def create(self, path: str, data: bytes, *, ephemeral: bool = False,
                     sequential: bool = False, make_parents: bool = True) -> str:
        full = self.absolute(path)
        if path == "/":
            raise Conflict("metadata node / already exists")
        created = await self.call(
            lambda: self._zk.create_async(full, bytes(data), acl=self._acls, ephemeral=ephemeral,
                                          sequence=sequential, makepath=make_parents),
            "create", path)
        return self._url.relative(created)

    async def set(self, path: str, data: bytes, version: int = -1) -> int:
        full = self.absolute(path)
        stat = await self.call(lambda: self._zk.set_async(full, bytes(data), version),
                               "set", path)
        return int(stat.version)

    async def delete(self, path: str, version: int = -1, *, recursive: bool = False) -> None:
        full = self.absolute(path)
        if path == "/":
            raise Fatal("the root metadata node cannot be deleted")
        if not recursive:
            await self.call(lambda: self._zk.delete_async(full, version), "delete", path)
            return
        await self._delete_recursive(path, version)

    async def children(self, path: str) -> list[str]:
        full = self.absolute(path)
        names = await self.call(lambda: self._zk.get_children_async(full), "children", path)
        return sorted(names)

    async def multi(self, ops: Sequence[Op]) -> list[int | str | None]:
        self._check_open()
        if not ops:
            return []
        results = await self.call(self._transaction(ops).commit_async, "multi", ops[0].path)
        failed = _first_failure(ops, results)
        if failed is not None:
            i, err = failed
            raise type(err)(f"multi op {i} ({describe(ops[i])}) failed: {err}") from None
        return self._outcomes(ops, results)

    async def multi_batch(self, groups: Sequence[Sequence[Op]]) -> list[GroupResult]:
        """Every group's ops in one ZooKeeper ``multi``. ZooKeeper applies a ``multi`` whole or
        not at all, so when an op is refused its group is set aside with that error and the
        others go again in a new ``multi`` (one more round trip per refused group; refusals are
        the exception: a lost compare-and-set race, a fenced owner)."""
        self._check_open()
        out: dict[int, GroupResult] = {i: [] for i, g in enumerate(groups) if not g}
        pending = [i for i, g in enumerate(groups) if g]
        while pending:
            ops: list[Op] = []
            starts: list[int] = []  # where each pending group's ops begin in ``ops``
            for gi in pending:
                starts.append(len(ops))
                ops.extend(groups[gi])
            results = await self.call(self._transaction(ops).commit_async, "multi",
                                      ops[0].path)
            failed = _first_failure(ops, results)
            if failed is None:
                for gi, start in zip(pending, starts, strict=True):
                    n = len(groups[gi])
                    out[gi] = self._outcomes(groups[gi], results[start:start + n])
                break
            i, err = failed
            k = bisect.bisect_right(starts, i) - 1
            gi, local = pending[k], i - starts[k]
            out[gi] = type(err)(f"multi op {local} ({describe(groups[gi][local])}) failed: "
                                f"{err}")
            del pending[k]
        return [out[i] for i in range(len(groups))]

    async def get_many(self, paths: Sequence[str]) -> list[Versioned | None]:
        """The reads sent ``_READS_IN_FLIGHT`` at a time (kazoo pipelines them on the session's
        connection), each batch awaited in order: no task a read."""
        self._check_open()
        get = self._zk.get_async
        out: list[Versioned | None] = []
        for start in range(0, len(paths), _READS_IN_FLIGHT):
            chunk = paths[start:start + _READS_IN_FLIGHT]
            starts = [functools.partial(get, self.absolute(p)) for p in chunk]
            for got in await self.bridge.call_many(starts, "get", chunk):
                if isinstance(got, NotFound):
                    out.append(None)
                elif isinstance(got, OffloaddError):
                    raise got
                else:
                    data, stat = got
                    out.append(Versioned(bytes(data or b""), stat.version, stat.mzxid))
        return out

    def _transaction(self, ops: Sequence[Op]) -> Any:
        txn = self._zk.transaction()
        for op in ops:
            full = self.absolute(op.path)
            if isinstance(op, CreateOp):
                txn.create(full, bytes(op.data), acl=self._acls, ephemeral=op.ephemeral)
            elif isinstance(op, SetOp):
                txn.set_data(full, bytes(op.data), op.version)
            elif isinstance(op, DeleteOp):
                txn.delete(full, op.version)
            elif isinstance(op, CheckOp):
                txn.check(full, op.version)
            else:
                raise Fatal(f"unknown metadata op {op!r}")
        return txn

    def _outcomes(self, ops: Sequence[Op], results: Sequence[Any]) -> list[int | str | None]:
        out: list[int | str | None] = []
        for op, result in zip(ops, results, strict=True):
            if isinstance(op, CreateOp):
                out.append(self._url.relative(result))
            elif isinstance(op, SetOp):
                out.append(int(result.version))
            else:
                out.append(None)
        return out

    # -- helpers ---------------------------------------------------------------------------

    async def _delete_recursive(self, path: str, version: int) -> None:
        """Delete ``path`` and its subtree; atomic (one multi) unless the subtree is huge.

        A concurrent create below the node makes the multi fail (not empty): retried.
        """
        for _ in range(10):
            stat = await self.call(lambda: self._zk.exists_async(self.absolute(path)), "exists",
                                   path)
            if stat is None:
                raise NotFound(f"metadata node {path} does not exist")
            if version != -1 and stat.version != version:
                raise Conflict(f"metadata node {path} is at version {stat.version}, "
                               f"not {version}")
            order = await self._post_order(path)  # children before parents, path itself last
            descendants = order[:-1]
            while len(descendants) > _ATOMIC_DELETE_LIMIT:
                batch, descendants = (descendants[:_ATOMIC_DELETE_LIMIT],
                                      descendants[_ATOMIC_DELETE_LIMIT:])
                with contextlib.suppress(NotFound):
                    await self.multi([DeleteOp(p) for p in batch])
            try:
                await self.multi([*(DeleteOp(p) for p in descendants),
                                  DeleteOp(path, stat.version if version == -1 else version)])
                return
            except (Conflict, NotFound):
                # Something under the node changed meanwhile; look again (a real version
                # mismatch or a vanished node is reported by the checks above).
                continue
        raise Retriable(f"metadata node {path}: its subtree kept changing during a recursive "
                        "delete; gave up after 10 attempts")

    async def _post_order(self, path: str) -> list[str]:
        out: list[str] = []
        try:
            names = await self.children(path)
        except NotFound:
            return out
        base = "" if path == "/" else path
        for name in names:
            out.extend(await self._post_order(f"{base}/{name}"))
        out.append(path)
        return out

    @property
    def client(self) -> KazooClient:
        return self._zk

    def absolute(self, path: str) -> str:
        """``path`` (checked) under the chroot."""
        check_path(path)
        return self._url.absolute(path)

    def _check_open(self) -> None:
        if self._closed:
            raise Fatal("metadata store session is closed")

    async def call(self, start: Callable[[], Any], what: str, path: str) -> Any:
        """One kazoo ``*_async`` call (see :meth:`Bridge.call`), refused once closed."""
        self._check_open()
        return await self.bridge.call(start, what, path)


def _first_failure(ops: Sequence[Op], results: Sequence[Any]
                   ) -> tuple[int, OffloaddError] | None:
    """The op that made a ``multi`` fail and its error, or None if it succeeded. ZooKeeper
    reports the failing op with its own error and every other op as rolled back (or, after
    the failure, as a runtime inconsistency)."""
    errors = [(i, r) for i, r in enumerate(results) if isinstance(r, Exception)]
    if not errors:
        return None
    causes = [(i, r) for i, r in errors
              if not isinstance(r, (RolledBackError, RuntimeInconsistency))]
    i, exc = (causes or errors)[0]
    return i, translate(exc, "multi", ops[i].path)
