"""The compiled Avro decoder gives exactly what the reference path gives (decode, then
convert to the column's value), on generated schemas and values, and on damaged payloads; the
compiled JSON converter exactly what the strict reference conversion gives."""

from __future__ import annotations

import functools
import itertools
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from offloadd.format.avro import decode, encode, named_types
from offloadd.lakehouse.avro_compiled import (
    compile_json_reader,
    compile_json_value,
    compile_reader,
    compile_value,
)
from offloadd.lakehouse.schemas import _convert, _reference_json
from offloadd.shell.produce_schema import ORDER_SCHEMA, order

_LEAVES: list[Any] = [
    "null", "boolean", "int", "long", "float", "double", "bytes", "string",
    {"type": "long", "logicalType": "timestamp-millis"},
    {"type": "long", "logicalType": "timestamp-micros"},
    {"type": "int", "logicalType": "date"},
    {"type": "string", "logicalType": "uuid"},
    {"type": "bytes", "logicalType": "decimal", "precision": 20, "scale": 3},
    {"type": "int", "logicalType": "time-millis"},
]


def reference(schema: Any, names: dict[str, Any], payload: bytes) -> Any:
    return _convert(schema, decode(schema, payload, names), names, strict=False)


@st.composite
def schemas(draw: st.DrawFn, ids: itertools.count[int], depth: int = 0) -> Any:
    kinds = ["leaf", "enum", "fixed", "fixed-decimal"]
    if depth < 3:
        kinds += ["record", "array", "map", "optional", "union"]
    kind = draw(st.sampled_from(kinds))
    if kind == "leaf":
        return draw(st.sampled_from(_LEAVES))
    n = next(ids)
    if kind == "enum":
        k = draw(st.integers(1, 4))
        return {"type": "enum", "name": f"E{n}", "symbols": [f"S{i}" for i in range(k)]}
    if kind == "fixed":
        return {"type": "fixed", "name": f"F{n}", "size": draw(st.integers(0, 6))}
    if kind == "fixed-decimal":
        return {"type": "fixed", "name": f"D{n}", "size": draw(st.integers(1, 8)),
                "logicalType": "decimal", "precision": 18, "scale": draw(st.integers(0, 4))}
    if kind == "array":
        return {"type": "array", "items": draw(schemas(ids, depth + 1))}
    if kind == "map":
        return {"type": "map", "values": draw(schemas(ids, depth + 1))}
    if kind == "optional":
        inner = draw(schemas(ids, depth + 1).filter(
            lambda s: s != "null" and not isinstance(s, list)))
        return draw(st.sampled_from([["null", inner], [inner, "null"]]))
    if kind == "union":
        return draw(st.sampled_from([["null", "long", "string"], ["int", "string"],
                                     ["string", "bytes", "null"], ["double", "boolean"]]))
    k = draw(st.integers(0, 4))
    return {"type": "record", "name": f"R{n}",
            "fields": [{"name": f"f{i}", "type": draw(schemas(ids, depth + 1))}
                       for i in range(k)]}


@st.composite
def values(draw: st.DrawFn, schema: Any) -> Any:
    if isinstance(schema, list):
        return draw(values(draw(st.sampled_from(schema))))
    t = schema if isinstance(schema, str) else schema["type"]
    logical = schema.get("logicalType") if isinstance(schema, dict) else None
    if logical == "uuid":
        return str(draw(st.uuids()))
    if logical == "date":
        return draw(st.integers(-700_000, 2_000_000))
    if logical == "decimal" and t == "bytes":
        return draw(st.binary(min_size=1, max_size=9))
    simple: dict[str, st.SearchStrategy[Any]] = {
        "null": st.none(), "boolean": st.booleans(),
        "int": st.integers(-2**31, 2**31 - 1), "long": st.integers(-2**63, 2**63 - 1),
        "float": st.floats(width=32, allow_nan=False),
        "double": st.floats(allow_nan=False), "bytes": st.binary(max_size=12),
        "string": st.text(max_size=8)}
    if t in simple:
        return draw(simple[t])
    if t == "enum":
        return draw(st.sampled_from(schema["symbols"]))
    if t == "fixed":
        return draw(st.binary(min_size=schema["size"], max_size=schema["size"]))
    if t == "array":
        return draw(st.lists(values(schema["items"]), max_size=3))
    if t == "map":
        return draw(st.dictionaries(st.text(max_size=4), values(schema["values"]), max_size=3))
    return {f["name"]: draw(values(f["type"])) for f in schema["fields"]}


def _same(a: Any, b: Any) -> bool:
    """Equal, and alike to the last detail (a decimal's exponent, -0.0, a NaN)."""
    return type(a) is type(b) and repr(a) == repr(b)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_compiled_equals_reference_on_generated_schemas(data: st.DataObject) -> None:
    schema = data.draw(schemas(itertools.count()))
    names = named_types(schema)
    datum = data.draw(values(schema))
    payload = encode(schema, datum, names)
    want = reference(schema, names, payload)
    assert _same(compile_reader(schema, names)(payload), want)
    assert _same(compile_value(schema, names, reference)(payload), want)


