"""ZooKeeper's node semantics on the embedded store's ``nodes`` table, inside a transaction.

Semantics are ZooKeeper's, as in :mod:`offloadd.metadata.memory`: versions start at 0 and grow
by one per ``set``; ``/`` always exists and cannot be deleted; sequential creates append the
parent's ``cversion`` as 10 zero-padded digits; ephemeral nodes cannot have children. Every
function here runs inside a transaction the caller holds (:func:`.database.in_write_tx`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from offloadd.errors import Conflict, Fatal, NotFound
from offloadd.metadata.base import CheckOp, CreateOp, DeleteOp, Op, SetOp
from offloadd.metadata.embedded.owners import Owner
from offloadd.metadata.nodes import parent_of

Row = tuple[bytes, int, int, str | None]  # data, version, cversion, owner_session


def row(c: sqlite3.Connection, path: str) -> Row | None:
    found: Row | None = c.execute(
        "SELECT data, version, cversion, owner_session FROM nodes WHERE path = ?",
        (path,)).fetchone()
    return found


# Paths in one ``IN (...)`` query: under SQLite's oldest limit on bound parameters (999).
ROWS_PER_QUERY = 500


def rows(c: sqlite3.Connection, paths: Sequence[str]) -> dict[str, tuple[bytes, int]]:
    """Data and version of those of ``paths`` that exist, ``ROWS_PER_QUERY`` a query: at
    20,000 nodes (``offloadd status`` over 10,000 topics) a statement per node was most of
    the read's time."""
    out: dict[str, tuple[bytes, int]] = {}
    for start in range(0, len(paths), ROWS_PER_QUERY):
        chunk = paths[start:start + ROWS_PER_QUERY]
        marks = ",".join("?" * len(chunk))
        for path, data, version in c.execute(
                f"SELECT path, data, version FROM nodes WHERE path IN ({marks})", chunk):
            out[path] = (data, version)
    return out


def children(c: sqlite3.Connection, path: str) -> list[str]:
    return [p.rsplit("/", 1)[1] for (p,) in c.execute(
        "SELECT path FROM nodes WHERE parent = ? ORDER BY path", (path,))]


def create(c: sqlite3.Connection, owner: Owner, path: str, data: bytes, *, ephemeral: bool,
           sequential: bool) -> str:
    if path == "/":
        raise Conflict("metadata node / already exists")
    ppath = parent_of(path)
    parent = row(c, ppath)
    if parent is None:
        raise NotFound(f"parent {ppath} of metadata node {path} does not exist")
    if parent[3] is not None:
        raise Fatal(f"cannot create {path}: parent {ppath} is ephemeral")
    if sequential:
        path = f"{path}{parent[2]:010d}"
    if row(c, path) is not None:
        raise Conflict(f"metadata node {path} already exists")
    who = (owner.session, owner.pid, owner.start) if ephemeral else (None, None, None)
    c.execute("INSERT INTO nodes(path, parent, data, owner_session, owner_pid, owner_start) "
              "VALUES (?, ?, ?, ?, ?, ?)", (path, ppath, bytes(data), *who))
    c.execute("UPDATE nodes SET cversion = cversion + 1 WHERE path = ?", (ppath,))
    return path


def create_parents(c: sqlite3.Connection, owner: Owner, path: str) -> None:
    """Create ``path``'s missing ancestors as empty persistent nodes."""
    missing: list[str] = []
    p = parent_of(path)
    while row(c, p) is None:
        missing.append(p)
        p = parent_of(p)
    for p in reversed(missing):
        create(c, owner, p, b"", ephemeral=False, sequential=False)


def existing(c: sqlite3.Connection, path: str, version: int) -> Row:
    found = row(c, path)
    if found is None:
        raise NotFound(f"metadata node {path} does not exist")
    if version != -1 and version != found[1]:
        raise Conflict(f"metadata node {path} is at version {found[1]}, not {version}")
    return found


def set_data(c: sqlite3.Connection, path: str, data: bytes, version: int) -> int:
    found = existing(c, path, version)
    c.execute("UPDATE nodes SET data = ?, version = version + 1 WHERE path = ?",
              (bytes(data), path))
    return found[1] + 1


def delete(c: sqlite3.Connection, path: str, version: int, *, recursive: bool) -> None:
    if path == "/":
        raise Fatal("the root metadata node cannot be deleted")
    existing(c, path, version)
    if not recursive and c.execute("SELECT 1 FROM nodes WHERE parent = ? LIMIT 1",
                                   (path,)).fetchone():
        raise Conflict(f"metadata node {path} has children; not deleting")
    # Descendants of /a are exactly the paths in ["/a/", "/a0"): "0" follows "/" in ASCII.
    c.execute("DELETE FROM nodes WHERE path >= ? AND path < ?", (path + "/", path + "0"))
    c.execute("DELETE FROM nodes WHERE path = ?", (path,))
    c.execute("UPDATE nodes SET cversion = cversion + 1 WHERE path = ?", (parent_of(path),))


def delete_owned(c: sqlite3.Connection, where: str, args: tuple[object, ...]) -> None:
    """Delete the ephemeral nodes (and, were there any, their subtrees) ``where`` selects."""
    for (path,) in c.execute(f"SELECT path FROM nodes WHERE {where}", args).fetchall():
        delete(c, path, -1, recursive=True)


def apply(c: sqlite3.Connection, owner: Owner, op: Op) -> int | str | None:
    """One op of a ``multi`` (no parents are made)."""
    if isinstance(op, CreateOp):
        return create(c, owner, op.path, op.data, ephemeral=op.ephemeral, sequential=False)
    if isinstance(op, SetOp):
        return set_data(c, op.path, op.data, op.version)
    if isinstance(op, DeleteOp):
        delete(c, op.path, op.version, recursive=False)
        return None
    if isinstance(op, CheckOp):
        existing(c, op.path, op.version)
        return None
    raise Fatal(f"unknown metadata op {op!r}")
