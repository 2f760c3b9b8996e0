"""The embedded store: :class:`EmbeddedMetadataStore`, one session on ``<path>/metadata.db``."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from offloadd.errors import Conflict, Fatal, NotFound, Retriable
from offloadd.metadata.base import (
    BatchedMulti,
    BatchedReads,
    GroupResult,
    MetadataStore,
    Op,
    Versioned,
)
from offloadd.metadata.embedded import tree
from offloadd.metadata.embedded.database import (
    connect,
    connect_read_only,
    in_write_tx,
    translate,
    volume_full,
)
from offloadd.metadata.embedded.owners import Owner, alive
from offloadd.metadata.nodes import apply_all, check_path

T = TypeVar("T")


class EmbeddedMetadataStore(MetadataStore, BatchedMulti, BatchedReads):
    """A :class:`~offloadd.metadata.base.MetadataStore` session on ``<path>/metadata.db``.

    Construction does no I/O; the database is opened on first use, or by :meth:`open`.

    ``read_only``: for commands that only look (``status``, ``verify``, ``read``). The database
    must already exist (``NotFound`` otherwise: nothing is created), is opened with SQLite's
    ``mode=ro`` (the library refuses every write), and dead sessions are not reaped. SQLite may
    still create its ``-wal``/``-shm`` companions beside an existing database to join a live
    writer's log; they hold no data of ours.
    """

    def __init__(self, path: str | Path, *, read_only: bool = False) -> None:
        self.db_path = Path(path) / "metadata.db"
        self.read_only = read_only
        self._owner = Owner.this_process()
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        self._owners_at: int | None = None  # data_version when _others was listed
        self._others: list[tuple[int, int | None]] = []  # other processes owning ephemerals
        # get()s waiting for the worker thread, per event loop, and the batches being served
        self._gets: dict[asyncio.AbstractEventLoop,
                         list[tuple[str, asyncio.Future[Versioned]]]] = {}
        self._serving: set[asyncio.Task[None]] = set()

    @classmethod
    async def open(cls, path: str | Path, *, read_only: bool = False) -> EmbeddedMetadataStore:
        """A store whose database is already opened (errors surface here, not on first use)."""
        store = cls(path, read_only=read_only)
        await store._run("open", lambda c: None)
        return store

    # -- the protocol ---------------------------------------------------------------------

    async def get(self, path: str) -> Versioned:
        """The node at ``path``. The reads asked for in one turn of the event loop go to the
        worker thread together (one hop, each read as on its own): with thousands of topics
        committing or stopping at once, a worker-thread hop per read was most of the event
        loop's time (a stop with 10,000 open segments: 42 % of it in ``to_thread``)."""
        check_path(path)
        loop = asyncio.get_running_loop()
        waiting = self._gets.get(loop)
        if waiting is None:
            waiting = self._gets[loop] = []
            loop.call_soon(self._send_gets, loop)
        future: asyncio.Future[Versioned] = loop.create_future()
        waiting.append((path, future))
        return await future

    def _send_gets(self, loop: asyncio.AbstractEventLoop) -> None:
        batch = self._gets.pop(loop, [])
        if batch:
            task = loop.create_task(self._serve_gets(batch))
            self._serving.add(task)
            task.add_done_callback(self._serving.discard)

    async def _serve_gets(self, batch: list[tuple[str, asyncio.Future[Versioned]]]) -> None:
        paths = [p for p, _ in batch]
        try:
            rows = await self._run(f"get of {len(paths)} node(s)",
                                   lambda c: [tree.row(c, p) for p in paths])
        except BaseException as exc:  # the request failed (or we are cancelled): each read did
            for _, future in batch:
                if not future.done():
                    if isinstance(exc, asyncio.CancelledError):
                        future.cancel()
                    else:
                        future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (path, future), row in zip(batch, rows, strict=True):
            if future.done():  # its caller was cancelled
                continue
            if row is None:
                future.set_exception(NotFound(f"metadata node {path} does not exist"))
            else:
                future.set_result(Versioned(row[0], row[1]))

    async def exists(self, path: str) -> bool:
        check_path(path)
        return await self._run(f"exists {path}", lambda c: tree.row(c, path) is not None)

    async def create(self, path: str, data: bytes, *, ephemeral: bool = False,
                     sequential: bool = False, make_parents: bool = True) -> str:
        check_path(path)
        owner = self._owner

        def op(c: sqlite3.Connection) -> str:
            if make_parents:
                tree.create_parents(c, owner, path)
            return tree.create(c, owner, path, data, ephemeral=ephemeral, sequential=sequential)

        return await self._write(f"create {path}", op)

    async def set(self, path: str, data: bytes, version: int = -1) -> int:
        check_path(path)
        return await self._write(f"set {path}", lambda c: tree.set_data(c, path, data, version))

    async def delete(self, path: str, version: int = -1, *, recursive: bool = False) -> None:
        check_path(path)
        await self._write(f"delete {path}",
                          lambda c: tree.delete(c, path, version, recursive=recursive))

    async def children(self, path: str) -> list[str]:
        check_path(path)

        def op(c: sqlite3.Connection) -> list[str]:
            c.execute("BEGIN")  # one snapshot for both statements
            try:
                if tree.row(c, path) is None:
                    raise NotFound(f"metadata node {path} does not exist")
                return tree.children(c, path)
            finally:
                c.execute("COMMIT")

        return await self._run(f"children {path}", op)

    async def multi(self, ops: Sequence[Op]) -> list[int | str | None]:
        for op in ops:
            check_path(op.path)
        owner = self._owner
        return await self._write(f"multi of {len(ops)} ops", lambda c: apply_all(
            ops, lambda op: tree.apply(c, owner, op)))

    # -- the batch capabilities (base.BatchedMulti, base.BatchedReads) ------------------------

    async def multi_batch(self, groups: Sequence[Sequence[Op]]) -> list[GroupResult]:
        """Every group in one write transaction, each under its own savepoint: a refused group
        is rolled back to its savepoint alone, and one commit (one fsync) lands the rest."""
        for group in groups:
            for op in group:
                check_path(op.path)
        owner = self._owner

        def apply_groups(c: sqlite3.Connection) -> list[GroupResult]:
            out: list[GroupResult] = []
            for group in groups:
                c.execute("SAVEPOINT grp")
                try:
                    out.append(apply_all(group, lambda op: tree.apply(c, owner, op)))
                except (Conflict, NotFound, Fatal) as e:
                    c.execute("ROLLBACK TO grp")
                    out.append(e)
                c.execute("RELEASE grp")
            return out

        return await self._write(f"multi_batch of {len(groups)} groups", apply_groups)

    async def get_many(self, paths: Sequence[str]) -> list[Versioned | None]:
        """One worker-thread hop and one read transaction (a snapshot) for all ``paths``, a query
        per few hundred of them (:func:`tree.rows`)."""
        for path in paths:
            check_path(path)

        def op(c: sqlite3.Connection) -> list[Versioned | None]:
            c.execute("BEGIN")
            try:
                found = tree.rows(c, paths)
            finally:
                c.execute("COMMIT")
            return [None if (r := found.get(p)) is None else Versioned(r[0], r[1])
                    for p in paths]

        return await self._run(f"get_many of {len(paths)} nodes", op)

    async def close(self) -> None:
        if self._closed:
            return
        await asyncio.to_thread(self._close_sync)

    # -- plumbing -------------------------------------------------------------------------

    def _close_sync(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            conn, self._conn = self._conn, None
            if conn is None:
                return
            if self.read_only:  # a read-only session owns no ephemeral node
                conn.close()
                return
            try:
                in_write_tx(conn, lambda c: tree.delete_owned(
                    c, "owner_session = ?", (self._owner.session,)))
            except sqlite3.Error as e:
                raise translate(e, "close") from e
            finally:
                conn.close()

    async def _run(self, what: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await asyncio.to_thread(self._run_sync, what, fn)

    async def _write(self, what: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self.read_only:
            raise Fatal(f"embedded metadata store {self.db_path} is open read-only ({what})")
        return await self._run(what, lambda c: in_write_tx(c, fn))

    def _run_sync(self, what: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        with self._lock:
            if self._closed:
                raise Fatal(f"embedded metadata store {self.db_path} is closed ({what})")
            try:
                conn = self._connect()
                if not self.read_only:
                    self._reap(conn)
                return fn(conn)
            except sqlite3.Error as e:
                if volume_full(self.db_path.parent):
                    # SQLite often reports a full volume as a plain "disk I/O error" (when it
                    # cannot create or grow its WAL and shared-memory files): say what it is
                    raise Retriable(f"embedded metadata store disk full during {what}: {e}; "
                                    f"free space on the volume of {self.db_path.parent}") from e
                raise translate(e, what) from e
            except OSError as e:  # creating the database's directory
                raise Fatal(f"embedded metadata store cannot use {self.db_path.parent} "
                            f"({what}): {e}") from e

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = (connect_read_only if self.read_only else connect)(self.db_path)
        return self._conn

    def _reap(self, c: sqlite3.Connection) -> None:
        """Delete ephemerals of processes that are gone (their sessions ended uncleanly).

        Cheap when nothing changed: the owners are listed again only when another connection
        committed since the last listing (SQLite's ``data_version``; our own writes never add
        another process's ephemerals), and only other processes' liveness is checked."""
        version = c.execute("PRAGMA data_version").fetchone()[0]
        if version != self._owners_at:
            self._others = [(pid, start) for pid, start in c.execute(
                "SELECT DISTINCT owner_pid, owner_start FROM nodes "
                "WHERE owner_pid IS NOT NULL").fetchall() if pid != self._owner.pid]
            self._owners_at = version
        dead = [(pid, start) for pid, start in self._others if not alive(pid, start)]
        if not dead:
            return

        def reap(c: sqlite3.Connection) -> None:
            for pid, start in dead:
                tree.delete_owned(c, "owner_pid = ? AND owner_start IS ?", (pid, start))

        in_write_tx(c, reap)
        self._others = [o for o in self._others if o not in dead]