def _outcome(fn: Any, payload: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(payload)
    except Exception as exc:
        return "error", exc


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_damaged_payload_fails_or_decodes_the_same(data: st.DataObject) -> None:
    """Truncated, extended or altered bytes: the compiled reader refuses exactly what the
    reference refuses, and the compiled value path raises the reference's own error."""
    schema = data.draw(schemas(itertools.count()))
    names = named_types(schema)
    payload = bytearray(encode(schema, data.draw(values(schema)), names))
    how = data.draw(st.sampled_from(["cut", "extend", "flip"]))
    if how == "cut" and payload:
        del payload[data.draw(st.integers(0, len(payload) - 1)):]
    elif how == "extend":
        payload += data.draw(st.binary(min_size=1, max_size=4))
    elif payload:
        payload[data.draw(st.integers(0, len(payload) - 1))] = data.draw(st.integers(0, 255))
    raw = bytes(payload)
    want = _outcome(lambda p: reference(schema, names, p), raw)
    fast = _outcome(compile_reader(schema, names), raw)
    value = _outcome(compile_value(schema, names, reference), raw)
    assert fast[0] == want[0], (schema, raw, fast, want)
    if want[0] == "ok":
        assert _same(fast[1], want[1]) and _same(value[1], want[1])
    else:
        assert type(value[1]) is type(want[1]) and str(value[1]) == str(want[1])


def test_order_messages_and_a_recursive_record() -> None:
    names = named_types(ORDER_SCHEMA)
    for i in range(50):
        p = encode(ORDER_SCHEMA, order(i, 1_700_000_000_000))
        assert _same(compile_reader(ORDER_SCHEMA, names)(p), reference(ORDER_SCHEMA, names, p))
    node = {"type": "record", "name": "Node", "fields": [
        {"name": "v", "type": "int"}, {"name": "next", "type": ["null", "Node"]}]}
    names = named_types(node)
    p = encode(node, {"v": 1, "next": {"v": 2, "next": {"v": 3, "next": None}}})
    assert _same(compile_reader(node, names)(p), reference(node, names, p))


def _jsonable(v: Any) -> Any:
    """An Avro datum as a JSON schema's document carries it (bytes as latin-1 text)."""
    if isinstance(v, bytes):
        return v.decode("latin-1")
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_jsonable(x) for x in v]
    return v


_JUNK = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["f0", "f1", "f2", "x"]), inner, max_size=3),
    max_leaves=8)


@st.composite
def documents(draw: st.DrawFn, schema: Any) -> Any:
    """A document shaped by ``schema`` with wrong values at any node (a bool for an int, an
    int for a float, a list for a record, a missing or null field)."""
    if draw(st.integers(0, 3)) == 0:
        return draw(_JUNK)
    if isinstance(schema, list):
        return draw(documents(draw(st.sampled_from(schema))))
    t = schema if isinstance(schema, str) else schema["type"]
    if t in ("record", "error"):
        fields = draw(st.lists(st.sampled_from(schema["fields"]), unique_by=lambda f: f["name"])
                      ) if schema["fields"] else []
        return {f["name"]: draw(documents(f["type"])) for f in fields}
    if t == "array":
        return draw(st.lists(documents(schema["items"]), max_size=3))
    if t == "map":
        return draw(st.dictionaries(st.text(max_size=3), documents(schema["values"]),
                                    max_size=3))
    return _jsonable(draw(values(schema)))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_compiled_json_equals_the_strict_reference(data: st.DataObject) -> None:
    """Documents that fit the schema and documents that do not: the same value, or the same
    exception with the same message."""
    schema = data.draw(schemas(itertools.count()))
    names = named_types(schema)
    doc = data.draw(st.one_of(values(schema).map(_jsonable), documents(schema)))
    want = _outcome(lambda d: _reference_json(schema, names, d), doc)
    fast = _outcome(compile_json_reader(schema, names), doc)
    got = _outcome(compile_json_value(schema, names, _reference_json), doc)
    assert fast[0] == got[0] == want[0], (schema, doc, fast, want)
    if want[0] == "ok":
        assert _same(fast[1], want[1]) and _same(got[1], want[1])
    else:
        assert type(got[1]) is type(want[1]) and str(got[1]) == str(want[1])


def test_compiled_json_refuses_what_the_reference_refuses_at_every_leaf() -> None:
    """Every leaf type against every kind of JSON value, bare, optional and in a record."""
    junk: list[Any] = [None, True, False, 0, -7, 2**70, 1.5, -0.0, "", "x", "é€",
                       "12345678-1234-5678-1234-567812345678", [], [1], {}, {"f0": 1}]
    leaves = [*_LEAVES, {"type": "enum", "name": "E", "symbols": ["A"]},
              {"type": "fixed", "name": "F", "size": 2}]
    for leaf in leaves:
        for schema in (leaf, ["null", leaf], {"type": "record", "name": "R", "fields": [
                {"name": "f0", "type": leaf}]}):
            names = named_types(schema)
            for v in junk:
                doc = {"f0": v} if isinstance(schema, dict) and schema.get("name") == "R" else v
                want = _outcome(functools.partial(_reference_json, schema, names), doc)
                fast = _outcome(compile_json_reader(schema, names), doc)
                assert fast[0] == want[0], (schema, doc, fast, want)
                if want[0] == "ok":
                    assert _same(fast[1], want[1]), (schema, doc)
