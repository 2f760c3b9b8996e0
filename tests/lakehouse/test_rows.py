"""Entries to rows (pure): every kind of entry becomes rows, nothing is dropped, and the query
names map onto tables."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from offloadd._proto import pulsar_api_pb2 as pb
from offloadd.errors import ConfigError
from offloadd.format.compression import Compression, compress
from offloadd.format.message import encode_batch, encode_entry
from offloadd.lakehouse.query import aliases
from offloadd.lakehouse.rows import RowBuilder
from offloadd.lakehouse.schema import table_schema
from offloadd.model import Position

TOPIC = "persistent://public/default/orders"


def batch(payloads: list[bytes], codec: Compression = Compression.NONE, **md: Any) -> bytes:
    plain = encode_batch([(pb.SingleMessageMetadata(payload_size=len(p), partition_key=f"k{i}"),
                           p) for i, p in enumerate(payloads)])
    meta = pb.MessageMetadata(producer_name="p", sequence_id=2**64 - 1, publish_time=1_000,
                              num_messages_in_batch=len(payloads),
                              uncompressed_size=len(plain), compression=codec, **md)
    return encode_entry(meta, compress(codec, plain),
                        broker=pb.BrokerEntryMetadata(broker_timestamp=2_000, index=7))


def test_a_batch_becomes_one_row_per_message_in_order() -> None:
    b = RowBuilder(TOPIC, table_schema())
    b.add(Position(3, 0), batch([b"a", b"bb", b"ccc"], Compression.ZSTD))
    b.add(Position(3, 1), batch([b"d"]))
    t = b.table()
    assert t.num_rows == 4
    rows = t.to_pylist()
    assert [(r["ledger_id"], r["entry_id"], r["batch_index"], r["payload"]) for r in rows] == [
        (3, 0, 0, b"a"), (3, 0, 1, b"bb"), (3, 0, 2, b"ccc"), (3, 1, 0, b"d")]
    r = rows[0]
    assert r["topic"] == TOPIC and r["key"] == "k0" and r["sequence_id"] == -1  # 2**64-1 wraps
    assert r["publish_time"].timestamp() == 1.0 and r["broker_timestamp"].timestamp() == 2.0
    assert r["broker_index"] == 7 and r["decode_error"] is None and r["encrypted"] is False
    assert b.rows == 0  # handed out


def test_undecodable_encrypted_and_chunked_entries_are_kept() -> None:
    b = RowBuilder(TOPIC, table_schema())
    b.add(Position(1, 0), b"\x0e\x01garbage")
    enc = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=5,
                             num_messages_in_batch=3, compression=Compression.LZ4)
    enc.encryption_keys.add(key="k", value=b"v")
    b.add(Position(1, 1), encode_entry(enc, b"ciphertext"))
    chunk = pb.MessageMetadata(producer_name="p", sequence_id=2, publish_time=5, uuid="u-1",
                               chunk_id=1, num_chunks_from_msg=3, total_chunk_msg_size=99,
                               compression=Compression.ZLIB)
    b.add(Position(1, 2), encode_entry(chunk, b"part"))
    assert b.undecodable == 1
    bad, secret, part = b.table().to_pylist()
    assert bad["decode_error"].startswith(f"{TOPIC} 1:0 at byte ")
    assert bad["payload"] == b"\x0e\x01garbage" and bad["batch_index"] == -1
    assert (secret["encrypted"], secret["payload"], secret["payload_compression"]) == (
        True, b"ciphertext", "LZ4")
    assert (part["chunk_uuid"], part["chunk_id"], part["num_chunks"], part["payload"],
            part["payload_compression"]) == ("u-1", 1, 3, b"part", "ZLIB")


def test_json_fields_are_typed_and_never_guessed() -> None:
    fields = {"n": "long", "x": "double", "s": "string", "b": "boolean"}
    b = RowBuilder(TOPIC, table_schema(fields), fields)
    docs = [{"n": 1, "x": 2, "s": "a", "b": True},
            {"n": True, "x": "no", "s": {"nested": 1}, "b": 0},
            {"n": 2**70}]
    b.add(Position(1, 0), batch([json.dumps(d).encode() for d in docs] + [b"{not json", b"[1]"]))
    rows = b.table().to_pylist()
    assert [(r["n"], r["x"], r["s"], r["b"]) for r in rows] == [
        (1, 2.0, "a", True), (None, None, '{"nested":1}', None), (None, None, None, None),
        (None, None, None, None), (None, None, None, None)]


def test_json_fields_may_not_shadow_columns() -> None:
    with pytest.raises(ConfigError, match="'payload' is a column of every table"):
        table_schema({"payload": "string"})


def test_query_names() -> None:
    names = aliases([("public", "default", "topic-0"), ("a", "x", "dup"), ("b", "y", "dup")])
    assert names["topic-0"] == names["topic_0"] == names["public.default.topic-0"]
    assert "dup" not in names and names["a.x.dup"] == ("a", "x", "dup")


def test_rows_convert_to_the_iceberg_arrow_schema() -> None:
    b = RowBuilder(TOPIC, table_schema())
    b.add(Position(1, 0), batch([b"x"]))
    t = b.table()
    assert isinstance(t, pa.Table)
    assert not t.schema.field("ledger_id").nullable and t.schema.field("payload").nullable
