"""Typed columns from what the official Python client writes: ``pulsar.schema.AvroSchema``,
``JsonSchema`` and ``ProtobufNativeSchema`` producers send through
:mod:`tests.fixtures.fake_broker` (the client registers its schema with the producer, as against
a real broker), ``offloadd standalone`` offloads and projects, and the table's ``value`` struct
holds exactly what was sent: nested records, ``timestamp-millis``, ``decimal``, ``uuid``,
optional fields, a second schema version that adds a field, protobuf enums, maps, repeated
fields and timestamps. The broker refuses an incompatible schema as Pulsar does, and the client
honours the ``max_message_size`` the broker advertises."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import socket
import uuid
from pathlib import Path
from typing import Any

import pytest

try:
    import pulsar
    from pulsar.schema import (
        AvroSchema,
        Integer,
        JsonSchema,
        Long,
        ProtobufNativeSchema,
        Record,
        String,
    )
except ImportError as exc:  # pragma: no cover - the dev group installs it
    pytest.skip(f"pulsar-client[avro] does not import here: {exc}", allow_module_level=True)

from offloadd._proto import pulsar_api_pb2 as pb
from offloadd.format.message import encode_entry
from tests.fixtures.fake_broker import running_broker
from tests.fixtures.pulsar_wire import (
    Frame,
    ServerError,
    T,
    command,
    encode,
    num,
    raw,
    split_frame,
)
from tests.lakehouse.protos import order_class
from tests.lakehouse.support import run, settings_of, summary, table_rows, write_config

pytestmark = pytest.mark.integration
AVRO = "persistent://public/default/client-avro"
JSON = "persistent://public/default/client-json"
PROTO = "persistent://public/default/client-proto"
ORDER_PB = order_class()
MAX_MESSAGE = 256 * 1024
T0 = dt.datetime(2026, 11, 28, 1, 2, 3, 456000, tzinfo=dt.UTC)

ORDER: dict[str, Any] = {
    "type": "record", "name": "Order", "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "address", "type": {"type": "record", "name": "Address", "fields": [
            {"name": "city", "type": "string"}, {"name": "zip", "type": "int"}]}},
        {"name": "created", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal",
                                    "precision": 10, "scale": 2}},
        {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "shipped", "type": ["null", {"type": "long",
                                              "logicalType": "timestamp-millis"}],
         "default": None},
    ],
}
ORDER_V1 = {**ORDER, "fields": [*ORDER["fields"], {
    "name": "coupon", "type": ["null", "string"], "default": None}]}
# customer becomes a long: neither version reads the other's data
ORDER_BAD = {**ORDER, "fields": [{"name": "customer", "type": "long"} if f["name"] == "customer"
                                 else f for f in ORDER["fields"]]}


def avro_order(i: int, v1: bool) -> dict[str, Any]:
    d = {"id": i, "customer": f"c-{i}-é", "address": {"city": ("Lyon", "Osaka")[i % 2],
                                                      "zip": 69000 + i},
         "created": T0 + dt.timedelta(milliseconds=i * 1001),
         "amount": decimal.Decimal(i * 137 - 5000).scaleb(-2),
         "ref": uuid.UUID(int=i * 7919 + 1),
         "note": None if i % 3 == 0 else f"note {i}",
         "shipped": None if i % 2 else T0 + dt.timedelta(hours=i)}
    if v1:
        d["coupon"] = f"C{i}" if i % 2 else None
    return d


class TimestampMillis(Long):  # type: ignore[misc]
    """A long the schema calls ``timestamp-millis`` (the client's JSON carries the number)."""

    def schema_info(self, defined_names: Any) -> Any:
        return {"type": "long", "logicalType": "timestamp-millis"}


class UuidString(String):  # type: ignore[misc]
    def schema_info(self, defined_names: Any) -> Any:
        return {"type": "string", "logicalType": "uuid"}


class Address(Record):  # type: ignore[misc]
    city = String(required=True)
    zip = Integer(required=True)


class Shipment(Record):  # type: ignore[misc]
    id = Long(required=True)
    address = Address(required=True)
    created = TimestampMillis(required=True)
    ref = UuidString(required=True)
    note = String()
    weight = Long()


def json_shipment(i: int) -> Shipment:
    return Shipment(id=i, address=Address(city=f"Zürich {i}", zip=8000 + i),
                    created=int(T0.timestamp() * 1000) + i, ref=str(uuid.UUID(int=i + 5)),
                    note=None if i % 4 == 0 else f"n{i}", weight=None if i % 5 == 0 else i * 3)


def proto_order(i: int) -> Any:
    m = ORDER_PB(id=i, qty=i % 4, tags=[f"t{j}" for j in range(i % 3)], state=i % 2,
                 counts={f"k{j}": j for j in range(i % 3)})
    if i % 5:
        m.address.city = f"Lima {i}"
    m.at.seconds, m.at.nanos = 1_779_000_000 + i, (i % 1000) * 1000
    if i % 7 == 0:
        m.parent.id = i - 1
    return m


@pytest.fixture(scope="module")
def done(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    cwd = tmp_path_factory.mktemp("official-client")
    cfg = write_config(cwd)
    sent: dict[str, list[Any]] = {AVRO: [], JSON: [], PROTO: []}
    with running_broker(settings_of(cfg), max_message_size=MAX_MESSAGE) as broker:
        client = pulsar.Client(broker.url, operation_timeout_seconds=30,
                               logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
        try:
            for version, schema in ((0, ORDER), (1, ORDER_V1)):
                p = client.create_producer(AVRO, schema=AvroSchema(None, schema_definition=schema),
                                           batching_enabled=True, batching_max_messages=7,
                                           batching_max_publish_delay_ms=2000)
                for i in range(len(sent[AVRO]), len(sent[AVRO]) + 60):
                    d = avro_order(i, version == 1)
                    p.send_async(d, None)  # batches of up to 7 messages
                    sent[AVRO].append((version, d))
                p.flush()
                p.close()
            with pytest.raises(pulsar.IncompatibleSchema):
                client.create_producer(AVRO, schema=AvroSchema(None, schema_definition=ORDER_BAD))
            p = client.create_producer(JSON, schema=JsonSchema(Shipment))
            for i in range(40):
                s = json_shipment(i)
                p.send(s)
                sent[JSON].append((0, s))
            big = json_shipment(99)
            big.note = "x" * MAX_MESSAGE
            with pytest.raises(pulsar.MessageTooBig):  # the limit CONNECTED advertised
                p.send(big)
            p.close()
            p = client.create_producer(PROTO, schema=ProtobufNativeSchema(ORDER_PB))
            for i in range(25):
                m = proto_order(i)
                p.send(m)
                sent[PROTO].append((0, m))
            p.close()
        finally:
            client.close()
        assert broker.unexpected == []
        assert len(broker.refused) == 1 and "customer" in broker.refused[0], broker.refused
    out = run(["standalone", "--json", "--config", str(cfg), "--duration", "8", "--topics", "1",
               "--rate", "100000"], cwd, timeout=240)
    result = summary(out.stdout)
    for topic in (AVRO, JSON, PROTO):
        assert result["lakehouse"][topic]["error"] is None, result["lakehouse"]
    return cfg, sent


@pytest.mark.timeout(400)
def test_avro_rows_hold_what_the_client_sent(done: tuple[Path, dict[str, Any]]) -> None:
    cfg, sent = done
    rows = table_rows(settings_of(cfg), AVRO)
    assert rows.num_rows == len(sent[AVRO])
    assert rows.column("decode_error").null_count == rows.num_rows
    assert max(rows.column("batch_index").to_pylist()) > 0  # the client batched
    got = rows.select(["value", "schema_version"]).to_pylist()
    for (version, d), r in zip(sent[AVRO], got, strict=True):
        assert int.from_bytes(r["schema_version"], "big") == version
        want = {**d, "ref": str(d["ref"]), "coupon": d.get("coupon")}
        assert r["value"] == want


@pytest.mark.timeout(400)
def test_json_rows_hold_what_the_client_sent(done: tuple[Path, dict[str, Any]]) -> None:
    cfg, sent = done
    rows = table_rows(settings_of(cfg), JSON)
    assert rows.num_rows == len(sent[JSON])
    assert rows.column("decode_error").null_count == rows.num_rows
    for (_, s), r in zip(sent[JSON], rows.select(["value", "payload"]).to_pylist(),
                         strict=True):
        assert json.loads(r["payload"])["id"] == s.id
        assert r["value"] == {
            "id": s.id, "address": {"city": s.address.city, "zip": s.address.zip},
            "created": dt.datetime.fromtimestamp(s.created / 1000, dt.UTC),
            "ref": s.ref, "note": s.note, "weight": s.weight}


@pytest.mark.timeout(400)
def test_protobuf_native_rows_hold_what_the_client_sent(
        done: tuple[Path, dict[str, Any]]) -> None:
    cfg, sent = done
    rows = table_rows(settings_of(cfg), PROTO)
    assert rows.num_rows == len(sent[PROTO])
    assert rows.column("decode_error").null_count == rows.num_rows
    for (_, m), r in zip(sent[PROTO], rows.select(["value"]).to_pylist(), strict=True):
        r["value"]["counts"].sort()  # a protobuf map has no order
        assert r["value"] == {
            "id": m.id, "qty": m.qty, "address": {"city": m.address.city}
            if m.HasField("address") else None, "tags": list(m.tags),
            "at": dt.datetime.fromtimestamp(m.at.seconds, dt.UTC).replace(
                microsecond=m.at.nanos // 1000),
            "state": ("NEW", "PAID")[m.state], "counts": sorted(m.counts.items()),
            "parent": f'{{"id": "{m.parent.id}"}}' if m.HasField("parent") else None}


@pytest.mark.timeout(400)
def test_query_sees_the_logical_types(done: tuple[Path, dict[str, Any]]) -> None:
    cfg, sent = done
    out = run(["query", "--config", str(cfg), "--json",
               "SELECT value.amount AS amount, CAST(value.ref AS VARCHAR) AS ref, "
               "value.address.city AS city, typeof(value.amount) AS amount_type "
               "FROM client_avro WHERE value.id = 61"], cfg.parent)
    d = sent[AVRO][61][1]
    assert json.loads(out.stdout) == [{
        "amount": str(d["amount"]), "ref": str(d["ref"]), "city": "Osaka",
        "amount_type": "DECIMAL(10,2)"}]


def _read(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:  # a socket with a timeout returns what it has, MSG_WAITALL or not
        more = sock.recv(n - len(out))
        if not more:
            break
        out += more
    return out


def _roundtrip(sock: socket.socket, frame: bytes) -> Frame | None:
    """Send a frame, read the answer (None: the broker closed the connection)."""
    sock.sendall(frame)
    head = _read(sock, 4)
    if len(head) < 4:
        return None
    return split_frame(_read(sock, int.from_bytes(head, "big")))  # after totalSize


@pytest.mark.timeout(120)
def test_the_broker_refuses_what_pulsar_refuses(tmp_path: Path) -> None:
    """Raw frames: a message over the topic's limit and a bad checksum are send errors;
    GET_OR_CREATE_SCHEMA registers once and refuses an incompatible schema; a frame past the
    advertised limit plus the framing padding closes the connection."""
    cfg = write_config(tmp_path)
    with running_broker(settings_of(cfg), max_message_size=4096,
                        topic_max_message_size=1024) as broker, \
            socket.create_connection(("127.0.0.1", broker.port), timeout=30) as sock:
        got = _roundtrip(sock, command(T.CONNECT, encode((1, "test"), (4, 19))))
        assert got is not None and got.kind == T.CONNECTED and num(got.body, 3) == 4096
        got = _roundtrip(sock, command(T.PRODUCER, encode((1, JSON), (2, 1), (3, 1))))
        assert got is not None and got.kind == T.PRODUCER_SUCCESS

        def send(seq: int, payload: bytes, *, corrupt: bool = False) -> Frame | None:
            tail = encode_entry(pb.MessageMetadata(producer_name="p", sequence_id=seq,
                                                   publish_time=1), payload)
            if corrupt:
                tail = tail[:-1] + bytes([tail[-1] ^ 1])
            return _roundtrip(sock, command(T.SEND, encode((1, 1), (2, seq)), tail))

        ok = send(0, b"fits")
        assert ok is not None and ok.kind == T.SEND_RECEIPT
        big = send(1, b"x" * 2000)
        assert big is not None and big.kind == T.SEND_ERROR
        assert num(big.body, 3) == ServerError.NotAllowedError
        bad = send(2, b"flipped", corrupt=True)
        assert bad is not None and bad.kind == T.SEND_ERROR
        assert num(bad.body, 3) == ServerError.ChecksumError
        # GET_OR_CREATE_SCHEMA (a client registering a schema without a producer)
        schema = encode((1, "Order"), (3, json.dumps(ORDER)), (4, 4))  # type Avro
        refused = encode((1, "Order"), (3, json.dumps(ORDER_BAD)), (4, 4))
        for body, err in ((schema, None), (schema, None),
                          (refused, ServerError.IncompatibleSchema)):
            got = _roundtrip(sock, command(T.GET_OR_CREATE_SCHEMA,
                                           encode((1, 7), (2, AVRO), (3, body))))
            assert got is not None and got.kind == T.GET_OR_CREATE_SCHEMA_RESPONSE
            assert (num(got.body, 2, -1) if err else raw(got.body, 4)) == \
                (err if err else (0).to_bytes(8, "big"))  # the same version twice
        assert send(3, b"y" * (4096 + 11 * 1024)) is None  # past max_message_size + padding
        assert broker.oversize_frames == 1
