"""The table side of typed columns: a topic's schema versions from the registry, the table's
``value`` (and ``kv_key``) columns evolved to follow them (blocking pyiceberg calls: run in a
worker thread). The mapping and the decoding are pure, in :mod:`offloadd.lakehouse.schemas`."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from pyiceberg.table import Table
from pyiceberg.types import IcebergType, ListType, MapType, StructType

from offloadd.errors import FormatError
from offloadd.format.avro import named_types
from offloadd.format.schema_storage import KeyValueSchema, SchemaType
from offloadd.lakehouse.protobuf import NativeSchema, ProtobufSchemaError
from offloadd.lakehouse.schemas import (
    KEY_COLUMN,
    VALUE_COLUMN,
    SchemaVersionInfo,
    Side,
    TypedDecoder,
    incompatibility,
    value_schema,
)
from offloadd.metadata.schemas import SchemaVersion

__all__ = ["evolve", "version_info"]

log = logging.getLogger(__name__)
_TYPED = (SchemaType.AVRO, SchemaType.JSON, SchemaType.PROTOBUFNATIVE)


def version_info(sv: SchemaVersion) -> SchemaVersionInfo:
    """What of a version can be typed: an AVRO, JSON or PROTOBUF_NATIVE record, or such sides
    of a KEY_VALUE pair (PROTOBUF, primitives: nothing, the payload stays raw)."""
    info = SchemaVersionInfo(sv.version, sv.info.type)
    if sv.info.deleted:
        return info
    if sv.info.type in _TYPED:
        info.value = _side(sv.info.type, sv.info.schema, sv, "")
    elif sv.info.type == SchemaType.KEYVALUE:
        kv = KeyValueSchema.of(sv.info)
        info.kv_encoding = kv.encoding
        if kv.value_type in _TYPED:
            info.value = _side(kv.value_type, kv.value_schema, sv, "value ")
        if kv.key_type in _TYPED:
            info.key = _side(kv.key_type, kv.key_schema, sv, "key ")
    return info


def _side(kind: int, definition: bytes, sv: SchemaVersion, what: str) -> Side:
    if kind == SchemaType.PROTOBUFNATIVE:
        try:
            native = NativeSchema.load(definition)
        except ProtobufSchemaError as exc:
            raise FormatError(f"schema {sv.info.schema_id}", 0,
                              f"version {sv.version}: the {what}schema: {exc}") from None
        return Side(kind, native.avro, named_types(native.avro), native)
    avro = _json(definition, sv, what)
    return Side(kind, avro, named_types(avro))


def _json(raw: bytes, sv: SchemaVersion, what: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise FormatError(f"schema {sv.info.schema_id}", 0, f"version {sv.version}: the "
                          f"{what}schema is not JSON: {exc}") from None


def evolve(table: Table, topic: str, versions: Sequence[SchemaVersion]) -> TypedDecoder | None:
    """Add to ``table`` the columns its topic's schema versions bring (one schema update per
    column a version adds to); the decoder for the topic's messages, None without a typed
    version. An incompatible version changes nothing and is marked refused."""
    infos = []
    last_ok: int | None = None
    for sv in versions:
        try:
            info = version_info(sv)
        except FormatError as exc:  # a definition that does not parse: nothing to type with
            info = SchemaVersionInfo(sv.version, sv.info.type, refused=(
                f"{topic}: schema version {sv.version} is unusable: {exc}; the payload is "
                "kept, not decoded"))
            log.error("lakehouse: %s", info.refused)
        infos.append(info)
        if info.refused is not None:
            continue
        sides = [(c, s) for c, s in ((VALUE_COLUMN, info.value), (KEY_COLUMN, info.key))
                 if s is not None]
        why = None
        for column, side in sides:  # every side checked before any column changes
            current = _column(table, column)
            new = value_schema(side.avro, column).find_field(column).field_type
            why = None if current is None else incompatibility(current, new, None, side.avro)
            if why is not None:
                why = f"{column}: {why}" if column != VALUE_COLUMN else why
                break
        if why is not None:
            info.refused = (f"{topic}: schema version {sv.version} is incompatible with "
                            f"version {last_ok}: {why}; the payload is kept, not decoded")
            log.error("lakehouse: %s", info.refused)
            continue
        if sides:
            last_ok = sv.version
        for column, side in sides:
            current = _column(table, column)
            new = value_schema(side.avro, column).find_field(column).field_type
            if current is None or not _covers(current, new):
                with table.update_schema() as update:
                    update.union_by_name(value_schema(side.avro, column))
                log.info("lakehouse: %s: schema version %d: %s columns added", topic,
                         sv.version, column)
    if not any(i.typed for i in infos):
        return None
    return TypedDecoder(topic, infos)


def _column(table: Table, name: str) -> IcebergType | None:
    for f in table.schema().fields:
        if f.name == name:
            return f.field_type
    return None


def _covers(old: IcebergType, new: IcebergType) -> bool:
    """Every field of ``new`` is in ``old`` with the same type (nothing to add)."""
    if isinstance(old, StructType) and isinstance(new, StructType):
        have = {f.name: f.field_type for f in old.fields}
        return all(f.name in have and _covers(have[f.name], f.field_type) for f in new.fields)
    if isinstance(old, ListType) and isinstance(new, ListType):
        return _covers(old.element_type, new.element_type)
    if isinstance(old, MapType) and isinstance(new, MapType):
        return _covers(old.value_type, new.value_type)
    return old == new
