"""Typed columns against a real table (SQLite catalog, filesystem warehouse): the ``value``
struct from a schema's versions, schema evolution through pyiceberg, and the messages that do
not decode (a malformed payload, a version the table refuses) kept as flagged rows."""

from __future__ import annotations

import base64
import datetime as dt
import json
import struct
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pool, message_factory
from pyiceberg.types import DecimalType, StringType, StructType, TimestamptzType

from offloadd._proto import pulsar_api_pb2 as pb
from offloadd.format.avro import encode as avro_encode
from offloadd.format.message import encode_entry
from offloadd.format.schema_storage import SchemaInfo, SchemaType, version_bytes
from offloadd.lakehouse.rows import RowBuilder
from offloadd.lakehouse.tables import open_catalog, open_table
from offloadd.lakehouse.typed import evolve
from offloadd.metadata.schemas import SchemaVersion
from offloadd.model import Position, TopicName
from offloadd.shell.produce_schema import ORDER_SCHEMA, order, schema_info
from tests.lakehouse.protos import order_file_set
from tests.lakehouse.support import settings_of, write_config

TOPIC = TopicName.parse("persistent://public/default/orders")
NOW = 1_700_000_000_000
V1 = {**ORDER_SCHEMA, "fields": [*ORDER_SCHEMA["fields"],
                                  {"name": "coupon", "type": ["null", "string"], "default": None},
                                  {"name": "price", "default": None, "type": ["null", {
                                      "type": "bytes", "logicalType": "decimal",
                                      "precision": 9, "scale": 2}]},
                                  {"name": "ref", "default": None, "type": ["null", {
                                      "type": "string", "logicalType": "uuid"}]}]}
# "amount" becomes a string: no column can hold both
V2 = {**ORDER_SCHEMA, "fields": [dict(f, type="string") if f["name"] == "amount" else f
                                  for f in ORDER_SCHEMA["fields"]]}


def entry(version: int, payload: bytes, seq: int) -> bytes:
    md = pb.MessageMetadata(producer_name="p", sequence_id=seq, publish_time=NOW,
                            schema_version=version_bytes(version))
    return encode_entry(md, payload)


def table_for(tmp_path: Path, kind: str, defs: list[dict[str, Any]]) -> tuple[Any, Any]:
    settings = settings_of(write_config(tmp_path))
    table = open_table(open_catalog(settings), TOPIC)
    versions = [SchemaVersion(i, schema_info(TOPIC, kind, d, NOW))  # type: ignore[arg-type]
                for i, d in enumerate(defs)]
    return table, evolve(table, str(TOPIC), versions)


def project(table: Any, decoder: Any, entries: list[bytes]) -> list[dict[str, Any]]:
    b = RowBuilder(str(TOPIC), table.schema(), None, decoder)
    for i, raw in enumerate(entries):
        b.add(Position(3, i), raw)
    table.append(b.table())
    rows = table.scan().to_arrow().sort_by([("entry_id", "ascending")])
    out: list[dict[str, Any]] = rows.select(["payload", "value", "decode_error"]).to_pylist()
    return out


@pytest.mark.timeout(60)
def test_evolution_adds_columns_and_refuses_an_incompatible_version(tmp_path: Path) -> None:
    table, decoder = table_for(tmp_path, "avro", [ORDER_SCHEMA, V1, V2])
    schema = table.schema()
    assert isinstance(schema.find_field("value").field_type, StructType)
    assert isinstance(schema.find_field("value.coupon").field_type, StringType)
    assert schema.find_field("value.price").field_type == DecimalType(9, 2)
    assert str(schema.find_field("value.amount").field_type) == "double"  # v2 changed nothing
    o = order(7, NOW)
    v1_datum = {**o, "coupon": "SAVE10", "price": (12345).to_bytes(4, "big", signed=True),
                "ref": "12345678-1234-5678-1234-567812345678"}
    v2_payload = avro_encode(V2, {**o, "amount": "lots"})
    rows = project(table, decoder, [
        entry(0, avro_encode(ORDER_SCHEMA, o), 0),
        entry(1, avro_encode(V1, v1_datum), 1),
        entry(2, v2_payload, 2),
        entry(0, b"\x02", 3),  # malformed: a long cut short
    ])
    assert rows[0]["decode_error"] is None
    assert rows[0]["value"]["address"] == o["address"] and rows[0]["value"]["coupon"] is None
    assert rows[0]["value"]["created"] == dt.datetime.fromtimestamp(o["created"] / 1000, dt.UTC)
    v = rows[1]["value"]
    assert (v["coupon"], str(v["price"]), v["ref"]) == (
        "SAVE10", "123.45", "12345678-1234-5678-1234-567812345678")
    assert rows[2]["value"] is None and rows[2]["payload"] == v2_payload
    err = rows[2]["decode_error"]
    assert "persistent://public/default/orders" in err and "schema version 2" in err
    assert "version 1" in err and "'amount'" in err
    assert rows[3]["value"] is None and rows[3]["payload"] == b"\x02"
    assert "does not decode as AVRO schema version 0" in rows[3]["decode_error"]


