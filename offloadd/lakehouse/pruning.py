"""Which rows of a table a query can need, from its SQL: the scan filter ``offloadd query`` hands
pyiceberg, so that partitions and data files that cannot match are not read.

DuckDB parses the SQL (``json_serialize_sql``); nothing is guessed from text. A filter is only
derived for a table named **once** in the statement, directly in the ``FROM`` of a ``SELECT``
(no join there): then each top-level ``AND`` term of that ``WHERE`` comparing a pruning column
with a constant (``=``, ``<``, ``<=``, ``>``, ``>=``, ``BETWEEN``) holds for every row the query
reads. Anything else (a table named twice, a join, ``OR``, a function of the column, a CTE of the
same name, a statement DuckDB cannot serialize) gives no filter: the whole table is scanned, as
before. DuckDB still applies the whole ``WHERE`` to what was scanned, so a filter only has to
keep a superset of the rows.

Pruning columns: ``ledger_id``, ``entry_id`` (integer constants) and ``publish_time``,
``event_time``, ``broker_timestamp`` (timestamps as strings, ``TIMESTAMP '…'``,
``TIMESTAMPTZ '…'`` or ``DATE '…'``; without an offset, in the connection's ``TimeZone`` as DuckDB
reads them). pyiceberg turns the filter into partition pruning (``day``/``hour`` of a time
column) and file pruning by the column bounds every data file records.
"""

from __future__ import annotations

import datetime as dt
import json
import zoneinfo
from collections.abc import Collection, Iterator
from typing import Any

from pyiceberg.expressions import (
    And,
    BooleanExpression,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    LessThan,
    LessThanOrEqual,
)

__all__ = ["PRUNING_COLUMNS", "scan_filters"]

INTEGER_COLUMNS = ("ledger_id", "entry_id")
TIME_COLUMNS = ("publish_time", "event_time", "broker_timestamp")
PRUNING_COLUMNS = INTEGER_COLUMNS + TIME_COLUMNS
_OPS: dict[str, Any] = {
    "COMPARE_EQUAL": EqualTo, "COMPARE_GREATERTHAN": GreaterThan,
    "COMPARE_GREATERTHANOREQUALTO": GreaterThanOrEqual, "COMPARE_LESSTHAN": LessThan,
    "COMPARE_LESSTHANOREQUALTO": LessThanOrEqual,
}
_FLIP = {"COMPARE_EQUAL": "COMPARE_EQUAL", "COMPARE_GREATERTHAN": "COMPARE_LESSTHAN",
         "COMPARE_GREATERTHANOREQUALTO": "COMPARE_LESSTHANOREQUALTO",
         "COMPARE_LESSTHAN": "COMPARE_GREATERTHAN",
         "COMPARE_LESSTHANOREQUALTO": "COMPARE_GREATERTHANOREQUALTO"}


def scan_filters(con: Any, sql: str, names: Collection[str]) -> dict[str, BooleanExpression]:
    """Query name (lower case) → the scan filter for it; a name without a filter is absent.
    ``con``: the DuckDB connection the query runs on (its parser and time zone)."""
    try:
        # fetchall: this DuckDB refuses other work while a result is unfinished
        rows = con.execute("SELECT json_serialize_sql(?)", [sql]).fetchall()
        tree = json.loads(rows[0][0]) if rows else {}
        tz = zoneinfo.ZoneInfo(con.execute("SELECT current_setting('TimeZone')").fetchall()[0][0])
    except Exception:  # whatever DuckDB cannot serialize is scanned whole
        return {}
    if tree.get("error") or not tree.get("statements"):
        return {}
    wanted = {n.lower() for n in names}
    refs: dict[str, int] = {}
    ctes: set[str] = set()
    selects: list[tuple[str, str, Any]] = []  # (table, alias, where clause)
    for node in _walk(tree):
        if node.get("type") == "BASE_TABLE":
            name = _base_name(node)
            if name is not None:
                refs[name] = refs.get(name, 0) + 1
        cte = node.get("cte_map")
        if isinstance(cte, dict):
            for entry in cte.get("map") or []:
                key = entry.get("key") if isinstance(entry, dict) else None
                if isinstance(key, str):
                    ctes.add(key.lower())
        frm = node.get("from_table")
        if node.get("type") == "SELECT_NODE" and isinstance(frm, dict) and \
                frm.get("type") == "BASE_TABLE" and node.get("where_clause"):
            name = _base_name(frm)
            if name is not None:
                selects.append((name, str(frm.get("alias") or "").lower(),
                                node["where_clause"]))
    out: dict[str, BooleanExpression] = {}
    for name, alias, where in selects:
        if name not in wanted or refs.get(name) != 1 or name in ctes:
            continue
        terms = [t for c in _conjuncts(where) for t in _terms(c, name, alias, tz)]
        if terms:
            out[name] = terms[0] if len(terms) == 1 else And(*terms)
    return out


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


