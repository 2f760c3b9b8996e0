"""``offloadd query``: SQL over the topic tables with DuckDB, no cluster and no extension download.

Each table the SQL names is scanned by pyiceberg into Arrow and registered in an in-memory DuckDB
under the names a user would type: the topic's local name (``"topic-0"``, quoted because of the
dash), the same with every character that is not a letter, digit or underscore replaced by ``_``
(``topic_0``), and the full ``"tenant.namespace.topic"``. A local name shared by topics of several
namespaces is registered under its full name only. Each name with ``__messages`` appended is the
same table with chunked messages reassembled (:mod:`offloadd.lakehouse.chunks`). Tables the SQL
does not mention are not read. Predicates of the SQL on ``ledger_id``, ``entry_id`` and the time
columns become the scan's filter (:mod:`~offloadd.lakehouse.pruning`): pyiceberg skips the
partitions and data files that cannot match (a ``__messages`` view reads its whole table: a
filter could cut a message's chunks apart); what is read is held in memory.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, TextIO

import duckdb
from pyiceberg.catalog import Catalog
from pyiceberg.expressions import BooleanExpression
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.table import Table

from offloadd.lakehouse.chunks import MESSAGES_SUFFIX, reassemble
from offloadd.lakehouse.pruning import scan_filters

log = logging.getLogger(__name__)

__all__ = ["QueryResult", "TableScan", "aliases", "list_tables", "run_query"]


@dataclass(frozen=True)
class TableScan:
    """What the query read of one table: data files planned (after pruning) of all the current
    snapshot's, and the scan filter derived from the SQL (None: whole table)."""

    table: str
    files: int
    files_total: int
    row_filter: str | None


class QueryResult:
    def __init__(self, columns: list[str], rows: list[tuple[Any, ...]],
                 scans: list[TableScan] | None = None) -> None:
        self.columns = columns
        self.rows = rows
        self.scans = scans or []

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
        # view -> (table, reassembled): the table's name, and the name + "__messages"
        used: dict[str, tuple[tuple[str, ...], bool]] = {}
        for name, ident in names.items():
            for view in (name, name + MESSAGES_SUFFIX):
                if re.search(r"(?<![\w.])" + re.escape(view.lower()) + r"(?![\w])", lowered):
                    used[view] = (ident, view != name)
        plain = [view for view, (_, whole) in used.items() if not whole]
        filters = scan_filters(con, sql, plain) if plain else {}
        scanned: dict[tuple[Any, ...], Any] = {}
        scans: list[TableScan] = []
        for view, (ident, whole) in used.items():
            flt = None if whole else filters.get(view.lower())
            key = (ident, repr(flt))
            if key not in scanned:
                scanned[key] = _scan(catalog.load_table(ident), ".".join(ident), flt, scans)
            con.register(view, reassemble(scanned[key]) if whole else scanned[key])
        cur = con.execute(sql)
        if cur is None:  # DuckDB's answer to text without a statement (comments, ";")
            raise ValueError("the query has no SQL statement, e.g. \"SELECT count(*) FROM "
                             "topic_0\"")
        columns = [d[0] for d in cur.description or []]
        rows = cur.fetchmany(max_rows) if max_rows is not None else cur.fetchall()
        return QueryResult(columns, rows, scans)
    finally:
        con.close()


def _scan(table: Table, name: str, flt: BooleanExpression | None,
          scans: list[TableScan]) -> Any:
    """The table's rows the filter may keep, as Arrow: pyiceberg prunes partitions and files
    by the filter, then reads only the planned files."""
    scan = table.scan(row_filter=flt) if flt is not None else table.scan()
    tasks = list(scan.plan_files())
    total = len(tasks) if flt is None else len(list(table.scan().plan_files()))
    scans.append(TableScan(name, len(tasks), total, str(flt) if flt is not None else None))
    log.debug("query: %s: %d of %d data files (filter %s)", name, len(tasks), total, flt)
    return ArrowScan(table.metadata, table.io, scan.projection(), scan.row_filter,
                     scan.case_sensitive, scan.limit).to_table(tasks)


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
