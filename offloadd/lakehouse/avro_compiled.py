"""A decoder compiled once per Avro schema version: payload bytes straight to the ``value``
column's Python value, equal to the reference path
``schemas._convert(schema, avro.decode(schema, payload), names, strict=False)`` (pure: no I/O).

Why: the reference path walks the schema for every message (``_resolve``, type-name dict
dispatch, a ``_Reader`` object, then a second walk to convert the datum), ~28 µs per
``Order`` message, the bulk of the projection's time with typed tables. Here the walk happens
once: each schema node becomes a closure ``read(buf, pos) -> (value, pos)`` (a record is a
tuple of (name, reader) pairs, a union a tuple of branch readers, a logical type its
conversion folded in), so a message costs only its bytes.

Errors: the compiled readers check every condition the reference decoder refuses (truncation,
negative lengths, union/enum indexes, boolean bytes, varints over 10 bytes, trailing bytes,
bad UTF-8) and raise; :func:`compile_value` then runs the reference path on that payload, so a
bad payload gets exactly the reference's error (and message) and a good one its value.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import struct
import uuid
from collections.abc import Callable
from typing import Any

from offloadd.format.avro import AvroError, _resolve

__all__ = ["LOGICAL", "Reader", "check", "compile_json_reader", "compile_json_value",
           "compile_reader", "compile_value",
           "optional"]

# read(buf, pos) -> (value, the position after it)
Reader = Callable[[bytes, int], tuple[Any, int]]
_F32 = struct.Struct("<f").unpack_from
_F64 = struct.Struct("<d").unpack_from


class _Truncated(AvroError):
    """Raised by the compiled readers; the reference path says what exactly is wrong."""


def _long(buf: bytes, pos: int) -> tuple[int, int]:
    b = buf[pos]  # IndexError past the end: the caller falls back to the reference
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    z = b & 0x7F
    shift = 7
    pos += 1
    while True:
        b = buf[pos]
        pos += 1
        z |= (b & 0x7F) << shift
        if not b & 0x80:
            return (z >> 1) ^ -(z & 1), pos
        shift += 7
        if shift > 63:
            raise _Truncated("varint longer than 10 bytes")


def _null(buf: bytes, pos: int) -> tuple[None, int]:
    return None, pos


def _boolean(buf: bytes, pos: int) -> tuple[bool, int]:
    b = buf[pos]
    if b > 1:
        raise _Truncated("boolean byte")
    return b == 1, pos + 1


def _float(buf: bytes, pos: int) -> tuple[float, int]:
    return _F32(buf, pos)[0], pos + 4


def _double(buf: bytes, pos: int) -> tuple[float, int]:
    return _F64(buf, pos)[0], pos + 8


def _bytes(buf: bytes, pos: int) -> tuple[bytes, int]:
    n, pos = _long(buf, pos)
    end = pos + n
    if n < 0 or end > len(buf):
        raise _Truncated("bytes")
    return buf[pos:end], end


def _string(buf: bytes, pos: int) -> tuple[str, int]:
    n, pos = _long(buf, pos)
    end = pos + n
    if n < 0 or end > len(buf):
        raise _Truncated("string")
    return buf[pos:end].decode(), end


_RAW_PRIMITIVES: dict[str, Reader] = {
    "null": _null, "boolean": _boolean, "int": _long, "long": _long, "float": _float,
    "double": _double, "bytes": _bytes, "string": _string,
}


def _fixed(size: int) -> Reader:
    def read(buf: bytes, pos: int) -> tuple[bytes, int]:
        end = pos + size
        if size < 0 or end > len(buf):
            raise _Truncated("fixed")
        return buf[pos:end], end
    return read


def _enum(symbols: tuple[str, ...]) -> Reader:
    n = len(symbols)

    def read(buf: bytes, pos: int) -> tuple[str, int]:
        i, pos = _long(buf, pos)
        if not 0 <= i < n:
            raise _Truncated("enum index")
        return symbols[i], pos
    return read


def _union(branches: tuple[Reader, ...]) -> Reader:
    n = len(branches)

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        i, pos = _long(buf, pos)
        if not 0 <= i < n:
            raise _Truncated("union branch")
        return branches[i](buf, pos)
    return read


def _array(item: Reader) -> Reader:
    def read(buf: bytes, pos: int) -> tuple[list[Any], int]:
        out: list[Any] = []
        while True:
            n, pos = _long(buf, pos)
            if not n:
                return out, pos
            if n < 0:  # a block with its byte size
                n = -n
                _, pos = _long(buf, pos)
            for _ in range(n):
                v, pos = item(buf, pos)
                out.append(v)
    return read


def _map(value: Reader, pairs: bool) -> Reader:
    """A map: a dict (the raw datum) or, converted, a list of (key, value) pairs."""
    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        m: dict[str, Any] = {}
        while True:
            n, pos = _long(buf, pos)
            if not n:
                return (list(m.items()) if pairs else m), pos
            if n < 0:
                n = -n
                _, pos = _long(buf, pos)
            for _ in range(n):
                k, pos = _string(buf, pos)
                m[k], pos = value(buf, pos)
    return read


def _record(fields: list[tuple[str, Reader]]) -> Reader:
    def read(buf: bytes, pos: int) -> tuple[dict[str, Any], int]:
        out: dict[str, Any] = {}
        for name, rd in fields:  # filled in place: a recursive record's list is complete later
            out[name], pos = rd(buf, pos)
        return out, pos
    return read


def _then(read: Reader, post: Callable[[Any], Any]) -> Reader:
    """``read``, then ``post`` of the value (None stays None, as the reference's convert)."""
    def out(buf: bytes, pos: int) -> tuple[Any, int]:
        v, pos = read(buf, pos)
        return (None if v is None else post(v)), pos
    return out


class _Compiler:
    def __init__(self, names: dict[str, Any]) -> None:
        self.names = names
        self._raw: dict[int, Reader] = {}  # by id of the (named) record dict: recursion
        self._conv: dict[int, Reader] = {}

    # -- the datum, as offloadd.format.avro._dec reads it ----------------------------------
    def raw(self, schema: Any) -> Reader:
        s = _resolve(schema, self.names)
        if isinstance(s, list):
            return _union(tuple(self.raw(b) for b in s))
        t = s if isinstance(s, str) else s["type"]
        if isinstance(t, dict | list):
            return self.raw(t)
        prim = _RAW_PRIMITIVES.get(t)
        if prim is not None:
            return prim
        if t == "fixed":
            return _fixed(int(s["size"]))
        if t == "enum":
            return _enum(tuple(s["symbols"]))
        if t == "array":
            return _array(self.raw(s["items"]))
        if t == "map":
            return _map(self.raw(s["values"]), pairs=False)
        if t in ("record", "error"):
            return self._recursive(self._raw, s, lambda: [(f["name"], self.raw(f["type"]))
                                                          for f in s["fields"]])
        raise AvroError(f"unsupported Avro type {t!r}")

    # -- the datum converted, as offloadd.lakehouse.schemas._convert(strict=False) ---------
    def conv(self, schema: Any) -> Reader:
        s = self.names.get(schema, schema) if isinstance(schema, str) else schema
        if isinstance(s, list):
            inner, opt = optional(s)
            if opt:
                value = self.conv(inner)
                return _union(tuple(_null if b == "null" else value for b in s))
            has_null = "null" in s

            def other(v: Any) -> Any:
                if v is None:
                    if has_null:
                        return None
                    raise TypeError("null for a non-optional union")
                return v if isinstance(v, str) else json.dumps(v, default=str)
            raw = self.raw(schema)

            def read_other(buf: bytes, pos: int) -> tuple[Any, int]:
                v, pos = raw(buf, pos)
                return other(v), pos
            return read_other
        t = s if isinstance(s, str) else s["type"]
        logical = s.get("logicalType") if isinstance(s, dict) else None
        if logical in LOGICAL:
            return _then(self.raw(schema), self._logical(s, logical, LOGICAL[logical]))
        if isinstance(t, dict | list):
            return self.conv(t)
        if t in ("record", "error"):
            return self._recursive(self._conv, s, lambda: [(f["name"], self.conv(f["type"]))
                                                           for f in s["fields"]])
        if t == "array":
            return _array(self.conv(s["items"]))
        if t == "map":
            return _map(self.conv(s["values"]), pairs=True)
        raw = self.raw(schema)
        if t in ("float", "double"):
            return raw if raw in (_float, _double) else _then(raw, float)
        if raw in (_null, _boolean, _long, _string, _bytes):
            return raw  # already the column's value
        if t in ("bytes", "fixed"):
            return _then(raw, lambda v: v.encode("latin-1") if isinstance(v, str) else v)
        return raw  # enum, fixed, a named type the reference leaves as decoded

    @staticmethod
    def _logical(s: dict[str, Any], logical: str,
                 generic: Callable[[Any, Any, bool], Any]) -> Callable[[Any], Any]:
        base = s.get("type")
        if logical == "timestamp-millis" and base in ("int", "long"):
            return lambda v: v * 1000
        if logical == "timestamp-micros" and base in ("int", "long"):
            return lambda v: v
        if logical == "decimal" and base in ("bytes", "fixed"):
            exp = -int(s.get("scale", 0))
            dec = decimal.Decimal
            frm = int.from_bytes
            return lambda v: dec(frm(v, "big", signed=True)).scaleb(exp)
        return lambda v: generic(s, v, False)

    @staticmethod
    def _recursive(memo: dict[int, Reader], s: dict[str, Any],
                   fields: Callable[[], list[tuple[str, Reader]]]) -> Reader:
        """A record's reader, built once per record dict; a reference to the record from
        inside itself reads through the list that is filled after."""
        key = id(s)
        done = memo.get(key)
        if done is not None:
            return done
        slots: list[tuple[str, Reader]] = []
        memo[key] = _record(slots)
        slots.extend(fields())
        return memo[key]


def compile_reader(schema: Any, names: dict[str, Any]) -> Callable[[bytes], Any]:
    """The compiled decoder alone: the converted value, or an exception (any kind) where the
    reference decoder refuses the payload (for tests; use :func:`compile_value`)."""
    read = _Compiler(names).conv(schema)

    def decode(payload: bytes) -> Any:
        v, pos = read(payload, 0)
        if pos != len(payload):
            raise _Truncated("bytes left after the datum")
        return v
    return decode


def compile_value(schema: Any, names: dict[str, Any],
                  reference_path: Callable[[Any, dict[str, Any], bytes], Any]
                  ) -> Callable[[bytes], Any]:
    """``payload -> value``, exactly ``reference_path(schema, names, payload)``'s value or
    exception (``schemas._reference``), compiled once. A schema the compiler cannot take gives
    the reference path itself."""
    def reference(payload: bytes) -> Any:
        return reference_path(schema, names, payload)

    try:
        fast = compile_reader(schema, names)
    except (AvroError, KeyError, TypeError, ValueError, RecursionError):
        return reference

    def decode(payload: bytes) -> Any:
        if type(payload) is not bytes:
            payload = bytes(payload)
        try:
            return fast(payload)
        except Exception:  # whatever failed, the reference says what exactly (or decodes it)
            return reference(payload)
    return decode



# ---- JSON documents (a JSON schema's payloads, after json.loads) ----------------------------

Convert = Callable[[Any], Any]


def _strict(kind: type | tuple[type, ...], post: Convert | None = None) -> Convert:
    """A primitive's strict check (bool is not an int, an int is a float) and its value."""
    def conv(v: Any) -> Any:
        if (type(v) is bool and kind is not bool) or not isinstance(v, kind):
            raise TypeError("mismatch")
        return v if post is None else post(v)
    return conv


class _JsonCompiler:
    """Mirrors ``schemas._convert(strict=True)`` branch for branch, decided once per schema
    node; any mismatch raises (the reference then says what exactly)."""

    def __init__(self, names: dict[str, Any]) -> None:
        self.names = names
        self._records: dict[int, Convert] = {}

    def conv(self, schema: Any) -> Convert:
        s = self.names.get(schema, schema) if isinstance(schema, str) else schema
        if isinstance(s, list):
            inner, opt = optional(s)
            has_null = opt or "null" in s
            value = self.conv(inner) if opt else None

            def union(v: Any) -> Any:
                if v is None:
                    if has_null:
                        return None
                    raise TypeError("null")
                if value is not None:
                    return value(v)
                return v if isinstance(v, str) else json.dumps(v, default=str)
            return union
        t = s if isinstance(s, str) else s["type"]
        logical = s.get("logicalType") if isinstance(s, dict) else None
        body = self._body(s, t, logical)
        if t == "null":
            return lambda v: None if v is None else body(v)

        def not_null(v: Any) -> Any:
            if v is None:
                raise TypeError("null")
            return body(v)
        return not_null

    def _body(self, s: Any, t: Any, logical: Any) -> Convert:
        """The value of a non-null ``v``."""
        if logical in LOGICAL:
            handler = LOGICAL[logical]
            return lambda v: handler(s, v, True)
        if isinstance(t, dict | list):
            return self.conv(t)
        if t in ("record", "error"):
            key = id(s)
            done = self._records.get(key)
            if done is not None:
                return done
            fields: list[tuple[str, Any, Convert]] = []

            def record(v: Any) -> Any:
                if not isinstance(v, dict):
                    raise TypeError("record")
                return {name: conv(v.get(name, default)) for name, default, conv in fields}
            self._records[key] = record
            fields.extend((f["name"], f.get("default"), self.conv(f["type"]))
                          for f in s["fields"])
            return record
        if t == "array":
            item = self.conv(s["items"])

            def array(v: Any) -> Any:
                if not isinstance(v, list):
                    raise TypeError("array")
                return [item(x) for x in v]
            return array
        if t == "map":
            value = self.conv(s["values"])

            def map_(v: Any) -> Any:
                if not isinstance(v, dict):
                    raise TypeError("map")
                return [(k, value(x)) for k, x in v.items()]
            return map_
        # a named type's reference, "null" with a value: as the reference, unchanged
        return _JSON_PRIMITIVES.get(t, _same) if isinstance(t, str) else _same


def _same(v: Any) -> Any:
    return v


_JSON_PRIMITIVES: dict[str, Convert] = {
    "int": _strict(int), "long": _strict(int), "float": _strict((int, float), float),
    "double": _strict((int, float), float), "boolean": _strict(bool), "string": _strict(str),
    "enum": _strict(str),
    "bytes": lambda v: v.encode("latin-1") if isinstance(v, str) else v,
    "fixed": lambda v: v.encode("latin-1") if isinstance(v, str) else v,
}


def compile_json_reader(schema: Any, names: dict[str, Any]) -> Convert:
    """The compiled JSON converter alone: the value, or an exception (any kind) where the
    reference refuses the document (for tests; use :func:`compile_json_value`)."""
    return _JsonCompiler(names).conv(schema)


def compile_json_value(schema: Any, names: dict[str, Any],
                       reference_path: Callable[[Any, dict[str, Any], Any], Any]
                       ) -> Callable[[Any], Any]:
    """``document -> value`` for a JSON schema's parsed payloads: exactly
    ``reference_path(schema, names, document)`` (``schemas._convert(strict=True)``), its value
    or its exception, compiled once."""
    def reference(doc: Any) -> Any:
        return reference_path(schema, names, doc)

    try:
        fast = compile_json_reader(schema, names)
    except (AvroError, KeyError, TypeError, ValueError, RecursionError):
        return reference

    def convert(doc: Any) -> Any:
        try:
            return fast(doc)
        except Exception:  # whatever failed, the reference says what exactly (or converts it)
            return reference(doc)
    return convert

# ---- the column values of logical types, shared with offloadd.lakehouse.schemas -----------

_EPOCH_DATE = dt.date(1970, 1, 1)


def optional(schema: Any) -> tuple[Any, bool]:
    """``[null, T]`` → (T, True); anything else → (itself, False)."""
    if isinstance(schema, list):
        rest = [s for s in schema if s != "null"]
        if len(rest) == 1 and len(rest) < len(schema):
            return rest[0], True
    return schema, False


def _timestamp(s: Any, v: Any, strict: bool) -> Any:
    check(v, int, strict)
    return v * 1000 if s.get("logicalType") == "timestamp-millis" else v


def _date(s: Any, v: Any, strict: bool) -> Any:
    check(v, int, strict)
    return _EPOCH_DATE + dt.timedelta(days=v)


def _decimal(s: Any, v: Any, strict: bool) -> Any:
    scale = int(s.get("scale", 0))
    if isinstance(v, int | float) and not isinstance(v, bool):
        # a JSON number (bytes(5) would be five zero bytes: a silent 0)
        return decimal.Decimal(str(v)).quantize(decimal.Decimal(1).scaleb(-scale))
    if not isinstance(v, str | bytes | bytearray):
        raise TypeError(f"decimal expected, got {type(v).__name__}")
    raw = v.encode("latin-1") if isinstance(v, str) else bytes(v)
    unscaled = int.from_bytes(raw, "big", signed=True)
    return decimal.Decimal(unscaled).scaleb(-scale)


def _uuid(s: Any, v: Any, strict: bool) -> Any:
    return str(uuid.UUID(v)) if isinstance(v, str) else str(uuid.UUID(bytes=bytes(v)))


LOGICAL: dict[str, Callable[[Any, Any, bool], Any]] = {
    "timestamp-millis": _timestamp,
    "timestamp-micros": _timestamp,
    "date": _date,
    "decimal": _decimal,
    "uuid": _uuid,
}


def check(v: Any, kind: type, strict: bool) -> None:
    if not strict:
        return
    if kind is float:
        ok = isinstance(v, int | float) and not isinstance(v, bool)
    elif kind is int:
        ok = isinstance(v, int) and not isinstance(v, bool)
    else:
        ok = isinstance(v, kind)
    if not ok:
        raise TypeError(f"{kind.__name__} expected, got {type(v).__name__} {v!r:.40}")
