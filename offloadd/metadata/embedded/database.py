"""The embedded store's SQLite database: schema, connections, transactions, error translation.

``<path>/metadata.db`` in WAL mode, one table::

    nodes(path TEXT PRIMARY KEY,   -- "/a/b"; "/" always exists
          parent TEXT,             -- "/a" (indexed: children listings)
          data BLOB,
          version INTEGER,         -- 0 on create, +1 per set
          cversion INTEGER,        -- +1 per child created or deleted; sequential suffix source
          owner_session TEXT,      -- ephemeral nodes only: the creating store's session id
          owner_pid INTEGER,       --   ... that store's process id
          owner_start INTEGER)     --   ... and that process's start time (/proc), against pid reuse

Every write is one ``BEGIN IMMEDIATE`` transaction (:func:`in_write_tx`: read, check, write under
SQLite's write lock), so compare-and-set holds across processes. sqlite3 errors become
``Retriable`` (busy/locked/full) or ``Fatal`` (anything else) through :func:`translate`.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from offloadd.errors import Fatal, NotFound, OffloaddError, Retriable

T = TypeVar("T")

SCHEMA_VERSION = 1
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


def volume_full(path: Path) -> bool:
    """No block left for us on the volume holding ``path`` (or its nearest existing parent)."""
    for p in (path, *path.parents):
        try:
            return os.statvfs(p).f_bavail == 0
        except FileNotFoundError:
            continue
        except OSError:
            return False
    return False


def translate(e: sqlite3.Error, what: str) -> OffloaddError:
    # errors sqlite3 raises itself (a closed connection, a misuse) carry no SQLite error code
    code = getattr(e, "sqlite_errorcode", 0) & 0xFF
    text = str(e)
    if code in (_SQLITE_BUSY, _SQLITE_LOCKED) or "locked" in text or "busy" in text:
        return Retriable(f"embedded metadata store busy during {what}: {text}; retry")
    if code == _SQLITE_FULL:
        return Retriable(f"embedded metadata store disk full during {what}: {text}; "
                         "free space on its volume")
    return Fatal(f"embedded metadata store failed during {what}: {text}")


def in_write_tx(c: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    c.execute("BEGIN IMMEDIATE")
    try:
        result = fn(c)
    except BaseException:
        c.execute("ROLLBACK")
        raise
    c.execute("COMMIT")
    return result


def connect(db_path: Path) -> sqlite3.Connection:
    """Open (creating it and its directory when missing) the database for reading and writing."""
    db_path.parent.mkdir(parents=True, exist_ok=True)
    # isolation_level=None: no implicit transactions; every write says BEGIN IMMEDIATE.
    conn = sqlite3.connect(db_path, timeout=_BUSY_TIMEOUT_MS / 1000,
                           isolation_level=None, check_same_thread=False)
    try:
        conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA journal_mode = WAL")
        # FULL: a commit acknowledged to the offloader survives power loss too.
        conn.execute("PRAGMA synchronous = FULL")
        _check_version(conn, db_path)
        in_write_tx(conn, _init_schema)
    except BaseException:
        conn.close()
        raise
    return conn


def connect_read_only(db_path: Path) -> sqlite3.Connection:
    """Open an existing database with SQLite's ``mode=ro``; ``NotFound`` when there is none."""
    if not db_path.is_file():
        raise NotFound(f"no embedded metadata store at {db_path}: nothing has been "
                       "offloaded with this configuration (check --config and the "
                       "[metadata] url, and the working directory for relative paths)")
    uri = f"{db_path.resolve().as_uri()}?mode=ro"
    conn = sqlite3.connect(uri, uri=True, timeout=_BUSY_TIMEOUT_MS / 1000,
                           isolation_level=None, check_same_thread=False)
    try:
        conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
        if _check_version(conn, db_path) < 1:
            raise Fatal(f"{db_path} is not an offloadd metadata store (schema version 0)")
    except BaseException:
        conn.close()
        raise
    return conn


def _check_version(conn: sqlite3.Connection, db_path: Path) -> int:
    version: int = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise Fatal(f"{db_path} has schema version {version}; this offloadd "
                    f"knows up to {SCHEMA_VERSION}: upgrade offloadd")
    return version


def _init_schema(c: sqlite3.Connection) -> None:
    for statement in _SCHEMA.split(";"):
        if statement.strip():
            c.execute(statement)
    c.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
