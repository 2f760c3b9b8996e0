"""Pulsar's schema-registry records, byte for byte (pure: no I/O).

Pulsar's ``BookkeeperSchemaStorage`` keeps, per schema id (``<tenant>/<namespace>/<topic>``,
no domain, no partition suffix):

- the znode ``/schemas/<schema id>`` in the local metadata store: a ``SchemaLocator``
  (``SchemaStorageFormat.proto``): the latest version's ``IndexEntry`` and every version's;
- per version, a ledger of one entry: a ``SchemaEntry`` whose ``schema_data`` is a
  ``SchemaRegistryFormat.SchemaInfo`` (type, definition, timestamp, properties).

The messages are proto2; they are small and fixed, so they are encoded here by hand rather than
with generated classes. ``schema_version`` in a message's metadata is the version as an 8-byte
big-endian long.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field

from offloadd.errors import FormatError
from offloadd.format.varint import decode_varint, encode_varint

__all__ = ["IndexEntry", "KeyValueSchema", "SchemaEntry", "SchemaInfo", "SchemaLocator",
           "SchemaType", "schema_id", "split_key_value", "version_bytes", "version_from_bytes"]

_I64 = struct.Struct(">q")


def _err(problem: str) -> FormatError:
    return FormatError("schema registry record", 0, problem)


class SchemaType:
    """``SchemaRegistryFormat.SchemaInfo.SchemaType`` (the client's ``SchemaType`` + 1)."""

    NONE = 1
    STRING = 2
    JSON = 3
    PROTOBUF = 4
    AVRO = 5
    KEYVALUE = 16
    PROTOBUFNATIVE = 21

    @staticmethod
    def name(value: int) -> str:
        for k, v in vars(SchemaType).items():
            if v == value and k.isupper():
                return k
        return f"TYPE_{value}"


def version_bytes(version: int) -> bytes:
    """``LongSchemaVersion.bytes()``."""
    return _I64.pack(version)


def version_from_bytes(raw: bytes) -> int:
    """A message's ``schema_version`` as the registry's version (first 8 bytes, as the broker's
    ``versionFromBytes`` reads it)."""
    if len(raw) < 8:
        raise _err(f"schema_version of {len(raw)} bytes: 8 expected")
    return int(_I64.unpack_from(raw)[0])


def schema_id(tenant: str, namespace: str, local_name: str) -> str:
    """``TopicName.getSchemaName()``: the partitioned parent's name, without domain."""
    base, sep, n = local_name.rpartition("-partition-")
    if sep and n.isdigit():
        local_name = base
    return f"{tenant}/{namespace}/{local_name}"


# ---- proto2 by hand ------------------------------------------------------------------------

def _ld(no: int, raw: bytes) -> bytes:
    return encode_varint(no << 3 | 2) + encode_varint(len(raw)) + raw


def _vi(no: int, v: int) -> bytes:
    return encode_varint(no << 3) + encode_varint(v & 0xFFFFFFFFFFFFFFFF)


def _fields(buf: bytes, what: str) -> list[tuple[int, int | bytes]]:
    out: list[tuple[int, int | bytes]] = []
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = decode_varint(buf, pos, end, what)
        no, wire = key >> 3, key & 7
        if wire == 0:
            v, pos = decode_varint(buf, pos, end, what)
            out.append((no, v - (1 << 64) if v >= 1 << 63 else v))
        elif wire == 2:
            n, pos = decode_varint(buf, pos, end, what)
            if pos + n > end:
                raise _err(f"{what}: field {no} runs past the end")
            out.append((no, bytes(buf[pos:pos + n])))
            pos += n
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise _err(f"{what}: wire type {wire} of field {no}")
    if pos != end:
        raise _err(f"{what}: truncated")
    return out


def _int(v: int | bytes, what: str) -> int:
    if not isinstance(v, int):
        raise _err(f"{what}: varint expected")
    return v


def _bytes(v: int | bytes, what: str) -> bytes:
    if not isinstance(v, bytes):
        raise _err(f"{what}: bytes expected")
    return v


@dataclass(frozen=True)
class IndexEntry:
    version: int
    ledger_id: int
    entry_id: int
    hash: bytes

    def encode(self) -> bytes:
        pos = _vi(1, self.ledger_id) + _vi(2, self.entry_id)
        return _vi(1, self.version) + _ld(2, pos) + _ld(3, self.hash)

    @classmethod
    def decode(cls, buf: bytes) -> IndexEntry:
        version = ledger = entry = None
        digest = b""
        for no, v in _fields(buf, "IndexEntry"):
            if no == 1:
                version = _int(v, "IndexEntry.version")
            elif no == 2:
                for pno, pv in _fields(_bytes(v, "IndexEntry.position"), "PositionInfo"):
                    if pno == 1:
                        ledger = _int(pv, "PositionInfo.ledgerId")
                    elif pno == 2:
                        entry = _int(pv, "PositionInfo.entryId")
            elif no == 3:
                digest = _bytes(v, "IndexEntry.hash")
        if version is None or ledger is None or entry is None:
            raise _err("IndexEntry: a required field is missing")
        return cls(version, ledger, entry, digest)


@dataclass(frozen=True)
class SchemaLocator:
    """The znode ``/schemas/<schema id>``."""

    info: IndexEntry  # the latest version
    index: tuple[IndexEntry, ...]

    def encode(self) -> bytes:
        return _ld(1, self.info.encode()) + b"".join(_ld(2, e.encode()) for e in self.index)

    @classmethod
    def decode(cls, buf: bytes) -> SchemaLocator:
        info = None
        index = []
        for no, v in _fields(buf, "SchemaLocator"):
            if no == 1:
                info = IndexEntry.decode(_bytes(v, "SchemaLocator.info"))
            elif no == 2:
                index.append(IndexEntry.decode(_bytes(v, "SchemaLocator.index")))
        if info is None:
            raise _err("SchemaLocator: no info")
        return cls(info, tuple(index))

    def find(self, version: int) -> IndexEntry | None:
        return next((e for e in self.index if e.version == version), None)


@dataclass(frozen=True)
class SchemaInfo:
    """``SchemaRegistryFormat.SchemaInfo``: what one version is."""

    schema_id: str
    type: int  # SchemaType
    schema: bytes  # the definition: Avro schema JSON for AVRO and JSON
    timestamp: int = 0  # ms
    user: str = ""
    deleted: bool = False
    props: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    def hash(self) -> bytes:
        """The locator's ``hash``: SHA-256 of the definition."""
        return hashlib.sha256(self.schema).digest()

    def encode(self) -> bytes:
        return b"".join((
            _ld(1, self.schema_id.encode()), _ld(2, self.user.encode()), _vi(3, self.type),
            _ld(4, self.schema), _vi(5, self.timestamp), _vi(6, int(self.deleted)),
            *(_ld(7, _ld(1, k.encode()) + _ld(2, v.encode())) for k, v in self.props)))

    @classmethod
    def decode(cls, buf: bytes) -> SchemaInfo:
        sid, user, typ, schema, ts, deleted = "", "", SchemaType.NONE, b"", 0, False
        props = []
        for no, v in _fields(buf, "SchemaInfo"):
            if no == 1:
                sid = _bytes(v, "SchemaInfo.schema_id").decode()
            elif no == 2:
                user = _bytes(v, "SchemaInfo.user").decode()
            elif no == 3:
                typ = _int(v, "SchemaInfo.type")
            elif no == 4:
                schema = _bytes(v, "SchemaInfo.schema")
            elif no == 5:
                ts = _int(v, "SchemaInfo.timestamp")
            elif no == 6:
                deleted = bool(_int(v, "SchemaInfo.deleted"))
            elif no == 7:
                kv = dict(_fields(_bytes(v, "SchemaInfo.props"), "KeyValuePair"))
                props.append((_bytes(kv.get(1, b""), "key").decode(),
                              _bytes(kv.get(2, b""), "value").decode()))
        return cls(sid, typ, schema, ts, user, deleted, tuple(props))


@dataclass(frozen=True)
class SchemaEntry:
    """The one entry of a schema ledger."""

    schema_data: bytes  # a serialized SchemaInfo
    index: tuple[IndexEntry, ...] = ()

    def encode(self) -> bytes:
        return _ld(2, self.schema_data) + b"".join(_ld(5, e.encode()) for e in self.index)

    @classmethod
    def decode(cls, buf: bytes) -> SchemaEntry:
        data = None
        index = []
        for no, v in _fields(buf, "SchemaEntry"):
            if no == 2:
                data = _bytes(v, "SchemaEntry.schema_data")
            elif no == 5:
                index.append(IndexEntry.decode(_bytes(v, "SchemaEntry.index")))
        if data is None:
            raise _err("SchemaEntry: no schema_data")
        return cls(data, tuple(index))


# ---- KEY_VALUE -----------------------------------------------------------------------------

_I32 = struct.Struct(">i")
# the client's SchemaType names a KEY_VALUE schema's properties use, as registry types
_CLIENT_TYPES = {"AVRO": SchemaType.AVRO, "JSON": SchemaType.JSON, "STRING": SchemaType.STRING,
                 "PROTOBUF": SchemaType.PROTOBUF, "PROTOBUF_NATIVE": SchemaType.PROTOBUFNATIVE}


def _split_lengths(buf: bytes, what: str) -> tuple[bytes | None, bytes | None]:
    """``[int32 len][bytes][int32 len][bytes]`` (big-endian; -1 is null), Pulsar's
    ``KeyValue`` framing of both a KEY_VALUE definition and an INLINE payload."""
    out: list[bytes | None] = []
    pos = 0
    for _ in range(2):
        if pos + 4 > len(buf):
            raise _err(f"{what}: truncated at byte {pos}")
        (n,) = _I32.unpack_from(buf, pos)
        pos += 4
        if n < 0:
            out.append(None)
            continue
        if pos + n > len(buf):
            raise _err(f"{what}: a part of {n} bytes runs past the end ({len(buf)} bytes)")
        out.append(bytes(buf[pos:pos + n]))
        pos += n
    if pos != len(buf):
        raise _err(f"{what}: {len(buf) - pos} bytes after the value")
    return out[0], out[1]


def split_key_value(payload: bytes) -> tuple[bytes | None, bytes | None]:
    """An INLINE KEY_VALUE message's (key bytes, value bytes)."""
    return _split_lengths(payload, "KEY_VALUE payload")


@dataclass(frozen=True)
class KeyValueSchema:
    """A KEY_VALUE version's two sides (``KeyValueSchemaInfo``): registry type and definition
    of each, and where the key travels: ``INLINE`` in the payload, ``SEPARATED`` in the
    message's partition key (base64)."""

    key_type: int
    key_schema: bytes
    value_type: int
    value_schema: bytes
    encoding: str

    @classmethod
    def of(cls, info: SchemaInfo) -> KeyValueSchema:
        key, value = _split_lengths(info.schema, "KEY_VALUE schema definition")
        props = dict(info.props)

        def side(name: str) -> int:
            t = props.get(f"{name}.schema.type", "")
            return _CLIENT_TYPES.get(t.upper(), SchemaType.NONE) if t else SchemaType.NONE

        encoding = props.get("kv.encoding.type", "INLINE").upper()
        return cls(side("key"), key or b"", side("value"), value or b"", encoding)
