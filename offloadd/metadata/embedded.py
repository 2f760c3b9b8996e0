"""Embedded metadata store: one SQLite file shared by the processes of one machine.

Layout: ``<path>/metadata.db`` in WAL mode, one table::

    nodes(path TEXT PRIMARY KEY,   -- "/a/b"; "/" always exists
          parent TEXT,             -- "/a" (indexed: children listings)
          data BLOB,
          version INTEGER,         -- 0 on create, +1 per set
          cversion INTEGER,        -- +1 per child created or deleted; sequential suffix source
          owner_session TEXT,      -- ephemeral nodes only: the creating store's session id
          owner_pid INTEGER,       --   ... that store's process id
          owner_start INTEGER)     --   ... and that process's start time (/proc), against pid reuse

Semantics are ZooKeeper's, as in :mod:`offloadd.metadata.memory`. Every write is one
``BEGIN IMMEDIATE`` transaction (read, check, write under SQLite's write lock), so compare-and-set
holds across processes. A store instance is a session: ``close()`` deletes its ephemeral nodes,
and any store removes ephemerals whose owning process is gone before each operation, which makes
"session ends when the process dies" true without a server.

Every call runs in a worker thread (``asyncio.to_thread``); one connection per store, used under a
lock. sqlite3 errors become ``Retriable`` (busy/locked/full) or ``Fatal`` (anything else).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from offloadd.errors import Conflict, Fatal, NotFound, OffloaddError, Retriable
from offloadd.metadata.base import CheckOp, CreateOp, DeleteOp, Op, SetOp, Versioned
from offloadd.metadata.nodes import check_path, parent_of

T = TypeVar("T")

_SCHEMA_VERSION = 1
_BUSY_TIMEOUT_MS = 10_000
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_FULL = 5, 6, 13

_SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes (
    path TEXT PRIMARY KEY,
    parent TEXT NOT NULL,
    data BLOB NOT NULL,
    version INTEGER NOT NULL DEFAULT 0,
    cversion INTEGER NOT NULL DEFAULT 0,
    owner_session TEXT,
    owner_pid INTEGER,
    owner_start INTEGER
);
CREATE INDEX IF NOT EXISTS nodes_parent ON nodes(parent);
CREATE INDEX IF NOT EXISTS nodes_owner ON nodes(owner_pid) WHERE owner_pid IS NOT NULL;
INSERT OR IGNORE INTO nodes(path, parent, data) VALUES ('/', '', x'');
"""


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks) of a process from /proc, or None where unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("ascii", "replace")
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses; fields resume after the
    # last ")". State is field 3, starttime field 22.
    fields = raw[raw.rfind(")") + 2:].split()
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


