"""PROTOBUF_NATIVE schemas as typed columns (pure: no I/O).

A PROTOBUF_NATIVE version's definition is JSON: ``fileDescriptorSet`` (base64 of a
``FileDescriptorSet`` holding the root message's file and its imports), ``rootMessageTypeName``
and ``rootFileDescriptorName``; messages are that message's protobuf binary. The descriptor is
loaded into a private ``DescriptorPool`` and rendered as an equivalent Avro record schema, so
the column mapping, the evolution rules and the conversion of values are the AVRO ones
(:mod:`offloadd.lakehouse.schemas`):

==========================================  ==========================================
protobuf                                    Avro (then Iceberg)
==========================================  ==========================================
int32, sint32, sfixed32                     int
int64, sint64, sfixed64, uint32, uint64,    long (uint64 above 2^63 - 1: wraps, as in
fixed32, fixed64                            Java's ``long``)
float, double, bool, string, bytes          the same
enum                                        string (the value's name; its number when unknown)
message                                     record (nested); null when not set
repeated                                    array
map<K, V>                                   map (keys as strings)
google.protobuf.Timestamp                   timestamp-micros
a message recursive through itself          string (its JSON, ``MessageToJson``)
==========================================  ==========================================

Every field is optional (``["null", T]``), as proto3 has no required fields; a scalar the
sender left at its default reads as that default (proto3 does not say it was unset).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

__all__ = ["NativeSchema", "ProtobufSchemaError"]

_TIMESTAMP = "google.protobuf.Timestamp"
# descriptors are Any below: the stubs type them as unions of the Python and upb classes
_INT = {FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SFIXED32}
_LONG = {FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SFIXED64,
         FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED32,
         FieldDescriptor.TYPE_FIXED64}
_SIMPLE = {FieldDescriptor.TYPE_FLOAT: "float", FieldDescriptor.TYPE_DOUBLE: "double",
           FieldDescriptor.TYPE_BOOL: "boolean", FieldDescriptor.TYPE_STRING: "string",
           FieldDescriptor.TYPE_BYTES: "bytes", FieldDescriptor.TYPE_ENUM: "string"}


class ProtobufSchemaError(ValueError):
    """A PROTOBUF_NATIVE definition that does not load."""


@dataclass
class NativeSchema:
    """A loaded PROTOBUF_NATIVE version: the Avro rendering and the message class."""

    avro: dict[str, Any]
    message_class: type[Message]
    descriptor: Descriptor

    @classmethod
    def load(cls, definition: bytes) -> NativeSchema:
        try:
            doc = json.loads(definition)
            fds = descriptor_pb2.FileDescriptorSet.FromString(
                base64.b64decode(doc["fileDescriptorSet"]))
            pool = descriptor_pool.DescriptorPool()
            _add_files(pool, list(fds.file))
            desc = pool.FindMessageTypeByName(doc["rootMessageTypeName"])
        except (ValueError, KeyError, TypeError, DecodeError) as exc:
            raise ProtobufSchemaError(f"PROTOBUF_NATIVE definition does not load: "
                                      f"{type(exc).__name__}: {exc}") from None
        return cls(_record(desc, set()), message_factory.GetMessageClass(desc), desc)

    def datum(self, payload: bytes) -> dict[str, Any]:
        """The message as the Avro datum of :attr:`avro` (raises ``DecodeError``)."""
        msg = self.message_class.FromString(payload)
        return _datum(msg, set())


def _add_files(pool: descriptor_pool.DescriptorPool,
               files: list[descriptor_pb2.FileDescriptorProto]) -> None:
    """Add files imports first (the set's order is not promised)."""
    done: set[str] = set()
    pending = {f.name: f for f in files}
    while pending:
        ready = [f for f in pending.values() if all(d in done for d in f.dependency)]
        if not ready:
            missing = sorted({d for f in pending.values() for d in f.dependency} - done
                             - set(pending))
            raise ValueError(f"imports missing from the FileDescriptorSet: {missing}")
        for f in ready:
            pool.Add(f)
            done.add(f.name)
            del pending[f.name]


def _record(desc: Any, seen: set[str]) -> dict[str, Any]:
    seen = seen | {desc.full_name}
    return {"type": "record", "name": desc.full_name.replace(".", "_"),
            "fields": [{"name": f.name, "type": ["null", _field_type(f, seen)],
                        "default": None} for f in desc.fields]}


def _field_type(f: Any, seen: set[str]) -> Any:
    if f.message_type is not None and f.message_type.GetOptions().map_entry:
        return {"type": "map", "values": _single(f.message_type.fields_by_name["value"], seen)}
    t = _single(f, seen)
    return {"type": "array", "items": t} if _repeated(f) else t


def _repeated(f: Any) -> bool:
    return bool(f.is_repeated)


def _single(f: Any, seen: set[str]) -> Any:
    if f.type in _INT:
        return "int"
    if f.type in _LONG:
        return "long"
    if f.type in _SIMPLE:
        return _SIMPLE[f.type]
    m = f.message_type
    if m.full_name == _TIMESTAMP:
        return {"type": "long", "logicalType": "timestamp-micros"}
    if m.full_name in seen:
        return "string"  # recursive: its JSON
    return _record(m, seen)


def _datum(msg: Message, seen: set[str]) -> dict[str, Any]:
    seen = seen | {msg.DESCRIPTOR.full_name}
    out: dict[str, Any] = {}
    for f in msg.DESCRIPTOR.fields:
        v = getattr(msg, f.name)
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            vf = f.message_type.fields_by_name["value"]
            out[f.name] = {str(k): _value(vf, x, seen) for k, x in v.items()}
        elif _repeated(f):
            out[f.name] = [_value(f, x, seen) for x in v]
        elif f.message_type is not None and not msg.HasField(f.name):
            out[f.name] = None
        else:
            out[f.name] = _value(f, v, seen)
    return out


def _value(f: Any, v: Any, seen: set[str]) -> Any:
    if f.type == FieldDescriptor.TYPE_ENUM:
        known = f.enum_type.values_by_number.get(v)
        return known.name if known is not None else str(v)
    if f.type == FieldDescriptor.TYPE_UINT64 or f.type == FieldDescriptor.TYPE_FIXED64:
        return v - (1 << 64) if v >= 1 << 63 else v
    if f.message_type is None:
        return v
    if f.message_type.full_name == _TIMESTAMP:
        return int(v.seconds) * 1_000_000 + int(v.nanos) // 1000
    if f.message_type.full_name in seen:
        return json_format.MessageToJson(v, indent=None)
    return _datum(v, seen)