def _base_name(node: dict[str, Any]) -> str | None:
    if node.get("schema_name") or node.get("catalog_name"):
        return None  # schema.table: not one of the names offloadd registers
    name = node.get("table_name")
    return name.lower() if isinstance(name, str) else None


def _conjuncts(expr: Any) -> Iterator[dict[str, Any]]:
    if not isinstance(expr, dict):
        return
    if expr.get("type") == "CONJUNCTION_AND":
        for c in expr.get("children") or []:
            yield from _conjuncts(c)
    else:
        yield expr


def _column(expr: Any, table: str, alias: str) -> str | None:
    if not isinstance(expr, dict) or expr.get("class") != "COLUMN_REF":
        return None
    parts = [str(p).lower() for p in expr.get("column_names") or []]
    if len(parts) == 2 and parts[0] in (table, alias):
        parts = parts[1:]
    return parts[0] if len(parts) == 1 and parts[0] in PRUNING_COLUMNS else None


def _terms(expr: dict[str, Any], table: str, alias: str,
           tz: dt.tzinfo) -> Iterator[BooleanExpression]:
    kind = expr.get("type")
    if kind == "COMPARE_BETWEEN":
        col = _column(expr.get("input"), table, alias)
        if col is None:
            return
        lo, hi = _value(expr.get("lower"), col, tz), _value(expr.get("upper"), col, tz)
        if lo is not None:
            yield _OPS["COMPARE_GREATERTHANOREQUALTO"](col, lo)
        if hi is not None:
            yield _OPS["COMPARE_LESSTHANOREQUALTO"](col, hi)
        return
    if kind not in _OPS:
        return
    left, right = expr.get("left"), expr.get("right")
    col = _column(left, table, alias)
    if col is None:
        col, left, right, kind = _column(right, table, alias), right, left, _FLIP[kind]
    if col is None:
        return
    value = _value(right, col, tz)
    if value is not None:
        yield _OPS[kind](col, value)


def _value(expr: Any, column: str, tz: dt.tzinfo) -> Any:
    """The constant, typed for the column; None when it is not a constant of a usable kind."""
    cast = None
    if isinstance(expr, dict) and expr.get("class") == "CAST" and not expr.get("try_cast"):
        cast = str((expr.get("type_expr") or {}).get("type_name") or "").upper()
        expr = expr.get("child")
    if not isinstance(expr, dict) or expr.get("class") != "CONSTANT":
        return None
    lit = expr.get("literal") or {}
    text = lit.get("text") if isinstance(lit, dict) else None
    kind = lit.get("kind") if isinstance(lit, dict) else None
    if not isinstance(text, str):
        return None
    if column in INTEGER_COLUMNS:
        if cast is not None or kind not in ("INTEGER", "BIGINT", "HUGEINT"):
            return None
        try:
            return int(text)
        except ValueError:
            return None
    if kind != "STRING" or cast not in (None, "TIMESTAMP", "TIMESTAMPTZ", "DATE",
                                        "TIMESTAMP WITH TIME ZONE"):
        return None
    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    if cast == "DATE" and (when.hour, when.minute, when.second, when.microsecond) != (0, 0, 0, 0):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=tz)
    return when.astimezone(dt.UTC).isoformat()