def _process_alive(pid: int, start: int | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by another user
    stat = _proc_stat(pid)
    if stat is None:
        return True
    state, started = stat
    # A killed child that its parent has not reaped yet is a zombie: its session is over. A
    # different start time means the pid was reused by an unrelated process.
    return state != "Z" and (not start or started == start)


def _volume_full(path: Path) -> bool:
    """No block left for us on the volume holding ``path`` (or its nearest existing parent)."""
    for p in (path, *path.parents):
        try:
            return os.statvfs(p).f_bavail == 0
        except FileNotFoundError:
            continue
        except OSError:
            return False
    return False


def _translate(e: sqlite3.Error, what: str) -> OffloaddError:
    code = getattr(e, "sqlite_errorcode", 0) & 0xFF
    text = str(e)
    if code in (_SQLITE_BUSY, _SQLITE_LOCKED) or "locked" in text or "busy" in text:
        return Retriable(f"embedded metadata store busy during {what}: {text}; retry")
    if code == _SQLITE_FULL:
        return Retriable(f"embedded metadata store disk full during {what}: {text}; "
                         "free space on its volume")
    return Fatal(f"embedded metadata store failed during {what}: {text}")


class EmbeddedMetadataStore:
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
        self._session = uuid.uuid4().hex
        self._pid = os.getpid()
        stat = _proc_stat(self._pid)
        self._start = stat[1] if stat else 0
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._closed = False

    @classmethod
    async def open(cls, path: str | Path, *, read_only: bool = False) -> EmbeddedMetadataStore:
        """A store whose database is already opened (errors surface here, not on first use)."""
        store = cls(path, read_only=read_only)
        await store._run("open", lambda c: None)
        return store

    # -- the protocol ---------------------------------------------------------------------

    async def get(self, path: str) -> Versioned:
        check_path(path)

        def op(c: sqlite3.Connection) -> Versioned:
            row = self._row(c, path)
            if row is None:
                raise NotFound(f"metadata node {path} does not exist")
            return Versioned(row[0], row[1])

        return await self._run(f"get {path}", op)

    async def exists(self, path: str) -> bool:
        check_path(path)
        return await self._run(f"exists {path}", lambda c: self._row(c, path) is not None)

    async def create(self, path: str, data: bytes, *, ephemeral: bool = False,
                     sequential: bool = False, make_parents: bool = True) -> str:
        check_path(path)

        def op(c: sqlite3.Connection) -> str:
            if make_parents:
                missing: list[str] = []
                p = parent_of(path)
                while self._row(c, p) is None:
                    missing.append(p)
                    p = parent_of(p)
                for p in reversed(missing):
                    self._create(c, p, b"", ephemeral=False, sequential=False)
            return self._create(c, path, data, ephemeral=ephemeral, sequential=sequential)

        return await self._write(f"create {path}", op)

    async def set(self, path: str, data: bytes, version: int = -1) -> int:
        check_path(path)
        return await self._write(f"set {path}", lambda c: self._set(c, path, data, version))

    async def delete(self, path: str, version: int = -1, *, recursive: bool = False) -> None:
        check_path(path)
        await self._write(f"delete {path}",
                          lambda c: self._delete(c, path, version, recursive=recursive))

    async def children(self, path: str) -> list[str]:
        check_path(path)

        def op(c: sqlite3.Connection) -> list[str]:
            c.execute("BEGIN")  # one snapshot for both statements
            try:
                if self._row(c, path) is None:
                    raise NotFound(f"metadata node {path} does not exist")
                return [_name(r[0]) for r in c.execute(
                    "SELECT path FROM nodes WHERE parent = ? ORDER BY path", (path,))]
            finally:
                c.execute("COMMIT")

        return await self._run(f"children {path}", op)

    async def multi(self, ops: Sequence[Op]) -> list[int | str | None]:
        for op in ops:
            check_path(op.path)

        def apply_all(c: sqlite3.Connection) -> list[int | str | None]:
            results: list[int | str | None] = []
            for i, op in enumerate(ops):
                try:
                    results.append(self._apply(c, op))
                except (Conflict, NotFound, Fatal) as e:
                    raise type(e)(f"multi op {i} {op!r} failed: {e}") from e
            return results

        return await self._write(f"multi of {len(ops)} ops", apply_all)

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
                self._in_write_tx(conn, lambda c: self._delete_owned(
                    c, "owner_session = ?", (self._session,)))
            except sqlite3.Error as e:
                raise _translate(e, "close") from e
            finally:
                conn.close()

    async def _run(self, what: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await asyncio.to_thread(self._run_sync, what, fn)

    async def _write(self, what: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self.read_only:
            raise Fatal(f"embedded metadata store {self.db_path} is open read-only ({what})")
        return await self._run(what, lambda c: self._in_write_tx(c, fn))

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
                if _volume_full(self.db_path.parent):
                    # SQLite often reports a full volume as a plain "disk I/O error" (when it
                    # cannot create or grow its WAL and shared-memory files): say what it is
                    raise Retriable(f"embedded metadata store disk full during {what}: {e}; "
                                    f"free space on the volume of {self.db_path.parent}") from e
                raise _translate(e, what) from e
            except OSError as e:  # creating the database's directory
                raise Fatal(f"embedded metadata store cannot use {self.db_path.parent} "
                            f"({what}): {e}") from e

    def _connect(self) -> sqlite3.Connection:
        if self._conn is not None:
            return self._conn
        if self.read_only:
            self._conn = self._connect_read_only()
            return self._conn
        self.db_path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: no implicit transactions; every write says BEGIN IMMEDIATE.
        conn = sqlite3.connect(self.db_path, timeout=_BUSY_TIMEOUT_MS / 1000,
                               isolation_level=None, check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA journal_mode = WAL")
            # FULL: a commit acknowledged to the offloader survives power loss too.
            conn.execute("PRAGMA synchronous = FULL")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > _SCHEMA_VERSION:
                raise Fatal(f"{self.db_path} has schema version {version}; this offloadd "
                            f"knows up to {_SCHEMA_VERSION}: upgrade offloadd")
            self._in_write_tx(conn, _init_schema)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    def _connect_read_only(self) -> sqlite3.Connection:
        if not self.db_path.is_file():
            raise NotFound(f"no embedded metadata store at {self.db_path}: nothing has been "
                           "offloaded with this configuration (check --config and the "
                           "[metadata] url, and the working directory for relative paths)")
        uri = f"{self.db_path.resolve().as_uri()}?mode=ro"
        conn = sqlite3.connect(uri, uri=True, timeout=_BUSY_TIMEOUT_MS / 1000,
                               isolation_level=None, check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > _SCHEMA_VERSION:
                raise Fatal(f"{self.db_path} has schema version {version}; this offloadd "
                            f"knows up to {_SCHEMA_VERSION}: upgrade offloadd")
            if version < 1:
                raise Fatal(f"{self.db_path} is not an offloadd metadata store (schema "
                            "version 0)")
        except BaseException:
            conn.close()
            raise
        return conn

    @staticmethod
    def _in_write_tx(c: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
        c.execute("BEGIN IMMEDIATE")
        try:
            result = fn(c)
        except BaseException:
            c.execute("ROLLBACK")
            raise
        c.execute("COMMIT")
        return result

    def _reap(self, c: sqlite3.Connection) -> None:
        """Delete ephemerals of processes that are gone (their sessions ended uncleanly)."""
        owners = c.execute("SELECT DISTINCT owner_pid, owner_start FROM nodes "
                           "WHERE owner_pid IS NOT NULL").fetchall()
        dead = [(pid, start) for pid, start in owners
                if pid != self._pid and not _process_alive(pid, start)]
        if not dead:
            return

        def reap(c: sqlite3.Connection) -> None:
            for pid, start in dead:
                self._delete_owned(c, "owner_pid = ? AND owner_start IS ?", (pid, start))

        self._in_write_tx(c, reap)

    # -- node operations, inside a transaction ----------------------------------------------

    @staticmethod
    def _row(c: sqlite3.Connection, path: str) -> tuple[bytes, int, int, str | None] | None:
        row: tuple[bytes, int, int, str | None] | None = c.execute(
            "SELECT data, version, cversion, owner_session FROM nodes WHERE path = ?",
            (path,)).fetchone()
        return row

    def _create(self, c: sqlite3.Connection, path: str, data: bytes, *, ephemeral: bool,
                sequential: bool) -> str:
        if path == "/":
            raise Conflict("metadata node / already exists")
        ppath = parent_of(path)
        parent = self._row(c, ppath)
        if parent is None:
            raise NotFound(f"parent {ppath} of metadata node {path} does not exist")
        if parent[3] is not None:
            raise Fatal(f"cannot create {path}: parent {ppath} is ephemeral")
        if sequential:
            path = f"{path}{parent[2]:010d}"
        if self._row(c, path) is not None:
            raise Conflict(f"metadata node {path} already exists")
        owner = (self._session, self._pid, self._start) if ephemeral else (None, None, None)
        c.execute("INSERT INTO nodes(path, parent, data, owner_session, owner_pid, owner_start) "
                  "VALUES (?, ?, ?, ?, ?, ?)", (path, ppath, bytes(data), *owner))
        c.execute("UPDATE nodes SET cversion = cversion + 1 WHERE path = ?", (ppath,))
        return path

    def _existing(self, c: sqlite3.Connection, path: str,
                  version: int) -> tuple[bytes, int, int, str | None]:
        row = self._row(c, path)
        if row is None:
            raise NotFound(f"metadata node {path} does not exist")
        if version != -1 and version != row[1]:
            raise Conflict(f"metadata node {path} is at version {row[1]}, not {version}")
        return row

    def _set(self, c: sqlite3.Connection, path: str, data: bytes, version: int) -> int:
        row = self._existing(c, path, version)
        c.execute("UPDATE nodes SET data = ?, version = version + 1 WHERE path = ?",
                  (bytes(data), path))
        return row[1] + 1

    def _delete(self, c: sqlite3.Connection, path: str, version: int, *,
                recursive: bool) -> None:
        if path == "/":
            raise Fatal("the root metadata node cannot be deleted")
        self._existing(c, path, version)
        if not recursive and c.execute("SELECT 1 FROM nodes WHERE parent = ? LIMIT 1",
                                       (path,)).fetchone():
            raise Conflict(f"metadata node {path} has children; not deleting")
        # Descendants of /a are exactly the paths in ["/a/", "/a0"): "0" follows "/" in ASCII.
        c.execute("DELETE FROM nodes WHERE path >= ? AND path < ?", (path + "/", path + "0"))
        c.execute("DELETE FROM nodes WHERE path = ?", (path,))
        c.execute("UPDATE nodes SET cversion = cversion + 1 WHERE path = ?", (parent_of(path),))

    def _delete_owned(self, c: sqlite3.Connection, where: str,
                      args: tuple[object, ...]) -> None:
        for (path,) in c.execute(f"SELECT path FROM nodes WHERE {where}", args).fetchall():
            self._delete(c, path, -1, recursive=True)

    def _apply(self, c: sqlite3.Connection, op: Op) -> int | str | None:
        if isinstance(op, CreateOp):
            return self._create(c, op.path, op.data, ephemeral=op.ephemeral, sequential=False)
        if isinstance(op, SetOp):
            return self._set(c, op.path, op.data, op.version)
        if isinstance(op, DeleteOp):
            self._delete(c, op.path, op.version, recursive=False)
            return None
        if isinstance(op, CheckOp):
            self._existing(c, op.path, op.version)
            return None
        raise Fatal(f"unknown metadata op {op!r}")


def _init_schema(c: sqlite3.Connection) -> None:
    for statement in _SCHEMA.split(";"):
        if statement.strip():
            c.execute(statement)
    c.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")


def _name(path: str) -> str:
    return path.rsplit("/", 1)[1]
