"""The :class:`~offloadd.metadata.base.MetadataStore` on ZooKeeper, through kazoo, in asyncio.

URL: ``zk://host1:2181,host2:2181/chroot`` (port defaults to 2181, ``[v6addr]:port`` allowed,
chroot optional). Every path the store is given is under the chroot, which :meth:`open`
creates when missing (with the store's ACL). The chroot is applied here, not by kazoo, so error
messages name the store-relative path the caller used.

Threads. kazoo runs its connection and callbacks in its own threads. Every request uses kazoo's
``*_async`` call; the ``IAsyncResult`` gets a ``rawlink`` callback (run in kazoo's thread) that
hands the outcome to the event loop with ``call_soon_threadsafe``. Blocking kazoo calls (start,
stop, close) run in ``asyncio.to_thread``. Session-state changes and watch events arrive in
kazoo's threads and are likewise re-delivered on the event loop; listeners and watch callbacks
always run there, one at a time, in the order kazoo saw the events.

Errors (nothing from kazoo escapes):

=======================================================  =====================================
``NoNodeError``                                          ``NotFound``
``NodeExistsError``, ``BadVersionError``,                ``Conflict``
``NotEmptyError``
connection loss, session expiry/moved, ZooKeeper or      ``Retriable``
per-call timeout (``op_timeout_s``), no quorum
``NoAuthError``, bad arguments/ACL, closed store, ...    ``Fatal``
=======================================================  =====================================

A failed ``multi`` names the op that failed (ZooKeeper reports the others as rolled back).

Ambiguous writes. A ``Retriable`` from a write (``create``/``set``/``delete``/``multi``) means the
outcome is unknown: the request may have been applied before the connection dropped, and a
request still queued in kazoo when the per-call timeout fires may even be sent after the
reconnect. Callers must re-read and decide, never blindly repeat: a compare-and-set repeated at the
old version fails with ``Conflict`` if the first attempt landed (the re-read shows it did); a
``create`` repeated after success fails with ``Conflict`` (read the node to see whether it is
ours); an ephemeral create is ours only if the node's owner session is ours, so ownership code
compares the stored owner id. Reads are always safe to retry.

Sessions. :attr:`session_state` is ``connected``, ``suspended`` (connection lost, session may
survive: stop committing, keep state) or ``lost`` (session expired: every ephemeral node of
ours is gone, so drop ownership and re-validate before acting again). kazoo reconnects by itself
with a new session after ``lost``; the store stays usable. Listeners added with
:meth:`add_session_listener` see each transition on the event loop (not the initial connect, and
not a deliberate :meth:`close`).

ACL. With a :class:`DigestAcl` every node this store creates (chroot included) carries
``digest:user:<sha1>`` with all permissions, plus world-read when asked; the client authenticates
with the same credentials on every (re)connect. The password never appears in ``repr``, log
records (kazoo logs its auth request at DEBUG; a filter on kazoo's logger redacts it) or error
text.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import inspect
import logging
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

from kazoo.client import KazooClient
from kazoo.exceptions import (
    AuthFailedError,
    BadArgumentsError,
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    InvalidACLError,
    KazooException,
    NewConfigNoQuorumError,
    NoAuthError,
    NoChildrenForEphemeralsError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    OperationTimeoutError,
    RequestTimeoutError,
    RolledBackError,
    RuntimeInconsistency,
    SessionExpiredError,
    SessionMovedError,
    ThrottledOpError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry
from kazoo.security import make_acl, make_digest_acl

from offloadd.errors import Conflict, Fatal, NotFound, OffloaddError, Retriable
from offloadd.logs import secret_pattern
from offloadd.metadata.base import CheckOp, CreateOp, DeleteOp, Op, SetOp, Versioned

log = logging.getLogger(__name__)

DEFAULT_PORT = 2181
# Largest subtree a recursive delete removes in one atomic multi; beyond it the descendants go in
# batches and only the last batch (with the node itself, at its version) is atomic. ZooKeeper
# caps a request at jute.maxbuffer (1 MiB by default), which a few thousand deletes approach.
_ATOMIC_DELETE_LIMIT = 1000


class SessionState(enum.Enum):
    CONNECTED = "connected"
    SUSPENDED = "suspended"
    LOST = "lost"


SessionListener = Callable[[SessionState], object]
ChildrenCallback = Callable[[list[str] | None], object]
DataCallback = Callable[[Versioned | None], object]


@dataclass(frozen=True)
class DigestAcl:
    """``digest`` credentials: the ACL on every node we create, and the client's identity."""

    username: str
    password: str = field(repr=False)
    world_readable: bool = False

    def __post_init__(self) -> None:
        if not self.username or ":" in self.username:
            raise ValueError("ZooKeeper digest username must be non-empty and contain no ':'")
        if not self.password:
            raise ValueError(f"ZooKeeper digest password for user {self.username!r} is empty")

    @classmethod
    def parse(cls, text: str, *, world_readable: bool = False) -> DigestAcl:
        """``user:password`` (the password may contain ``:``)."""
        user, sep, password = text.partition(":")
        if not sep:
            raise ValueError("ZooKeeper digest credentials must look like user:password")
        return cls(user, password, world_readable)

    @property
    def credential(self) -> str:
        return f"{self.username}:{self.password}"

    def acls(self) -> list[Any]:
        acls = [make_digest_acl(self.username, self.password, all=True)]
        if self.world_readable:
            acls.append(make_acl("world", "anyone", read=True))
        return acls


