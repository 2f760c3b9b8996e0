"""Typed columns from a topic's Pulsar schema (AVRO, JSON or PROTOBUF_NATIVE, the last through
its Avro rendering in :mod:`offloadd.lakehouse.protobuf`; pure: no I/O).

A topic with a schema gets one more column, ``value``: a struct of the schema's record fields,
typed. A KEY_VALUE schema whose sides are of those types gives ``value`` from its value side and
``kv_key`` (``key`` is the message key's column already) from its key side; the key is read
from the payload (INLINE) or from the message's base64 partition key (SEPARATED). The table
follows the schema's versions in order:

=====================================  ===================================================
Avro                                   Iceberg (every field optional)
=====================================  ===================================================
boolean, int, long, float, double      boolean, int, long, float, double
string, enum                           string
bytes, fixed                           binary
record                                 struct (nested)
array / map                            list / map (string keys)
``[null, T]`` (optional)               T
``timestamp-millis``/``-micros``       timestamptz (microseconds)
``date``                               date
``decimal`` (bytes or fixed)           decimal(precision, scale)
``uuid``                               string (the canonical form)
other unions, ``time-*``               string (JSON) / long
=====================================  ===================================================

Evolution: a version that adds fields (optional ones, or with a default) adds them to the
struct; removing a field leaves its column null for that version's rows; int→long and
float→double widen. A version that changes a field's type, or adds a required field without a
default, is *incompatible*: it adds no column, and its messages become flagged rows
(``decode_error`` names the topic and both versions) with the raw payload kept. A message that
does not decode under its version is flagged the same way.
"""

from __future__ import annotations

import base64
import binascii
import decimal
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)

from offloadd.errors import FormatError
from offloadd.format.avro import AvroError, named_types
from offloadd.format.avro import decode as avro_decode
from offloadd.format.schema_storage import SchemaType, split_key_value, version_from_bytes
from offloadd.lakehouse.avro_compiled import LOGICAL as _LOGICAL
from offloadd.lakehouse.avro_compiled import check as _check
from offloadd.lakehouse.avro_compiled import compile_json_value, compile_value
from offloadd.lakehouse.avro_compiled import optional as _optional
from offloadd.lakehouse.protobuf import NativeSchema

__all__ = ["KEY_COLUMN", "VALUE_COLUMN", "SchemaVersionInfo", "Side", "TypedDecoder",
           "value_schema"]

VALUE_COLUMN = "value"
KEY_COLUMN = "kv_key"  # a KEY_VALUE schema's typed key


