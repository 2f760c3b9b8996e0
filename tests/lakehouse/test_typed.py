"""Typed columns against a real table (SQLite catalog, filesystem warehouse): the ``value``
struct from a schema's versions, schema evolution through pyiceberg, and the messages that do
not decode (a malformed payload, a version the table refuses) kept as flagged rows."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.types import DecimalType, StringType, StructType

from offloadd._proto import pulsar_api_pb2 as pb
from offloadd.format.avro import encode as avro_encode
from offloadd.format.message import encode_entry
from offloadd.format.schema_storage import version_bytes
from offloadd.lakehouse.rows import RowBuilder
from offloadd.lakehouse.tables import open_catalog, open_table
from offloadd.lakehouse.typed import evolve
from offloadd.metadata.schemas import SchemaVersion
from offloadd.model import Position, TopicName
from offloadd.shell.produce_schema import ORDER_SCHEMA, order, schema_info
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
