"""``offloadd query``: SQL over the topic tables with DuckDB, no cluster and no extension download.

Each table the SQL names is scanned by pyiceberg into Arrow and registered in an in-memory DuckDB
under the names a user would type: the topic's local name (``"topic-0"``, quoted because of the
dash), the same with every character that is not a letter, digit or underscore replaced by ``_``
(``topic_0``), and the full ``"tenant.namespace.topic"``. A local name shared by topics of several
namespaces is registered under its full name only. Each name with ``__messages`` appended is the
same table with chunked messages reassembled (:mod:`offloadd.lakehouse.chunks`). Tables the SQL
does not mention are not read.
The whole scan of each named table is held in memory (no predicate push-down into the scan yet).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
from collections.abc import Iterable
from decimal import Decimal
from typing import Any, TextIO

import duckdb
from pyiceberg.catalog import Catalog

from offloadd.lakehouse.chunks import MESSAGES_SUFFIX, reassemble

__all__ = ["QueryResult", "aliases", "list_tables", "run_query"]


class QueryResult:
    def __init__(self, columns: list[str], rows: list[tuple[Any, ...]]) -> None:
        self.columns = columns
        self.rows = rows

    def to_json(self) -> list[dict[str, Any]]:
        return [{c: _plain(v) for c, v in zip(self.columns, r, strict=True)} for r in self.rows]

    def render(self, out: TextIO, max_width: int = 48) -> None:
        cells = [[_text(v, max_width) for v in r] for r in self.rows]
        widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(self.columns)]
        line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
        out.write(line + "\n")
        out.write("| " + " | ".join(c.ljust(w) for c, w in zip(self.columns, widths,
                                                                 strict=True)) + " |\n")
        out.write(line + "\n")
        for r in cells:
            out.write("| " + " | ".join(v.ljust(w) for v, w in zip(r, widths, strict=True))
                      + " |\n")
        out.write(line + "\n")
        out.write(f"{len(self.rows)} row{'s' if len(self.rows) != 1 else ''}\n")


def aliases(identifiers: Iterable[tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """Query names → table identifiers (see the module docstring)."""
    idents = list(identifiers)
    out: dict[str, tuple[str, ...]] = {}
    local_count: dict[str, int] = {}
    for ident in idents:
        local_count[ident[-1]] = local_count.get(ident[-1], 0) + 1
    for ident in idents:
        out[".".join(ident)] = ident
        local = ident[-1]
        if local_count[local] == 1:
            out[local] = ident
            out.setdefault(re.sub(r"\W", "_", local), ident)
    return out


def list_tables(catalog: Catalog) -> list[tuple[str, ...]]:
    found: list[tuple[str, ...]] = []

    def walk(ns: tuple[str, ...]) -> None:
        for child in catalog.list_namespaces(ns):
            child = tuple(child)
            if child == ns:
                continue
            found.extend(tuple(t) for t in catalog.list_tables(child))
            walk(child)

    walk(())
    return sorted(set(found))


def run_query(catalog: Catalog, sql: str, max_rows: int | None = None) -> QueryResult:
    names = aliases(list_tables(catalog))
    con = duckdb.connect(":memory:")
    try:
        lowered = sql.lower()
        scanned: dict[tuple[str, ...], Any] = {}
        for name, ident in names.items():
            for view in (name, name + MESSAGES_SUFFIX):  # the table; its chunks reassembled
                if not re.search(r"(?<![\w.])" + re.escape(view.lower()) + r"(?![\w])",
                                 lowered):
                    continue
                if ident not in scanned:
                    scanned[ident] = catalog.load_table(ident).scan().to_arrow()
                con.register(view, scanned[ident] if view == name
                             else reassemble(scanned[ident]))
        cur = con.execute(sql)
        if cur is None:  # DuckDB's answer to text without a statement (comments, ";")
            raise ValueError("the query has no SQL statement, e.g. \"SELECT count(*) FROM "
                             "topic_0\"")
        columns = [d[0] for d in cur.description or []]
        rows = cur.fetchmany(max_rows) if max_rows is not None else cur.fetchall()
        return QueryResult(columns, rows)
    finally:
        con.close()


def _plain(v: Any) -> Any:
    if isinstance(v, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(v)).decode()
    if isinstance(v, dt.datetime | dt.date):
        return v.isoformat()
    if isinstance(v, Decimal):
        return str(v)
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v


def _text(v: Any, width: int) -> str:
    if v is None:
        text = "NULL"
    elif isinstance(v, bytes | bytearray | memoryview):
        raw = bytes(v)
        try:
            text = raw.decode()
            if not text.isprintable():
                raise ValueError
        except ValueError:
            text = "0x" + raw.hex()
    else:
        text = json.dumps(_plain(v)) if isinstance(v, dict | list) else str(v)
    return text if len(text) <= width else text[:width - 1] + "…"