class _Ids:
    """Placeholder field ids: the table's own are assigned by ``union_by_name``."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> int:
        self.n += 1
        return self.n


def _iceberg(schema: Any, names: dict[str, Any], ids: _Ids) -> IcebergType:
    s = schema
    if isinstance(s, str) and s in names:
        s = names[s]
    if isinstance(s, list):
        inner, opt = _optional(s)
        return _iceberg(inner, names, ids) if opt else StringType()
    t = s if isinstance(s, str) else s["type"]
    logical = s.get("logicalType") if isinstance(s, dict) else None
    if logical in ("timestamp-millis", "timestamp-micros"):
        return TimestamptzType()
    if logical == "date":
        return DateType()
    if logical == "decimal":
        return DecimalType(int(s["precision"]), int(s.get("scale", 0)))
    if logical == "uuid":
        return StringType()
    if isinstance(t, dict | list):
        return _iceberg(t, names, ids)
    simple: dict[str, IcebergType] = {
        "boolean": BooleanType(), "int": IntegerType(), "long": LongType(),
        "float": FloatType(), "double": DoubleType(), "string": StringType(),
        "enum": StringType(), "bytes": BinaryType(), "fixed": BinaryType(), "null": StringType()}
    if t in simple:
        return simple[t]
    if t == "array":
        return ListType(ids(), _iceberg(s["items"], names, ids), element_required=False)
    if t == "map":
        return MapType(ids(), StringType(), ids(), _iceberg(s["values"], names, ids),
                       value_required=False)
    if t in ("record", "error"):
        return StructType(*(NestedField(ids(), f["name"], _iceberg(f["type"], names, ids),
                                        required=False) for f in s["fields"]))
    raise AvroError(f"unsupported Avro type {t!r}")


def value_schema(avro: Any, column: str = VALUE_COLUMN) -> Schema:
    """A one-column schema (``column``: the record as a struct) to merge into a table."""
    names = named_types(avro)
    ids = _Ids()
    t = _iceberg(avro, names, ids)
    return Schema(NestedField(ids(), column, t, required=False))


def incompatibility(old: IcebergType, new: IcebergType, old_avro: Any, new_avro: Any,
                    path: str = "") -> str | None:
    """Why ``new`` cannot follow ``old`` in one column (None: it can)."""
    if isinstance(old, StructType) and isinstance(new, StructType):
        before = {f.name: f for f in old.fields}
        new_fields = {f["name"]: f for f in _record(new_avro).get("fields", ())}
        old_fields = {f["name"]: f for f in _record(old_avro).get("fields", ())}
        for f in new.fields:
            here = f"{path}{f.name}"
            if f.name in before:
                why = incompatibility(before[f.name].field_type, f.field_type,
                                      old_fields.get(f.name, {}).get("type"),
                                      new_fields.get(f.name, {}).get("type"), here + ".")
                if why:
                    return why
            else:
                fa = new_fields.get(f.name, {})
                if "default" not in fa and not _optional(fa.get("type"))[1]:
                    return f"field {here!r} is added as required without a default"
        return None
    if old == new or (old, new) in ((IntegerType(), LongType()), (FloatType(), DoubleType())):
        return None
    if isinstance(old, ListType) and isinstance(new, ListType):
        return incompatibility(old.element_type, new.element_type, None, None, path)
    if isinstance(old, MapType) and isinstance(new, MapType):
        return incompatibility(old.value_type, new.value_type, None, None, path)
    return f"field {path.rstrip('.')!r} changes type from {old} to {new}"


def _record(avro: Any) -> dict[str, Any]:
    inner = _optional(avro)[0]
    while isinstance(inner, dict) and isinstance(inner.get("type"), dict):
        inner = inner["type"]
    return inner if isinstance(inner, dict) else {}


@dataclass
class Side:
    """What one typed column is decoded with: an AVRO or JSON record schema."""

    type: int  # SchemaType.AVRO, JSON or PROTOBUFNATIVE
    avro: Any  # the record schema (PROTOBUF_NATIVE: its Avro rendering)
    names: dict[str, Any] = field(default_factory=dict)
    native: NativeSchema | None = None  # PROTOBUF_NATIVE: the message class
    # AVRO: payload -> value, compiled on first use (offloadd.lakehouse.avro_compiled)
    avro_value: Callable[[bytes], Any] | None = field(default=None, repr=False, compare=False)
    # JSON: parsed document -> value, compiled on first use
    json_value: Callable[[Any], Any] | None = field(default=None, repr=False, compare=False)


@dataclass
class SchemaVersionInfo:
    """One version as the projector needs it; ``value`` None: not typed (STRING, PROTOBUF,
    ...)."""

    version: int
    type: int  # SchemaType of the version (KEYVALUE for a key/value pair)
    value: Side | None = None
    key: Side | None = None  # KEY_VALUE: the key side, when it is typed
    kv_encoding: str | None = None  # KEY_VALUE: INLINE or SEPARATED
    refused: str | None = None  # why this version is incompatible with the table

    @property
    def typed(self) -> bool:
        return self.value is not None or self.key is not None


class TypedDecoder:
    """Decodes a message by its ``schema_version`` into the ``value`` (and ``kv_key``)
    columns."""

    def __init__(self, topic: str, versions: Sequence[SchemaVersionInfo], *,
                 compiled: bool = True) -> None:
        self.topic = topic
        # False: the reference Avro path, which walks the schema per message (benchmarks)
        self.compiled = compiled
        self.versions = {v.version: v for v in versions}
        self.has_key = any(v.key is not None for v in versions)

    def decode(self, schema_version: bytes | None, payload: bytes | None,
               key: str | None = None) -> tuple[Any, Any, str | None]:
        """(the value struct or None, the key struct or None, the error or None); ``key`` is
        the message's partition key (a SEPARATED KEY_VALUE message's key, base64)."""
        if schema_version is None or payload is None:
            return None, None, None
        try:
            n = version_from_bytes(schema_version)
        except Exception as exc:
            return None, None, f"{self.topic}: bad schema_version: {exc}"
        v = self.versions.get(n)
        if v is None:
            return None, None, f"{self.topic}: schema version {n} is not in the registry"
        if v.refused is not None:
            return None, None, v.refused
        if v.kv_encoding is None:
            value, error = self._side(v.value, payload, n)
            return value, None, error
        try:
            if v.kv_encoding == "SEPARATED":
                key_raw = None if key is None else base64.b64decode(key, validate=True)
                value_raw: bytes | None = payload
            else:
                key_raw, value_raw = split_key_value(payload)
        except (FormatError, binascii.Error) as exc:
            return None, None, (f"{self.topic}: KEY_VALUE message of schema version {n} has "
                                f"no {v.kv_encoding} key and value: {exc}")
        value, error = self._side(v.value, value_raw, n)
        if error is not None:
            return None, None, error
        typed_key, error = self._side(v.key, key_raw, n, "key")
        if error is not None:
            return None, None, error
        return value, typed_key, None

    def _side(self, side: Side | None, raw: bytes | None, n: int,
              what: str = "payload") -> tuple[Any, str | None]:
        if side is None or raw is None:  # not typed, or a null side
            return None, None
        try:
            if side.type == SchemaType.AVRO:
                if not self.compiled:
                    return _convert(side.avro, avro_decode(side.avro, raw, side.names),
                                    side.names, strict=False), None
                read = side.avro_value
                if read is None:  # once per schema version and side
                    read = side.avro_value = compile_value(side.avro, side.names, _reference)
                return read(raw), None
            if side.native is not None:
                return _convert(side.avro, side.native.datum(raw), side.names,
                                strict=False), None
            doc = json.loads(raw)
            if not self.compiled:
                return _convert(side.avro, doc, side.names, strict=True), None
            conv = side.json_value
            if conv is None:
                conv = side.json_value = compile_json_value(side.avro, side.names,
                                                            _reference_json)
            return conv(doc), None
        except (AvroError, ValueError, TypeError, KeyError, decimal.InvalidOperation,
                DecodeError) as exc:
            kind = SchemaType.name(side.type)
            return None, (f"{self.topic}: {what} does not decode as {kind} schema version "
                          f"{n}: {exc}")


def _reference(schema: Any, names: dict[str, Any], payload: bytes) -> Any:
    """The reference Avro path: decode by walking the schema, then convert."""
    return _convert(schema, avro_decode(schema, payload, names), names, strict=False)


def _reference_json(schema: Any, names: dict[str, Any], doc: Any) -> Any:
    """The reference JSON path: convert the document by walking the schema."""
    return _convert(schema, doc, names, strict=True)


def _convert(schema: Any, v: Any, names: dict[str, Any], *, strict: bool) -> Any:
    """An Avro (or JSON) datum as the value of its Iceberg column; ``strict`` checks the types
    a JSON document brings (Avro bytes already matched the schema)."""
    s = names.get(schema, schema) if isinstance(schema, str) else schema
    if isinstance(s, list):
        return _convert_union(s, v, names, strict)
    t = s if isinstance(s, str) else s["type"]
    logical = s.get("logicalType") if isinstance(s, dict) else None
    if v is None:
        if strict and t != "null":
            raise TypeError(f"null for {t}")
        return None
    if logical in _LOGICAL:
        return _LOGICAL[logical](s, v, strict)
    if isinstance(t, dict | list):
        return _convert(t, v, names, strict=strict)
    if t in ("record", "error"):
        if not isinstance(v, dict):
            raise TypeError(f"record {s.get('name')} expected, got {type(v).__name__}")
        return {f["name"]: _convert(f["type"], v.get(f["name"], f.get("default")), names,
                                    strict=strict) for f in s["fields"]}
    if t == "array":
        _check(v, list, strict)
        return [_convert(s["items"], x, names, strict=strict) for x in v]
    if t == "map":
        _check(v, dict, strict)
        return [(k, _convert(s["values"], x, names, strict=strict)) for k, x in v.items()]
    return _primitive(t, v, strict)


def _convert_union(s: list[Any], v: Any, names: dict[str, Any], strict: bool) -> Any:
    inner, opt = _optional(s)
    if v is None:
        if opt or "null" in s:
            return None
        raise TypeError("null for a non-optional union")
    if opt:
        return _convert(inner, v, names, strict=strict)
    return v if isinstance(v, str) else json.dumps(v, default=str)


def _primitive(t: str, v: Any, strict: bool) -> Any:
    if t in ("int", "long"):
        _check(v, int, strict)
    elif t in ("float", "double"):
        _check(v, float, strict)
        return float(v)
    elif t == "boolean":
        _check(v, bool, strict)
    elif t in ("string", "enum"):
        _check(v, str, strict)
    elif t in ("bytes", "fixed") and isinstance(v, str):
        return v.encode("latin-1")  # Avro's JSON encoding of bytes
    return v