@dataclass(frozen=True)
class ZooKeeperUrl:
    hosts: tuple[tuple[str, int], ...]
    chroot: str  # "" or "/a/b"

    @classmethod
    def parse(cls, url: str) -> ZooKeeperUrl:
        """Parse ``zk://h1:p1,h2:p2/chroot``; ``ValueError`` says what is wrong."""
        if not url.startswith("zk://"):
            raise ValueError(f"ZooKeeper url {url!r} must start with zk://, "
                             "e.g. zk://127.0.0.1:2181/offloadd")
        rest = url[len("zk://"):]
        slash = rest.find("/")
        host_part, chroot = (rest, "") if slash < 0 else (rest[:slash], rest[slash:])
        hosts = tuple(_parse_host(h, url) for h in host_part.split(","))
        chroot = chroot.rstrip("/")
        if chroot and ("//" in chroot or any(c in (".", "..") for c in chroot.split("/")[1:])):
            raise ValueError(f"ZooKeeper url {url!r}: chroot {chroot!r} is not a valid path")
        return cls(hosts, chroot)

    @property
    def connect_string(self) -> str:
        """The hosts, kazoo-style, without the chroot."""
        return ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.hosts)

    def __str__(self) -> str:
        return f"zk://{self.connect_string}{self.chroot}"


_HOST_RE = re.compile(
    r"\s*(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[^:\[\]\s]+))(?::(?P<port>\d+))?\s*")


def _parse_host(text: str, url: str) -> tuple[str, int]:
    m = _HOST_RE.fullmatch(text)
    if not m:
        raise ValueError(f"ZooKeeper url {url!r}: {text!r} is not host[:port]")
    port = int(m.group("port") or DEFAULT_PORT)
    if not 0 < port < 65536:
        raise ValueError(f"ZooKeeper url {url!r}: port {port} is out of range")
    return m.group("v6") or m.group("name"), port