@pytest.mark.timeout(60)
def test_json_messages_are_checked_against_the_schema(tmp_path: Path) -> None:
    table, decoder = table_for(tmp_path, "json", [ORDER_SCHEMA])
    o = order(3, NOW)
    bad = json.dumps({**o, "id": "three"}).encode()
    rows = project(table, decoder, [entry(0, json.dumps(o).encode(), 0), entry(0, bad, 1),
                                    entry(0, b"{not json", 2)])
    assert rows[0]["decode_error"] is None and rows[0]["value"]["id"] == 3
    assert rows[0]["value"]["amount"] == o["amount"]
    assert rows[1]["value"] is None and "JSON schema version 0" in rows[1]["decode_error"]
    assert rows[1]["payload"] == bad
    assert rows[2]["decode_error"] is not None


@pytest.mark.timeout(60)
def test_a_required_field_added_without_default_is_refused(tmp_path: Path) -> None:
    v1 = {**ORDER_SCHEMA, "fields": [*ORDER_SCHEMA["fields"], {"name": "must", "type": "long"}]}
    table, decoder = table_for(tmp_path, "avro", [ORDER_SCHEMA, v1])
    assert "must" not in {f.name for f in table.schema().find_field("value").field_type.fields}
    rows = project(table, decoder, [entry(1, avro_encode(v1, {**order(1, NOW), "must": 1}), 0)])
    assert "'must' is added as required without a default" in rows[0]["decode_error"]


# ---- KEY_VALUE, PROTOBUF_NATIVE ------------------------------------------------------------

KEY = {"type": "record", "name": "OrderKey", "fields": [
    {"name": "region", "type": "string"}, {"name": "n", "type": "long"}]}


def kv_framing(key: bytes | None, value: bytes | None) -> bytes:
    """Pulsar's ``[int32 len][key][int32 len][value]`` (-1: null)."""
    return b"".join(struct.pack(">i", -1) if p is None else struct.pack(">i", len(p)) + p
                    for p in (key, value))


def kv_info(key_type: str, value_type: str, encoding: str, value_def: bytes,
            key_def: Any = KEY) -> SchemaInfo:
    return SchemaInfo(
        schema_id="public/default/orders", type=SchemaType.KEYVALUE,
        schema=kv_framing(json.dumps(key_def).encode(), value_def), timestamp=NOW,
        props=(("key.schema.name", "OrderKey"), ("key.schema.type", key_type),
               ("key.schema.properties", "{}"), ("value.schema.name", "Order"),
               ("value.schema.type", value_type), ("value.schema.properties", "{}"),
               ("kv.encoding.type", encoding)))


def kv_table(tmp_path: Path, infos: list[SchemaInfo]) -> tuple[Any, Any]:
    settings = settings_of(write_config(tmp_path))
    table = open_table(open_catalog(settings), TOPIC)
    return table, evolve(table, str(TOPIC), [SchemaVersion(i, x) for i, x in enumerate(infos)])


def kv_rows(table: Any, decoder: Any, entries: list[bytes]) -> list[dict[str, Any]]:
    b = RowBuilder(str(TOPIC), table.schema(), None, decoder)
    for i, raw in enumerate(entries):
        b.add(Position(3, i), raw)
    table.append(b.table())
    rows = table.scan().to_arrow().sort_by([("entry_id", "ascending")])
    out: list[dict[str, Any]] = rows.select(
        [c for c in ("key", "kv_key", "value", "payload", "decode_error")
         if c in rows.column_names]).to_pylist()
    return out


@pytest.mark.timeout(60)
def test_key_value_inline_and_separated_become_key_and_value_structs(tmp_path: Path) -> None:
    order_def = json.dumps(ORDER_SCHEMA).encode()
    table, decoder = kv_table(tmp_path, [kv_info("AVRO", "AVRO", "INLINE", order_def),
                                         kv_info("JSON", "AVRO", "SEPARATED", order_def)])
    schema = table.schema()
    assert isinstance(schema.find_field("kv_key").field_type, StructType)
    assert [f.name for f in schema.find_field("kv_key").field_type.fields] == ["region", "n"]
    o = order(4, NOW)
    k = {"region": "eu", "n": 4}
    inline = kv_framing(avro_encode(KEY, k), avro_encode(ORDER_SCHEMA, o))
    separated = pb.MessageMetadata(
        producer_name="p", sequence_id=1, publish_time=NOW, schema_version=version_bytes(1),
        partition_key=base64.b64encode(json.dumps(k).encode()).decode(),
        partition_key_b64_encoded=True)
    rows = kv_rows(table, decoder, [
        entry(0, inline, 0),
        encode_entry(separated, avro_encode(ORDER_SCHEMA, o)),
        entry(0, kv_framing(None, avro_encode(ORDER_SCHEMA, o)), 2),  # a null key
        entry(0, inline[:-3], 3),  # the value cut short
        entry(0, b"\x00\x00", 4),  # not even the framing
    ])
    for r in rows[:2]:
        assert r["decode_error"] is None
        assert r["kv_key"] == k
        assert r["value"]["id"] == 4 and r["value"]["address"] == o["address"]
    assert rows[0]["payload"] == inline
    assert rows[2]["kv_key"] is None and rows[2]["value"]["id"] == 4
    assert rows[3]["value"] is None and rows[3]["kv_key"] is None
    assert "KEY_VALUE message of schema version 0" in rows[3]["decode_error"]
    assert "KEY_VALUE message of schema version 0" in rows[4]["decode_error"]


