"""``offloadd produce --schema avro|json``: messages of a registered schema, as a Pulsar producer
with ``AvroSchema``/``JsonSchema`` writes them.

The schema (an ``Order`` record: long, string, double, boolean, an optional string, a nested
``Address`` record and a ``timestamp-millis``) is registered for each topic in the embedded
store's schema registry (:mod:`offloadd.metadata.schemas`) the way the broker registers a
producer's schema; every entry's ``MessageMetadata.schema_version`` carries the version, and
the payloads are Avro binary (AVRO) or JSON text (JSON).
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Callable
from typing import Any, Literal

from offloadd._proto import pulsar_api_pb2 as pb
from offloadd.format.avro import encode as avro_encode
from offloadd.format.message import encode_batch, encode_entry
from offloadd.format.schema_storage import SchemaInfo, SchemaType, version_bytes
from offloadd.metadata.base import MetadataStore
from offloadd.metadata.schemas import register, topic_schema_id
from offloadd.model import TopicName
from offloadd.shell.produce import TopicDigest, TxnPlan

__all__ = ["ORDER_SCHEMA", "SchemaEntries", "SchemaKind", "order", "register_order_schema",
           "schema_entries"]

SchemaKind = Literal["avro", "json"]

ORDER_SCHEMA: dict[str, Any] = {
    "type": "record", "name": "Order", "namespace": "offloadd.demo",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "paid", "type": "boolean"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "address", "type": {
            "type": "record", "name": "Address",
            "fields": [{"name": "city", "type": "string"}, {"name": "zip", "type": "int"}]}},
        {"name": "created", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}
_CITIES = ("Lyon", "Zürich", "Osaka", "Lima")
_U32 = struct.Struct(">I")


def order(i: int, now_ms: int) -> dict[str, Any]:
    """Message ``i`` of a topic (deterministic, so a test can say what each row holds)."""
    return {"id": i, "customer": f"c{i % 97:03d}", "amount": (i * 17 % 5000) / 4,
            "paid": i % 3 != 0, "note": None if i % 4 == 0 else f"note {i}",
            "address": {"city": _CITIES[i % len(_CITIES)], "zip": 10000 + i % 90000},
            "created": now_ms - i % 1000}


def schema_info(topic: TopicName, kind: SchemaKind, definition: dict[str, Any],
                now_ms: int) -> SchemaInfo:
    return SchemaInfo(
        schema_id=topic_schema_id(topic),
        type=SchemaType.AVRO if kind == "avro" else SchemaType.JSON,
        schema=json.dumps(definition, separators=(",", ":")).encode(),
        timestamp=now_ms,
        props=(("__alwaysAllowNull", "true"), ("__jsr310ConversionEnabled", "false")))


async def register_order_schema(md: MetadataStore, topic: TopicName, kind: SchemaKind,
                                allocate_ledger: Callable[[], Any],
                                definition: dict[str, Any] | None = None) -> int:
    info = schema_info(topic, kind, definition or ORDER_SCHEMA, int(time.time() * 1000))
    return await register(md, topic, info, allocate_ledger)


class SchemaEntries:
    """An entry source for :func:`offloadd.shell.produce.produce`: batches of 1..``max_batch``
    messages of one registered schema version per topic (uncompressed).

    With ``transactions``, as ``produce --transactions`` writes Pulsar entries
    (:class:`offloadd.shell.produce.TxnPlan`): two entries in three belong to a transaction,
    one transaction in four is aborted, the commit/abort markers follow as a broker writes
    them, and the digests count what a read-committed consumer sees."""

    def __init__(self, kind: SchemaKind, versions: dict[TopicName, int], *,
                 max_batch: int = 16, clock: Callable[[], float] = time.time,
                 schema: dict[str, Any] | None = None, transactions: bool = False) -> None:
        self.kind = kind
        self.versions = versions
        self.max_batch = max(1, max_batch)
        self.schema = schema or ORDER_SCHEMA
        self.transactions = transactions
        self._clock = clock
        self._seq: dict[TopicName, int] = {}
        self._entries: dict[TopicName, int] = {}
        self._txns = TxnPlan()
        self.digests: dict[TopicName, TopicDigest] = {}

    def payload(self, datum: dict[str, Any]) -> bytes:
        if self.kind == "avro":
            return avro_encode(self.schema, datum)
        return json.dumps(datum, separators=(",", ":"), ensure_ascii=False).encode()

    def take(self, topic: TopicName, n: int) -> tuple[list[bytes | memoryview], int]:
        seq = self._seq.get(topic, 0)
        digest = self.digests.get(topic)
        if digest is None:
            digest = self.digests[topic] = TopicDigest(
                visible_messages=0 if self.transactions else None)
        now_ms = int(self._clock() * 1000)
        out: list[bytes | memoryview] = []
        size = 0
        k = self._entries.get(topic, 0)
        for _ in range(n):
            k += 1
            count = 1 + seq % self.max_batch
            payloads = [self.payload(order(seq + i, now_ms)) for i in range(count)]
            md = pb.MessageMetadata(producer_name=f"{topic.local}-{self.kind}", sequence_id=seq,
                                    publish_time=now_ms,
                                    schema_version=version_bytes(self.versions[topic]))
            txn = self._txns.join(topic, digest) if self.transactions and k % 3 else None
            if txn is not None:
                md.txnid_most_bits, md.txnid_least_bits = txn.id
            if count == 1:
                body = payloads[0]
                md.partition_key = f"key-{seq % 64}"
            else:
                body = encode_batch([(pb.SingleMessageMetadata(
                    payload_size=len(p), partition_key=f"key-{(seq + i) % 64}"), p)
                    for i, p in enumerate(payloads)])
                md.num_messages_in_batch = count
            md.uncompressed_size = len(body)
            entry = encode_entry(md, body)
            out.append(entry)
            size += len(entry)
            seq += count
            digest.messages += count
            if txn is None or not txn.abort:
                digest.sha1.update(b"".join(_U32.pack(len(p)) + p for p in payloads))
                if digest.visible_messages is not None:
                    digest.visible_messages += count
            else:
                digest.aborted_messages += count
            if txn is not None:
                txn.left -= 1
                if txn.left == 0:
                    out.append(self._txns.marker(topic, txn, now_ms))
        self._seq[topic] = seq
        self._entries[topic] = k
        return out, size

    def finish(self, topic: TopicName) -> list[bytes]:
        """The markers of the transactions still open on ``topic`` (written last)."""
        now_ms = int(self._clock() * 1000)
        return [self._txns.marker(topic, t, now_ms) for t in self._txns.still_open(topic)]


async def schema_entries(md: MetadataStore, topics: list[TopicName], kind: SchemaKind, *,
                         definition: dict[str, Any] | None = None, max_batch: int = 16,
                         transactions: bool = False) -> SchemaEntries:
    """The schema registered for each of ``topics`` (as a producer's is) and an entry source
    writing messages of it (``produce``/``standalone --schema``)."""
    from offloadd.ledger.local.meta import LedgerIds

    ids = LedgerIds(md, 1)
    versions = {t: await register_order_schema(md, t, kind, lambda: ids.allocate(-1),
                                               definition) for t in topics}
    return SchemaEntries(kind, versions, max_batch=max_batch, schema=definition,
                         transactions=transactions)
