"""The schema registry as Pulsar keeps it: ``/schemas/<tenant>/<ns>/<topic>`` holds a
``SchemaLocator`` listing every version; each version's ``SchemaEntry`` (a ``SchemaInfo``) is
found at the locator's position; the bytes are the proto2 encoding of Pulsar's messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offloadd.format.avro import decode as avro_decode
from offloadd.format.message import decode_entry
from offloadd.format.schema_storage import (
    IndexEntry,
    SchemaEntry,
    SchemaInfo,
    SchemaLocator,
    SchemaType,
    version_bytes,
    version_from_bytes,
)
from offloadd.ledger.local.meta import LedgerIds
from offloadd.metadata.embedded.store import EmbeddedMetadataStore
from offloadd.metadata.schemas import SchemaReader, locator_path, register
from offloadd.model import TopicName
from offloadd.shell.produce_schema import ORDER_SCHEMA, SchemaEntries, order, schema_info

TOPIC = TopicName.parse("persistent://public/default/orders-partition-3")


def test_proto_bytes_are_pulsars() -> None:
    # SchemaLocator{info: {version 1, position {7, 0}, hash "h"}, index: [...]} hand-checked
    # against SchemaStorageFormat.proto: 0a (info) len 08 01 12 04 08 07 10 00 1a 01 68
    e = IndexEntry(1, 7, 0, b"h")
    assert e.encode() == b"\x08\x01\x12\x04\x08\x07\x10\x00\x1a\x01h"
    loc = SchemaLocator(e, (IndexEntry(0, 5, 0, b"g"), e))
    assert SchemaLocator.decode(loc.encode()) == loc
    info = SchemaInfo("public/default/orders", SchemaType.AVRO, b'{"type":"string"}', 12,
                      props=(("__alwaysAllowNull", "true"),))
    assert SchemaInfo.decode(info.encode()) == info
    assert SchemaEntry.decode(SchemaEntry(info.encode(), (e,)).encode()).index == (e,)
    assert version_bytes(3) == b"\x00" * 7 + b"\x03"
    assert version_from_bytes(version_bytes(2**40)) == 2**40


@pytest.mark.timeout(60)
async def test_register_versions_and_read_them_back(tmp_path: Path) -> None:
    md = await EmbeddedMetadataStore.open(tmp_path / "md")
    try:
        ids = LedgerIds(md, 1)
        v0 = await register(md, TOPIC, schema_info(TOPIC, "avro", ORDER_SCHEMA, 1),
                            lambda: ids.allocate(-1))
        again = await register(md, TOPIC, schema_info(TOPIC, "avro", ORDER_SCHEMA, 2),
                               lambda: ids.allocate(-1))
        evolved = {**ORDER_SCHEMA, "fields": [*ORDER_SCHEMA["fields"], {
            "name": "coupon", "type": ["null", "string"], "default": None}]}
        v1 = await register(md, TOPIC, schema_info(TOPIC, "avro", evolved, 3),
                            lambda: ids.allocate(-1))
        assert (v0, again, v1) == (0, 0, 1)
        # Pulsar's path: no domain, no partition suffix
        assert locator_path(TOPIC) == "/schemas/public/default/orders"
        loc = SchemaLocator.decode((await md.get(locator_path(TOPIC))).data)
        assert loc.info.version == 1 and [e.version for e in loc.index] == [0, 1]
        assert loc.index[0].ledger_id != loc.index[1].ledger_id  # a ledger per version
        versions = await SchemaReader(md).versions(TOPIC)
        assert [v.type_name for v in versions] == ["AVRO", "AVRO"]
        assert versions[0].avro() == ORDER_SCHEMA and versions[1].avro() == evolved
        assert versions[1].info.schema_id == "public/default/orders"
    finally:
        await md.close()


def test_schema_entries_carry_the_version_and_decode_under_the_schema() -> None:
    for kind in ("avro", "json"):
        src = SchemaEntries(kind, {TOPIC: 4}, max_batch=3, clock=lambda: 1000.0)
        entries, _ = src.take(TOPIC, 4)
        got = []
        for raw in entries:
            d = decode_entry(raw, "test")
            assert d.schema_version == version_bytes(4)
            for m in d.messages:
                assert m.payload is not None
                got.append(avro_decode(ORDER_SCHEMA, m.payload) if kind == "avro"
                           else json.loads(m.payload))
        assert got == [order(i, 1_000_000) for i in range(len(got))]
        assert len(got) == src.digests[TOPIC].messages > 4  # some entries are batches


@pytest.mark.timeout(60)
async def test_a_locator_whose_entries_are_elsewhere_gives_no_versions(tmp_path: Path) -> None:
    # what a sidecar sees: Pulsar's locator, the entries in BookKeeper (not read yet)
    md = await EmbeddedMetadataStore.open(tmp_path / "md")
    try:
        e = IndexEntry(0, 424242, 0, b"h")
        await md.create(locator_path(TOPIC), SchemaLocator(e, (e,)).encode())
        assert await SchemaReader(md).versions(TOPIC) == []
    finally:
        await md.close()