@pytest.mark.timeout(60)
def test_protobuf_stays_raw_and_a_key_value_key_change_is_refused(tmp_path: Path) -> None:
    protobuf = SchemaInfo("public/default/orders", SchemaType.PROTOBUF,
                          json.dumps(ORDER_SCHEMA).encode(), NOW)
    order_def = json.dumps(ORDER_SCHEMA).encode()
    bad_key = {**KEY, "fields": [{"name": "region", "type": "long"}, KEY["fields"][1]]}
    table, decoder = kv_table(tmp_path, [
        kv_info("AVRO", "STRING", "INLINE", b""),  # typed key, raw value
        kv_info("AVRO", "AVRO", "INLINE", order_def, bad_key),  # region: string -> long
        protobuf])
    assert "value" not in {f.name for f in table.schema().fields}
    k = {"region": "eu", "n": 1}
    rows = kv_rows(table, decoder, [
        entry(0, kv_framing(avro_encode(KEY, k), b"text"), 0),
        entry(1, kv_framing(avro_encode(bad_key, {"region": 5, "n": 1}), b""), 1),
        entry(2, b"\x08\x96\x01", 2)])
    assert rows[0]["kv_key"] == k and rows[0]["decode_error"] is None
    assert "kv_key: field 'region' changes type" in rows[1]["decode_error"]
    assert rows[2]["decode_error"] is None and rows[2]["payload"] == b"\x08\x96\x01"


@pytest.mark.timeout(60)
def test_protobuf_native_messages_become_typed_structs(tmp_path: Path) -> None:
    fds = order_file_set()
    definition = json.dumps({
        "fileDescriptorSet": base64.b64encode(fds.SerializeToString()).decode(),
        "rootMessageTypeName": "shop.Order", "rootFileDescriptorName": "shop/order.proto"})
    native = SchemaInfo("public/default/orders", SchemaType.PROTOBUFNATIVE,
                        definition.encode(), NOW)
    broken = SchemaInfo("public/default/orders", SchemaType.PROTOBUFNATIVE, b'{"x": 1}', NOW)
    table, decoder = kv_table(tmp_path, [native, broken])
    assert table.schema().find_field("value.at").field_type == TimestamptzType()
    pool = descriptor_pool.DescriptorPool()  # the producer's side
    pool.Add(fds.file[1])
    pool.Add(fds.file[0])
    order_cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order"))
    msg: Any = order_cls(id=7, qty=3, tags=["a", "b"], state=1, counts={"x": 2})
    msg.address.city = "Lyon"
    msg.at.seconds, msg.at.nanos = 1_700_000_000, 123_456_000
    msg.parent.id = 6
    rows = kv_rows(table, decoder, [entry(0, msg.SerializeToString(), 0),
                                    entry(0, order_cls(id=8).SerializeToString(), 1),
                                    entry(0, b"\xff\xff", 2),
                                    entry(1, b"", 3)])
    assert rows[0]["decode_error"] is None
    assert rows[0]["value"] == {
        "id": 7, "qty": 3, "address": {"city": "Lyon"}, "tags": ["a", "b"],
        "at": dt.datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=dt.UTC), "state": "PAID",
        "counts": [("x", 2)], "parent": '{"id": "6"}'}
    assert rows[1]["value"] == {"id": 8, "qty": 0, "address": None, "tags": [], "at": None,
                                "state": "NEW", "counts": [], "parent": None}
    assert "does not decode as PROTOBUFNATIVE schema version 0" in rows[2]["decode_error"]
    assert "schema version 1 is unusable" in rows[3]["decode_error"]


@pytest.mark.timeout(60)
def test_a_json_decimal_number_keeps_its_value(tmp_path: Path) -> None:
    priced = {**ORDER_SCHEMA, "fields": [*ORDER_SCHEMA["fields"], {"name": "price", "type": {
        "type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}}]}
    table, decoder = table_for(tmp_path, "json", [priced])
    rows = project(table, decoder, [entry(0, json.dumps({**order(1, NOW), "price": 5}).encode(),
                                          0)])
    assert rows[0]["decode_error"] is None and str(rows[0]["value"]["price"]) == "5.00"
