"""The table every topic is projected into: one row per message.

==================  ===========  ======================================================
column              type         from
==================  ===========  ======================================================
topic               string       the topic's full name
ledger_id           long         the entry's position ...
entry_id            long         ... in the managed ledger
batch_index         int          index in the entry's batch; -1: the entry is not a batch
publish_time        timestamptz  MessageMetadata.publish_time (partition: its day)
event_time          timestamptz  the message's event time, else the entry's; null if unset
key                 string       partition key
ordering_key        binary
properties          map          string → string
producer_name       string
sequence_id         long         the message's, else the entry's plus batch index
payload             binary       null for a null value (tombstone)
broker_timestamp    timestamptz  broker entry metadata, when the broker wrote it
broker_index        long         idem (the offset of the entry's last message)
schema_version      binary
encrypted           boolean      payload is the ciphertext of the whole entry (not decoded)
chunk_uuid          string       set on each chunk of a chunked message ...
chunk_id            int          ... (payload is the chunk as stored, still compressed by
num_chunks          int              ``payload_compression``)
payload_compression string       codec of a payload kept as stored (chunks, encrypted)
decode_error        string       set when the entry does not decode: payload is then the
                                 whole raw entry, batch_index -1
txn_id              string       the transaction of a transactional message, ``(most,least)``
hidden              string       null; with ``keep_hidden``, why a read-committed consumer
                                 would not see the row (a marker, ``aborted``, ``timed-out``)
==================  ===========  ======================================================

Row identity is ``(ledger_id, entry_id, batch_index)``; the log order is its order. Topics with
JSON fields configured (``[lakehouse] json_fields``) get one more column per field, named after
it, null when a payload is not a JSON object or the value has another type.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import DayTransform
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DoubleType,
    IcebergType,
    IntegerType,
    LongType,
    MapType,
    NestedField,
    StringType,
    TimestamptzType,
)

from offloadd.errors import ConfigError

__all__ = ["BASE_COLUMNS", "JSON_TYPES", "json_type", "partition_spec", "table_schema"]

JSON_FIRST_ID = 1000
JSON_TYPES: Mapping[str, IcebergType] = {
    "string": StringType(), "long": LongType(), "double": DoubleType(), "boolean": BooleanType(),
}

_FIELDS: tuple[NestedField, ...] = (
    NestedField(1, "topic", StringType(), required=True),
    NestedField(2, "ledger_id", LongType(), required=True),
    NestedField(3, "entry_id", LongType(), required=True),
    NestedField(4, "batch_index", IntegerType(), required=True),
    NestedField(5, "publish_time", TimestamptzType(), required=False),
    NestedField(6, "event_time", TimestamptzType(), required=False),
    NestedField(7, "key", StringType(), required=False),
    NestedField(8, "ordering_key", BinaryType(), required=False),
    NestedField(9, "properties", MapType(20, StringType(), 21, StringType(),
                                         value_required=True), required=False),
    NestedField(10, "producer_name", StringType(), required=False),
    NestedField(11, "sequence_id", LongType(), required=False),
    NestedField(12, "payload", BinaryType(), required=False),
    NestedField(13, "broker_timestamp", TimestamptzType(), required=False),
    NestedField(14, "broker_index", LongType(), required=False),
    NestedField(15, "schema_version", BinaryType(), required=False),
    NestedField(16, "encrypted", BooleanType(), required=True),
    NestedField(17, "chunk_uuid", StringType(), required=False),
    NestedField(18, "chunk_id", IntegerType(), required=False),
    NestedField(19, "num_chunks", IntegerType(), required=False),
    NestedField(22, "payload_compression", StringType(), required=False),
    NestedField(23, "decode_error", StringType(), required=False),
    NestedField(24, "txn_id", StringType(), required=False),
    NestedField(25, "hidden", StringType(), required=False),
)
BASE_COLUMNS = tuple(f.name for f in _FIELDS)


def json_type(name: str) -> IcebergType:
    try:
        return JSON_TYPES[name]
    except KeyError:
        raise ConfigError(f"JSON field type {name!r}: use one of "
                          f"{', '.join(JSON_TYPES)}") from None


def table_schema(json_fields: Mapping[str, str] | None = None) -> Schema:
    """The schema of a new table; JSON fields follow the base columns."""
    fields = list(_FIELDS)
    for i, (name, kind) in enumerate(sorted((json_fields or {}).items())):
        if name in BASE_COLUMNS:
            raise ConfigError(f"[lakehouse] json_fields: {name!r} is a column of every table; "
                              "rename the field in the configuration")
        fields.append(NestedField(JSON_FIRST_ID + i, name, json_type(kind), required=False))
    return Schema(*fields)


def partition_spec() -> PartitionSpec:
    """``day(publish_time)``."""
    return PartitionSpec(PartitionField(source_id=5, field_id=1000, transform=DayTransform(),
                                        name="publish_day"))
