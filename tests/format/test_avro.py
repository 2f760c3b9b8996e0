"""The Avro binary codec: round trips of generated schemas and datums, the bytes of known
datums (the Avro specification's examples), and corrupt input refused with AvroError."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from offloadd.format.avro import AvroError, decode, encode

_PRIM = {
    "boolean": st.booleans(),
    "int": st.integers(-(2**31), 2**31 - 1),
    "long": st.integers(-(2**63), 2**63 - 1),
    "double": st.floats(allow_nan=False),
    "string": st.text(),
    "bytes": st.binary(),
}


@st.composite
def schema_and_datum(draw: st.DrawFn, depth: int = 0) -> tuple[Any, Any]:
    kind = draw(st.sampled_from(["prim", "optional", "record", "array", "map", "ts"]
                                if depth < 2 else ["prim", "optional", "ts"]))
    if kind == "prim":
        name = draw(st.sampled_from(sorted(_PRIM)))
        return name, draw(_PRIM[name])
    if kind == "ts":
        return {"type": "long", "logicalType": "timestamp-millis"}, draw(_PRIM["long"])
    if kind == "optional":
        name = draw(st.sampled_from(sorted(_PRIM)))
        return ["null", name], draw(st.none() | _PRIM[name])
    if kind == "array":
        s, v = draw(schema_and_datum(depth + 1))
        return {"type": "array", "items": s}, [v] * draw(st.integers(0, 3))
    if kind == "map":
        s, v = draw(schema_and_datum(depth + 1))
        keys = draw(st.lists(st.text(max_size=5), max_size=3, unique=True))
        return {"type": "map", "values": s}, dict.fromkeys(keys, v)
    n = draw(st.integers(1, 4))
    fields, datum = [], {}
    for i in range(n):
        s, v = draw(schema_and_datum(depth + 1))
        fields.append({"name": f"f{i}", "type": s})
        datum[f"f{i}"] = v
    return {"type": "record", "name": f"R{depth}_{draw(st.integers(0, 10**6))}",
            "fields": fields}, datum


@settings(max_examples=300, deadline=None)
@given(schema_and_datum())
def test_round_trip(sd: tuple[Any, Any]) -> None:
    schema, datum = sd
    assert decode(schema, encode(schema, datum)) == datum


def test_known_bytes() -> None:
    # the specification's examples: long -64 is 0x7f, 64 is 0x80 0x01; "foo" is 06 66 6f 6f
    assert encode("long", -64) == b"\x7f"
    assert encode("long", 64) == b"\x80\x01"
    assert encode("string", "foo") == b"\x06foo"
    rec = {"type": "record", "name": "test", "fields": [
        {"name": "a", "type": "long"}, {"name": "b", "type": "string"}]}
    assert encode(rec, {"a": 27, "b": "foo"}) == b"\x36\x06foo"
    assert encode(["null", "string"], "a") == b"\x02\x02a"
    assert encode(["null", "string"], None) == b"\x00"
    assert encode("double", 1.5) == b"\x00\x00\x00\x00\x00\x00\xf8\x3f"


def test_named_type_referred_to_by_name() -> None:
    s = {"type": "record", "name": "Pair", "namespace": "x", "fields": [
        {"name": "a", "type": {"type": "record", "name": "Point", "fields": [
            {"name": "v", "type": "int"}]}},
        {"name": "b", "type": ["null", "x.Point"]}]}
    d = {"a": {"v": 1}, "b": {"v": -2}}
    assert decode(s, encode(s, d)) == d


@pytest.mark.parametrize(("schema", "raw"), [
    ("string", b"\x06fo"),  # truncated
    (["null", "string"], b"\x04"),  # union branch 2 of 2
    ("long", b"\x02\x00"),  # trailing byte
    ("boolean", b"\x02"),
    ("string", b"\x02\xff"),  # not UTF-8
    ("long", b"\xff" * 11),
])
def test_corrupt_input_is_an_avro_error(schema: Any, raw: bytes) -> None:
    with pytest.raises(AvroError):
        decode(schema, raw)