class _Redactor(logging.Filter):
    """Blanks secrets in records of kazoo's logger (kazoo logs its Auth request at DEBUG)."""

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        # every representation, not only the literal: kazoo logs the Auth request's repr, in
        # which a password's \\ or ' comes out escaped
        self._pattern = secret_pattern(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        if self._pattern is None:
            return True
        try:
            text = record.getMessage()
        except Exception:  # a malformed record: let logging report it as usual
            return True
        redacted = self._pattern.sub("<redacted>", text)
        if redacted != text:
            record.msg, record.args = redacted, None
        return True


_kazoo_loggers = 0


def _kazoo_logger(secrets: Iterable[str]) -> logging.Logger:
    """A child of this module's logger for one client, carrying that client's redaction filter."""
    global _kazoo_loggers
    _kazoo_loggers += 1
    logger = logging.getLogger(f"{__name__}.kazoo.{_kazoo_loggers}")
    logger.addFilter(_Redactor(secrets))
    return logger


def _release_logger(logger: logging.Logger) -> None:
    for f in list(logger.filters):
        logger.removeFilter(f)
    # Loggers are never freed by the logging module; drop ours from its registry so a process
    # that opens many stores (tests) does not keep one per store.
    logging.Logger.manager.loggerDict.pop(logger.name, None)


def _check_path(path: str) -> None:
    if not isinstance(path, str) or not path.startswith("/") or (
            path != "/" and (path.endswith("/") or "//" in path)):
        raise Fatal(f"invalid metadata path {path!r}: must be absolute, no empty components")


def _describe(op: Op) -> str:
    if isinstance(op, CreateOp):
        return f"create {op.path}" + (" (ephemeral)" if op.ephemeral else "")
    if isinstance(op, SetOp):
        return f"set {op.path} at version {op.version}"
    if isinstance(op, DeleteOp):
        return f"delete {op.path} at version {op.version}"
    return f"check {op.path} at version {op.version}"


class Watch:
    """A level-triggered watch: the callback gets the current state now and after every change.

    Children watches deliver the sorted child names, data watches a :class:`Versioned`; both
    deliver ``None`` while the node does not exist, and keep watching for it to appear. Equal
    consecutive states are delivered once. The watch survives reconnects and session loss (it is
    re-armed and re-read, so changes made while disconnected are seen). Callbacks run on the
    event loop; a callback returning an awaitable is run as a task.
    """

    def __init__(self, store: ZooKeeperMetadataStore, path: str,
                 kind: Literal["children", "data"], callback: Callable[[Any], object]) -> None:
        self._store = store
        self.path = path
        self.kind = kind
        self._callback = callback
        self._cancelled = False
        self._armed = False
        self._running = False
        self._again = False
        self._last: object = _UNSET

    @property
    def active(self) -> bool:
        return not self._cancelled

    def cancel(self) -> None:
        """No further callbacks (kazoo may still fire its watch once; it is ignored)."""
        self._cancelled = True
        self._store._watches.discard(self)

    def _fired(self, event: Any) -> None:
        """kazoo's watch callback: runs in kazoo's thread."""
        if self._cancelled:
            return
        lost = event.type == "NONE"  # kazoo drops every watch when the connection drops
        self._store._from_kazoo_thread(self._on_lost if lost else self.rearm)

    def _on_lost(self) -> None:
        self._armed = False
        # kazoo delivers this from its callback thread and the reconnect from its connection
        # thread: if the reconnect already reached the loop, nobody else will re-arm us.
        if self._store.session_state is SessionState.CONNECTED:
            self.rearm()

    def rearm(self) -> None:
        """Re-read and re-arm (on the loop); coalesces requests while a read is in flight."""
        if self._cancelled:
            return
        if self._running:
            self._again = True
            return
        self._running = True
        self._store._spawn(self._run())

    async def _run(self) -> None:
        try:
            while True:
                self._again = False
                try:
                    await self._arm()
                except Retriable as exc:
                    # Re-armed when the session is connected again (see _on_state), or soon if
                    # it already is (the failure raced a reconnect).
                    self._armed = False
                    log.debug("watch on %s not re-armed yet: %s", self.path, exc)
                    if self._store.session_state is SessionState.CONNECTED:
                        self._store._loop.call_later(0.2, self.rearm)
                except OffloaddError:
                    log.exception("watch on %s failed; it stops", self.path)
                    self.cancel()
                if not self._again or self._cancelled:
                    return
        finally:
            self._running = False

    async def _arm(self) -> None:
        store = self._store
        zk, full = store._zk, store._abs(self.path)
        value: object
        while True:
            try:
                if self.kind == "children":
                    names = await store._call(lambda: zk.get_children_async(full, self._fired),
                                              "children", self.path)
                    value = sorted(names)
                else:
                    data, stat = await store._call(lambda: zk.get_async(full, self._fired),
                                                   "get", self.path)
                    value = Versioned(bytes(data or b""), stat.version, stat.mzxid)
                break
            except NotFound:
                stat = await store._call(lambda: zk.exists_async(full, self._fired),
                                         "exists", self.path)
                if stat is None:
                    value = None
                    break
                # Created between the two reads: the exists-watch is set; read it again.
        self._armed = True
        if self._cancelled or value == self._last:
            return
        self._last = value
        store._invoke(self._callback, value, f"watch callback for {self.path}")


_UNSET = object()


class ZooKeeperMetadataStore:
    """One ZooKeeper session. Open with :meth:`open`; the constructor is internal."""

    def __init__(self, *, url: ZooKeeperUrl, client: KazooClient, acl: DigestAcl | None,
                 loop: asyncio.AbstractEventLoop, op_timeout_s: float,
                 kazoo_logger: logging.Logger) -> None:
        self._url = url
        self._zk = client
        self._digest = acl
        self._acls = acl.acls() if acl is not None else None
        self._loop = loop
        self._op_timeout = op_timeout_s
        self._kazoo_logger = kazoo_logger
        self._state = SessionState.LOST
        self._session_id: int | None = None
        self._connected = asyncio.Event()
        self._listeners: list[SessionListener] = []
        self._watches: set[Watch] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
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
        kazoo_logger = _kazoo_logger(secrets)
        retry = KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0)
        client = KazooClient(
            hosts=parsed.connect_string,
            timeout=session_timeout_s,
            connection_retry=retry,
            command_retry=KazooRetry(max_tries=0),
            auth_data=auth_data,
            default_acl=acl.acls() if acl is not None else None,
            logger=kazoo_logger,
        )
        store = cls(url=parsed, client=client, acl=acl, loop=asyncio.get_running_loop(),
                    op_timeout_s=op_timeout_s if op_timeout_s is not None else session_timeout_s,
                    kazoo_logger=kazoo_logger)
        client.add_listener(store._kazoo_state)
        try:
            await asyncio.to_thread(client.start_async)
            try:
                async with asyncio.timeout(connect_timeout_s):
                    await store._connected.wait()
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
        log.info("connected to ZooKeeper %s (session 0x%x)", parsed, store._session_id or 0)
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
            stat = await self._call(partial(zk.exists_async, prefix), "exists", prefix, raw=True)
            if stat is not None:
                break
            missing.append(prefix)
        if missing and not create:
            raise NotFound(f"ZooKeeper {self._url.connect_string} has no {chroot}: nothing has "
                           "been offloaded with this [metadata] url")
        for prefix in reversed(missing):
            try:
                await self._call(partial(zk.create_async, prefix, b"", acl=self._acls),
                                 "create", prefix, raw=True)
            except Conflict:
                continue
            except Fatal as exc:
                raise Fatal(f"cannot create the chroot {chroot} of the ZooKeeper url: "
                            f"{exc}") from None

    async def close(self) -> None:
        """End the session (our ephemeral nodes vanish). Listeners are not told."""
        if self._closed:
            return
        self._closed = True
        for watch in list(self._watches):
            watch.cancel()
        await self._shutdown()
        for task in list(self._tasks):
            task.cancel()

    def _abandon(self) -> None:
        """Stop a client that failed to open without waiting for it.

        kazoo's ``stop`` waits for its connection thread, which may sit in a TCP connect to an
        unresponsive address for up to the session timeout; a failed open must not.
        """
        self._closed = True
        self._zk.remove_listener(self._kazoo_state)
        client, logger = self._zk, self._kazoo_logger

        def stop() -> None:
            try:
                client.stop()
                client.close()
            except Exception:  # best effort: the client is being thrown away
                log.debug("stopping an abandoned ZooKeeper client failed", exc_info=True)
            finally:
                _release_logger(logger)

        threading.Thread(target=stop, name="offloadd-zk-abandon", daemon=True).start()

    async def _shutdown(self) -> None:
        self._closed = True
        self._zk.remove_listener(self._kazoo_state)
        await asyncio.to_thread(self._zk.stop)
        await asyncio.to_thread(self._zk.close)
        self._state = SessionState.LOST
        self._session_id = None
        self._connected.clear()
        _release_logger(self._kazoo_logger)

    def __repr__(self) -> str:
        user = f", user={self._digest.username!r}" if self._digest is not None else ""
        state = "closed" if self._closed else self._state.value
        return (f"ZooKeeperMetadataStore(hosts={self._url.connect_string!r}, "
                f"chroot={self._url.chroot or '/'!r}{user}, state={state})")

    # -- session ---------------------------------------------------------------------------

    @property
    def url(self) -> ZooKeeperUrl:
        return self._url

    @property
    def session_state(self) -> SessionState:
        return self._state

    @property
    def session_id(self) -> int | None:
        """The current session's id while connected (it changes after ``lost``)."""
        return self._session_id

    @property
    def connected_event(self) -> asyncio.Event:
        """Set while the session is connected; await ``.wait()`` to wait for a reconnect."""
        return self._connected

    def add_session_listener(self, listener: SessionListener) -> Callable[[], None]:
        """Call ``listener(state)`` on the event loop at each transition; returns the remover."""
        self._listeners.append(listener)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._listeners.remove(listener)

        return remove

    def _kazoo_state(self, state: str) -> None:
        """kazoo's state listener: runs in kazoo's connection thread; must not block."""
        mapped = {"CONNECTED": SessionState.CONNECTED, "SUSPENDED": SessionState.SUSPENDED,
                  "LOST": SessionState.LOST}.get(state)
        if mapped is None:
            return
        client_id = self._zk.client_id if mapped is SessionState.CONNECTED else None
        session = client_id[0] if client_id else None
        self._from_kazoo_thread(lambda: self._on_state(mapped, session))

    def _on_state(self, state: SessionState, session: int | None) -> None:
        if self._closed:
            return
        previous, self._state, self._session_id = self._state, state, session
        if state is SessionState.CONNECTED:
            self._connected.set()
        else:
            self._connected.clear()
        if previous is state:
            return
        level = logging.INFO if state is SessionState.CONNECTED else logging.WARNING
        log.log(level, "ZooKeeper session %s -> %s (%s%s)", previous.value, state.value,
                self._url, f", session 0x{session:x}" if session else "")
        if state is SessionState.CONNECTED:
            for watch in list(self._watches):
                if not watch._armed:
                    watch.rearm()
        for listener in list(self._listeners):
            self._invoke(listener, state, "session listener")

    def _from_kazoo_thread(self, fn: Callable[[], None]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening
            self._loop.call_soon_threadsafe(fn)

    def _invoke(self, fn: Callable[[Any], object], arg: object, what: str) -> None:
        try:
            result = fn(arg)
        except Exception:
            log.exception("%s raised", what)
            return
        if inspect.isawaitable(result):
            self._spawn(_await_logged(result, what))

    def _spawn(self, coro: Any) -> None:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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
        _check_path(path)
        watch = Watch(self, path, kind, callback)
        self._watches.add(watch)
        try:
            await watch._arm()
        except BaseException:
            watch.cancel()
            raise
        return watch

    # -- the protocol ----------------------------------------------------------------------

    async def get(self, path: str) -> Versioned:
        full = self._abs(path)
        data, stat = await self._call(lambda: self._zk.get_async(full), "get", path)
        return Versioned(bytes(data or b""), stat.version, stat.mzxid)

    async def exists(self, path: str) -> bool:
        full = self._abs(path)
        return await self._call(lambda: self._zk.exists_async(full), "exists", path) is not None

    async def create(self, path: str, data: bytes, *, ephemeral: bool = False,
                     sequential: bool = False, make_parents: bool = True) -> str:
        full = self._abs(path)
        if path == "/":
            raise Conflict("metadata node / already exists")
        created = await self._call(
            lambda: self._zk.create_async(full, bytes(data), acl=self._acls, ephemeral=ephemeral,
                                          sequence=sequential, makepath=make_parents),
            "create", path)
        return self._rel(created)

    async def set(self, path: str, data: bytes, version: int = -1) -> int:
        full = self._abs(path)
        stat = await self._call(lambda: self._zk.set_async(full, bytes(data), version),
                                "set", path)
        return int(stat.version)

    async def delete(self, path: str, version: int = -1, *, recursive: bool = False) -> None:
        full = self._abs(path)
        if path == "/":
            raise Fatal("the root metadata node cannot be deleted")
        if not recursive:
            await self._call(lambda: self._zk.delete_async(full, version), "delete", path)
            return
        await self._delete_recursive(path, version)

    async def children(self, path: str) -> list[str]:
        full = self._abs(path)
        names = await self._call(lambda: self._zk.get_children_async(full), "children", path)
        return sorted(names)

    async def multi(self, ops: Sequence[Op]) -> list[int | str | None]:
        self._check_open()
        if not ops:
            return []
        txn = self._zk.transaction()
        for op in ops:
            full = self._abs(op.path)
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
        results = await self._call(txn.commit_async, "multi", ops[0].path)
        errors = [(i, r) for i, r in enumerate(results) if isinstance(r, Exception)]
        if errors:
            # ZooKeeper reports the op that failed with its own error and every other op as
            # rolled back (or, after the failure, as a runtime inconsistency).
            causes = [(i, r) for i, r in errors
                      if not isinstance(r, (RolledBackError, RuntimeInconsistency))]
            i, exc = (causes or errors)[0]
            err = _translate(exc, "multi", ops[i].path)
            raise type(err)(f"multi op {i} ({_describe(ops[i])}) failed: {err}") from None
        out: list[int | str | None] = []
        for op, result in zip(ops, results, strict=True):
            if isinstance(op, CreateOp):
                out.append(self._rel(result))
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
            stat = await self._call(lambda: self._zk.exists_async(self._abs(path)), "exists",
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

    def _abs(self, path: str) -> str:
        _check_path(path)
        chroot = self._url.chroot
        if not chroot:
            return path
        return chroot if path == "/" else chroot + path

    def _rel(self, full: str) -> str:
        chroot = self._url.chroot
        if not chroot:
            return full
        if full == chroot:
            return "/"
        return full[len(chroot):] if full.startswith(chroot + "/") else full

    def _check_open(self) -> None:
        if self._closed:
            raise Fatal("metadata store session is closed")

    async def _call(self, start: Callable[[], Any], what: str, path: str, *,
                    raw: bool = False) -> Any:
        """Run one kazoo ``*_async`` call to completion on the loop; translate its errors.

        ``raw`` skips the open check (used while opening).
        """
        if not raw:
            self._check_open()
        try:
            async_result = start()
        except OffloaddError:
            raise
        except Exception as exc:
            raise _translate(exc, what, path) from None
        future: asyncio.Future[Any] = self._loop.create_future()
        async_result.rawlink(lambda r: self._settle_from_kazoo(future, r))
        try:
            async with asyncio.timeout(self._op_timeout):
                return await future
        except TimeoutError:
            raise Retriable(
                f"ZooKeeper {what} {path} got no answer within {self._op_timeout:g}s (session "
                f"{self._state.value}); a write may or may not have been applied: re-read"
            ) from None
        except OffloaddError:
            raise
        except Exception as exc:
            raise _translate(exc, what, path) from None

    def _settle_from_kazoo(self, future: asyncio.Future[Any], result: Any) -> None:
        """rawlink callback: runs in a kazoo thread (or inline when kazoo is stopping)."""
        exc, value = result.exception, result.value

        def settle() -> None:
            if future.done():
                return
            if exc is not None:
                future.set_exception(exc)
            else:
                future.set_result(value)

        self._from_kazoo_thread(settle)


async def _await_logged(awaitable: Any, what: str) -> None:
    try:
        await awaitable
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("%s raised", what)


def _translate(exc: BaseException, what: str, path: str) -> OffloaddError:
    """Map a kazoo (or socket) failure of ``what`` on ``path`` to our error tree."""
    if isinstance(exc, NoNodeError):
        if what == "create":
            return NotFound(f"parent of metadata node {path} does not exist")
        return NotFound(f"metadata node {path} does not exist")
    if isinstance(exc, NodeExistsError):
        return Conflict(f"metadata node {path} already exists")
    if isinstance(exc, BadVersionError):
        return Conflict(f"metadata node {path} is not at the expected version")
    if isinstance(exc, NotEmptyError):
        return Conflict(f"metadata node {path} has children; not deleting")
    if isinstance(exc, ConnectionClosedError):
        return Fatal(f"ZooKeeper {what} {path}: the client is closed")
    if isinstance(exc, (ConnectionLoss, SessionExpiredError, SessionMovedError,
                        OperationTimeoutError, RequestTimeoutError, NewConfigNoQuorumError,
                        ThrottledOpError, KazooTimeoutError)):
        return Retriable(f"ZooKeeper {what} {path}: {type(exc).__name__} (connection lost or "
                         "session expired); a write may or may not have been applied: re-read")
    if isinstance(exc, NoAuthError):
        return Fatal(f"ZooKeeper {what} {path}: not authorized by the node's ACL; check the "
                     "[metadata] digest credentials")
    if isinstance(exc, AuthFailedError):
        return Fatal(f"ZooKeeper {what} {path}: authentication failed; check the credentials")
    if isinstance(exc, NoChildrenForEphemeralsError):
        return Fatal(f"cannot create {path}: its parent is ephemeral")
    if isinstance(exc, (BadArgumentsError, InvalidACLError, ValueError, TypeError)):
        return Fatal(f"ZooKeeper {what} {path}: rejected as invalid ({type(exc).__name__})")
    if isinstance(exc, KazooException):
        return Fatal(f"ZooKeeper {what} {path}: {type(exc).__name__} {exc}")
    if isinstance(exc, OSError):
        return Retriable(f"ZooKeeper {what} {path}: {exc}")
    return Fatal(f"ZooKeeper {what} {path}: unexpected {type(exc).__name__}: {exc}")

