"""Avro binary encoding of one datum (no container file, no header), as Pulsar's AVRO schema
writes a message payload (pure: no I/O).

The locked environment has no Avro library (pyiceberg's decoder reads Iceberg manifests, not
arbitrary writer schemas), so this is a small codec for what Pulsar producers write: records,
the primitive types, unions, enums, arrays, maps, fixed, and the logical types
``timestamp-millis``/``timestamp-micros``, ``date``, ``time-millis``/``time-micros``,
``decimal`` and ``uuid``. Datums are the plain Avro values: a logical type is decoded as its
underlying value (``timestamp-millis`` an int of milliseconds, ``decimal`` the big-endian
two's-complement bytes); turning them into table values is the caller's business.

A schema is the parsed Avro JSON (``json.loads`` of ``SchemaInfo.schema``); named types defined
once may be referred to by name later, as Avro allows.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from offloadd.errors import OffloaddError

__all__ = ["AvroError", "decode", "encode", "named_types"]

_F32 = struct.Struct("<f")
_F64 = struct.Struct("<d")
_PRIMITIVES = frozenset(("null", "boolean", "int", "long", "float", "double", "bytes", "string"))


class AvroError(OffloaddError):
    """A datum that does not match its schema (encoding) or bytes that do not (decoding)."""


def named_types(schema: Any, names: dict[str, Any] | None = None,
                namespace: str = "") -> dict[str, Any]:
    """Every named type (record, enum, fixed) of ``schema`` by full and short name."""
    names = {} if names is None else names
    if isinstance(schema, list):
        for s in schema:
            named_types(s, names, namespace)
    elif isinstance(schema, dict):
        t = schema.get("type")
        if t in ("record", "error", "enum", "fixed"):
            name = schema["name"]
            ns = schema.get("namespace", namespace)
            full = name if "." in name or not ns else f"{ns}.{name}"
            names[full] = schema
            names.setdefault(name.rsplit(".", 1)[-1], schema)
            if t in ("record", "error"):
                for f in schema.get("fields", ()):
                    named_types(f["type"], names, full.rpartition(".")[0])
        elif t == "array":
            named_types(schema["items"], names, namespace)
        elif t == "map":
            named_types(schema["values"], names, namespace)
        elif isinstance(t, dict | list):
            named_types(t, names, namespace)
    return names


def _resolve(schema: Any, names: Mapping[str, Any]) -> Any:
    if isinstance(schema, str) and schema not in _PRIMITIVES:
        try:
            return names[schema]
        except KeyError:
            raise AvroError(f"unknown Avro type {schema!r}") from None
    if isinstance(schema, dict) and isinstance(schema.get("type"), str | list | dict) \
            and schema["type"] not in ("record", "error", "enum", "fixed", "array", "map") \
            and "logicalType" not in schema:
        return _resolve(schema["type"], names)
    return schema


# ---- encoding ------------------------------------------------------------------------------

def _zigzag(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def encode(schema: Any, datum: Any, names: Mapping[str, Any] | None = None) -> bytes:
    """``datum`` as Avro binary under ``schema``."""
    out = bytearray()
    _enc(schema, datum, named_types(schema) if names is None else names, out)
    return bytes(out)


def _enc(schema: Any, v: Any, names: Mapping[str, Any], out: bytearray) -> None:
    s = _resolve(schema, names)
    if isinstance(s, list):
        for i, branch in enumerate(s):
            if _matches(_resolve(branch, names), v, names):
                out += _zigzag(i)
                _enc(branch, v, names, out)
                return
        raise AvroError(f"no branch of union {s!r} takes {v!r}")
    t = s if isinstance(s, str) else s["type"]
    if isinstance(t, dict | list):
        _enc(t, v, names, out)
        return
    primitive = _ENC_PRIMITIVE.get(t)
    if primitive is not None:
        primitive(v, out)
        return
    composite = _ENC_COMPOSITE.get(t)
    if composite is None:
        raise AvroError(f"unsupported Avro type {t!r}")
    composite(s, v, names, out)


def _enc_null(v: Any, out: bytearray) -> None:
    if v is not None:
        raise AvroError(f"null expected, got {v!r}")


def _enc_bytes(v: Any, out: bytearray) -> None:
    raw = v.encode() if isinstance(v, str) else bytes(v)
    out += _zigzag(len(raw)) + raw


def _enc_array(s: Any, v: Any, names: Mapping[str, Any], out: bytearray) -> None:
    if v:
        out += _zigzag(len(v))
        for item in v:
            _enc(s["items"], item, names, out)
    out.append(0)


def _enc_map(s: Any, v: Any, names: Mapping[str, Any], out: bytearray) -> None:
    if v:
        out += _zigzag(len(v))
        for k, item in v.items():
            raw = k.encode()
            out += _zigzag(len(raw)) + raw
            _enc(s["values"], item, names, out)
    out.append(0)


def _enc_record(s: Any, v: Any, names: Mapping[str, Any], out: bytearray) -> None:
    for f in s["fields"]:
        _enc(f["type"], v.get(f["name"], f.get("default")), names, out)


def _enc_enum(s: Any, v: Any, names: Mapping[str, Any], out: bytearray) -> None:
    out += _zigzag(s["symbols"].index(v))


_ENC_PRIMITIVE: dict[str, Callable[[Any, bytearray], None]] = {
    "null": _enc_null,
    "boolean": lambda v, out: out.append(1 if v else 0),
    "int": lambda v, out: out.extend(_zigzag(int(v))),
    "long": lambda v, out: out.extend(_zigzag(int(v))),
    "float": lambda v, out: out.extend(_F32.pack(v)),
    "double": lambda v, out: out.extend(_F64.pack(v)),
    "bytes": _enc_bytes,
    "string": _enc_bytes,
    "fixed": lambda v, out: out.extend(bytes(v)),
}
_ENC_COMPOSITE: dict[str, Callable[[Any, Any, Mapping[str, Any], bytearray], None]] = {
    "enum": _enc_enum,
    "array": _enc_array,
    "map": _enc_map,
    "record": _enc_record,
    "error": _enc_record,
}


def _matches(s: Any, v: Any, names: Mapping[str, Any]) -> bool:
    t = s if isinstance(s, str) else s.get("type")
    if isinstance(t, dict):
        return _matches(_resolve(t, names), v, names)
    return {
        "null": v is None,
        "boolean": isinstance(v, bool),
        "int": isinstance(v, int) and not isinstance(v, bool),
        "long": isinstance(v, int) and not isinstance(v, bool),
        "float": isinstance(v, float),
        "double": isinstance(v, float | int) and not isinstance(v, bool),
        "bytes": isinstance(v, bytes | bytearray),
        "fixed": isinstance(v, bytes | bytearray),
        "string": isinstance(v, str),
        "enum": isinstance(v, str),
        "array": isinstance(v, list | tuple),
        "map": isinstance(v, dict),
        "record": isinstance(v, dict),
        "error": isinstance(v, dict),
    }.get(t, False) if isinstance(t, str) else False


# ---- decoding ------------------------------------------------------------------------------

class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise AvroError(f"truncated: {n} bytes wanted at byte {self.pos} of {len(self.buf)}")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def long(self) -> int:
        z = shift = 0
        while True:
            if self.pos >= len(self.buf):
                raise AvroError(f"truncated varint at byte {self.pos}")
            b = self.buf[self.pos]
            self.pos += 1
            z |= (b & 0x7F) << shift
            if not b & 0x80:
                break
            shift += 7
            if shift > 63:
                raise AvroError(f"varint longer than 10 bytes at byte {self.pos}")
        return (z >> 1) ^ -(z & 1)


def decode(schema: Any, data: bytes, names: Mapping[str, Any] | None = None) -> Any:
    """The datum ``data`` holds under ``schema``; :class:`AvroError` when it does not hold
    exactly one (truncated, a bad union branch, trailing bytes)."""
    r = _Reader(bytes(data))
    v = _dec(schema, r, named_types(schema) if names is None else names)
    if r.pos != len(r.buf):
        raise AvroError(f"{len(r.buf) - r.pos} bytes left after the datum")
    return v


def _dec(schema: Any, r: _Reader, names: Mapping[str, Any]) -> Any:
    s = _resolve(schema, names)
    if isinstance(s, list):
        i = r.long()
        if not 0 <= i < len(s):
            raise AvroError(f"union branch {i} of {len(s)} at byte {r.pos}")
        return _dec(s[i], r, names)
    t = s if isinstance(s, str) else s["type"]
    if isinstance(t, dict | list):
        return _dec(t, r, names)
    primitive = _DEC_PRIMITIVE.get(t)
    if primitive is not None:
        return primitive(r)
    composite = _DEC_COMPOSITE.get(t)
    if composite is None:
        raise AvroError(f"unsupported Avro type {t!r}")
    return composite(s, r, names)


def _dec_boolean(r: _Reader) -> bool:
    b = r.take(1)[0]
    if b > 1:
        raise AvroError(f"boolean byte {b} at byte {r.pos - 1}")
    return b == 1


def _dec_string(r: _Reader) -> str:
    raw = r.take(r.long())
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise AvroError(f"string is not UTF-8: {exc}") from None


def _dec_enum(s: Any, r: _Reader, names: Mapping[str, Any]) -> Any:
    i = r.long()
    if not 0 <= i < len(s["symbols"]):
        raise AvroError(f"enum index {i} of {len(s['symbols'])}")
    return s["symbols"][i]


def _blocks(r: _Reader) -> Iterator[int]:
    """The item counts of an array's or map's blocks, up to the empty one that ends it."""
    while n := r.long():
        if n < 0:  # a block with its byte size
            n = -n
            r.long()
        yield n


def _dec_array(s: Any, r: _Reader, names: Mapping[str, Any]) -> Any:
    items: list[Any] = []
    for n in _blocks(r):
        items.extend(_dec(s["items"], r, names) for _ in range(n))
    return items


def _dec_map(s: Any, r: _Reader, names: Mapping[str, Any]) -> Any:
    m: dict[str, Any] = {}
    for n in _blocks(r):
        for _ in range(n):
            k = _dec_string(r)
            m[k] = _dec(s["values"], r, names)
    return m


def _dec_record(s: Any, r: _Reader, names: Mapping[str, Any]) -> Any:
    return {f["name"]: _dec(f["type"], r, names) for f in s["fields"]}


_DEC_PRIMITIVE: dict[str, Callable[[_Reader], Any]] = {
    "null": lambda r: None,
    "boolean": _dec_boolean,
    "int": _Reader.long,
    "long": _Reader.long,
    "float": lambda r: _F32.unpack(r.take(4))[0],
    "double": lambda r: _F64.unpack(r.take(8))[0],
    "bytes": lambda r: r.take(r.long()),
    "string": _dec_string,
}
_DEC_COMPOSITE: dict[str, Callable[[Any, _Reader, Mapping[str, Any]], Any]] = {
    "fixed": lambda s, r, names: r.take(int(s["size"])),
    "enum": _dec_enum,
    "array": _dec_array,
    "map": _dec_map,
    "record": _dec_record,
    "error": _dec_record,
}
