"""Typed columns end to end: ``offloadd produce --schema avro`` and ``--schema json`` register a
schema in the embedded store's registry and write messages of it; ``offloadd standalone``
offloads them and projects every topic; the tables have a ``value`` struct column (pyiceberg
sees it) and ``offloadd query`` returns the typed values, nested record and timestamp
included."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.types import StructType, TimestamptzType

from offloadd.format.avro import decode as avro_decode
from offloadd.lakehouse.tables import open_catalog
from offloadd.model import TopicName
from offloadd.shell.produce_schema import ORDER_SCHEMA
from tests.lakehouse.support import run, settings_of, summary, table_rows, write_config

pytestmark = pytest.mark.integration
AVRO = "persistent://public/default/orders-avro"
V1 = {**ORDER_SCHEMA, "fields": [*ORDER_SCHEMA["fields"], {
    "name": "coupon", "type": ["null", "string"], "default": None}]}
JSON = "persistent://public/default/orders-json"


@pytest.fixture(scope="module")
def done(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, Any]]:
    cwd = tmp_path_factory.mktemp("schemas-e2e")
    cfg = write_config(cwd)
    sent: dict[str, Any] = {}
    evolved = cwd / "order-v1.json"
    evolved.write_text(json.dumps(V1))
    for topic, kind in ((AVRO, "avro"), (JSON, "json")):
        for extra in ([], ["--schema-file", str(evolved)]):  # version 0, then version 1
            out = run(["produce", "--json", "--config", str(cfg), "--topic", topic,
                       "--bytes", "30000",
                       "--schema", kind, *extra], cwd)
            n = summary(out.stdout)["sent"][topic]["messages"]
            sent.setdefault(topic, []).append(n)
    out = run(["standalone", "--json", "--config", str(cfg), "--duration", "8", "--topics", "1",
               "--rate", "100000"], cwd, timeout=240)
    result = summary(out.stdout)
    for topic in (AVRO, JSON):
        assert result["lakehouse"][topic]["error"] is None, result["lakehouse"]
    return cwd, cfg, sent


@pytest.mark.timeout(400)
def test_pyiceberg_sees_the_struct_and_rows_hold_the_decoded_payloads(
        done: tuple[Path, Path, dict[str, Any]]) -> None:
    _cwd, cfg, sent = done
    settings = settings_of(cfg)
    for topic in (AVRO, JSON):
        t = TopicName.parse(topic)
        table = open_catalog(settings, create=False).load_table(
            (t.tenant, t.namespace, t.local))
        value = table.schema().find_field("value").field_type
        assert isinstance(value, StructType)
        # version 1 added its optional field to the struct
        assert [f.name for f in value.fields] == [f["name"] for f in V1["fields"]]
        assert isinstance(table.schema().find_field("value.address").field_type, StructType)
        assert isinstance(table.schema().find_field("value.created").field_type,
                          TimestamptzType)
        rows = table_rows(settings, topic)
        assert rows.num_rows == sum(sent[topic])
        assert rows.column("decode_error").null_count == rows.num_rows
        versions = [int.from_bytes(v, "big") for v in rows.column("schema_version").to_pylist()]
        assert versions == [0] * sent[topic][0] + [1] * sent[topic][1]
        for r in rows.select(["payload", "value", "schema_version"]).to_pylist()[::7]:
            v1 = int.from_bytes(r["schema_version"], "big") == 1
            want = avro_decode(V1 if v1 else ORDER_SCHEMA, r["payload"]) if topic == AVRO \
                else json.loads(r["payload"])
            got = r["value"]
            assert got["coupon"] is None  # v0 has no such field; v1's writer leaves it null
            assert got["id"] == want["id"] and got["customer"] == want["customer"]
            assert got["amount"] == want["amount"] and got["paid"] == want["paid"]
            assert got["note"] == want["note"] and got["address"] == want["address"]
            assert got["created"] == dt.datetime.fromtimestamp(want["created"] / 1000, dt.UTC)


@pytest.mark.timeout(400)
def test_query_returns_typed_values(done: tuple[Path, Path, dict[str, Any]]) -> None:
    cwd, cfg, _ = done
    out = run(["query", "--config", str(cfg), "--json",
               "SELECT value.id AS id, value.amount AS amount, value.paid AS paid, "
               "value.address.city AS city, value.note AS note, "
               "typeof(value.created) AS ts_type FROM orders_avro "
               "WHERE value.id = 5"], cwd)
    rows = json.loads(out.stdout)
    # one message with id 5 per produce run (version 0, then version 1)
    assert rows == [{"id": 5, "amount": 21.25, "paid": True, "city": "Zürich",
                     "note": "note 5", "ts_type": "TIMESTAMP WITH TIME ZONE"}] * 2


@pytest.mark.timeout(400)
@pytest.mark.parametrize("kind", ["avro", "json"])
def test_schema_messages_in_transactions_end_to_end(tmp_path: Path, kind: str) -> None:
    """``standalone --schema K --transactions`` → offload → table: read-committed rows, every one
    typed, as many as ``visible_messages``; ``offloadd query`` counts the same."""
    cfg = write_config(tmp_path)
    out = run(["standalone", "--json", "--config", str(cfg), "--duration", "6", "--topics", "1",
               "--rate", "60000", "--schema", kind, "--transactions", "--max-batch", "4"],
              tmp_path, timeout=300)
    result = summary(out.stdout)
    topic = "persistent://public/default/topic-0"
    sent = result["topics"][topic]["sent"]
    assert result["lakehouse"][topic]["error"] is None, result["lakehouse"]
    assert 0 < sent["visible_messages"] < sent["messages"] and sent["aborted_transactions"] > 0
    rows = table_rows(settings_of(cfg), topic)
    assert rows.num_rows == sent["visible_messages"]
    assert rows.column("decode_error").null_count == rows.num_rows
    assert rows.column("value").null_count == 0  # typed, markers and aborted messages hidden
    assert "pulsar.txn.marker" not in set(rows.column("producer_name").to_pylist())
    q = run(["query", "--config", str(cfg), "--json",
             "SELECT count(*) AS n, count(DISTINCT value.id) AS ids FROM topic_0"], tmp_path)
    assert json.loads(q.stdout) == [{"n": sent["visible_messages"],
                                     "ids": sent["visible_messages"]}]
