"""The table side of typed columns: a topic's schema versions from the registry, the table's
``value`` column evolved to follow them (blocking pyiceberg calls: run in a worker thread).
The mapping and the decoding are pure, in :mod:`offloadd.lakehouse.schemas`."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from pyiceberg.table import Table
from pyiceberg.types import IcebergType, ListType, MapType, StructType

from offloadd.format.avro import named_types
from offloadd.format.schema_storage import SchemaType
from offloadd.lakehouse.schemas import (
    VALUE_COLUMN,
    SchemaVersionInfo,
    TypedDecoder,
    incompatibility,
    value_schema,
)
from offloadd.metadata.schemas import SchemaVersion

__all__ = ["evolve"]

log = logging.getLogger(__name__)
_TYPED = (SchemaType.AVRO, SchemaType.JSON)


def evolve(table: Table, topic: str, versions: Sequence[SchemaVersion]) -> TypedDecoder | None:
    """Add to ``table`` the columns its topic's schema versions bring (one schema update per
    version that adds any); the decoder for the topic's messages, None without a typed
    version. An incompatible version changes nothing and is marked refused."""
    infos = []
    last_ok: int | None = None
    for sv in versions:
        if sv.info.type not in _TYPED or sv.info.deleted:
            infos.append(SchemaVersionInfo(sv.version, sv.info.type, None))
            continue
        avro = sv.avro()
        info = SchemaVersionInfo(sv.version, sv.info.type, avro, named_types(avro))
        infos.append(info)
        new = value_schema(avro).find_field(VALUE_COLUMN).field_type
        current = _column(table)
        why = None if current is None else incompatibility(current, new, None, avro)
        if why is not None:
            info.refused = (f"{topic}: schema version {sv.version} is incompatible with "
                            f"version {last_ok}: {why}; the payload is kept, not decoded")
            log.error("lakehouse: %s", info.refused)
            continue
        last_ok = sv.version
        if current is None or not _covers(current, new):
            with table.update_schema() as update:
                update.union_by_name(value_schema(avro))
            log.info("lakehouse: %s: schema version %d: columns added", topic, sv.version)
    if not any(i.avro is not None for i in infos):
        return None
    return TypedDecoder(topic, infos)


def _column(table: Table) -> IcebergType | None:
    for f in table.schema().fields:
        if f.name == VALUE_COLUMN:
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
