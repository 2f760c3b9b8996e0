"""A sidecar's schemas come from where Pulsar keeps them: the locator in Pulsar's ZooKeeper
(``/schemas/<tenant>/<ns>/<topic>``), each version in a BookKeeper ledger of one entry, written
by :meth:`FakePulsar.put_schema` as ``BookkeeperSchemaStorage`` writes them. The daemon's
lakehouse projection, wired as in production, types its columns from them."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from offloadd import config
from offloadd._proto import pulsar_api_pb2 as pb
from offloadd.commit.ownership import Ownership
from offloadd.errors import NotFound
from offloadd.format.avro import encode as avro_encode
from offloadd.format.message import encode_entry
from offloadd.format.schema_storage import SchemaInfo, SchemaType, version_bytes
from offloadd.lakehouse.tables import open_catalog
from offloadd.ledger.bookkeeper.schemas import bookkeeper_schema_reader
from offloadd.metadata.schemas import topic_schema_id
from offloadd.model import TopicName
from offloadd.shell.runtime import Runtime
from tests.bookkeeper.conftest import Cluster
from tests.bookkeeper.test_e2e import CONFIG, offloaded_to_the_end

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

A = TopicName.parse("persistent://public/default/orders")
PART = TopicName.parse("persistent://public/default/parted-partition-2")
NONE = TopicName.parse("persistent://public/default/plain")
V0: dict[str, Any] = {"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "where", "type": {"type": "record", "name": "Where", "fields": [
        {"name": "city", "type": "string"}]}}]}
V1 = {**V0, "fields": [*V0["fields"], {"name": "note", "type": ["null", "string"],
                                       "default": None}]}


def info(topic: TopicName, kind: int, definition: Any) -> SchemaInfo:
    return SchemaInfo(topic_schema_id(topic), kind, json.dumps(definition).encode(),
                      1_779_000_000_000, "", False, (("__alwaysAllowNull", "true"),))


async def test_versions_are_read_from_the_locator_and_the_schema_ledgers(
        cluster: Cluster) -> None:
    p = cluster.pulsar
    infos = [info(A, SchemaType.AVRO, V0), info(A, SchemaType.AVRO, V1)]
    assert [await p.put_schema(A, i) for i in infos] == [0, 1]
    parted = info(PART, SchemaType.JSON, V0)
    await p.put_schema(PART, parted)  # partitions share their parent's schema
    src = cluster.source()
    try:
        reader = bookkeeper_schema_reader(src)
        got = await reader.versions(A)
        assert [(v.version, v.info) for v in got] == [(0, infos[0]), (1, infos[1])]
        assert [v.avro() for v in got] == [V0, V1]
        assert [v.info for v in await reader.versions(
            TopicName.parse("persistent://public/default/parted-partition-0"))] == [parted]
        assert await reader.versions(NONE) == []
        # a bookie of every schema ledger's write set stops answering: the replicas serve
        for b in cluster.bookies:
            b.freeze()
        cluster.bookies[0].thaw()
        cluster.bookies[1].thaw()
        fresh = bookkeeper_schema_reader(src)
        assert [v.info for v in await fresh.versions(A)] == infos
    finally:
        for b in cluster.bookies:
            b.thaw()
        await src.close()


async def offloaded(cluster: Cluster, topic: TopicName) -> bool:
    try:
        return await offloaded_to_the_end(cluster, topic)
    except NotFound:  # the daemon has not mirrored the topic yet
        return False


def avro_entry(seq: int, version: int, datum: dict[str, Any], schema: Any) -> bytes:
    md = pb.MessageMetadata(producer_name="p", sequence_id=seq, publish_time=1_779_000_000_000,
                            schema_version=version_bytes(version))
    return encode_entry(md, avro_encode(schema, datum))


@pytest.mark.timeout(150)
async def test_the_sidecar_lakehouse_types_columns_from_pulsars_registry(
        cluster: Cluster, tmp_path: Path) -> None:
    p = cluster.pulsar
    assert await p.put_schema(A, info(A, SchemaType.AVRO, V0)) == 0
    assert await p.put_schema(A, info(A, SchemaType.AVRO, V1)) == 1
    t0 = dt.datetime(2026, 11, 28, tzinfo=dt.UTC)
    sent = []
    for i in range(30):
        v1 = i >= 20
        d: dict[str, Any] = {"id": i, "at": int(t0.timestamp() * 1000) + i,
                             "where": {"city": f"c{i}"}}
        if v1:
            d["note"] = None if i % 2 else f"n{i}"
        sent.append(d)
        await p.append(A, [avro_entry(i, int(v1), d, V1 if v1 else V0)])
    await p.close_ledger(A)
    cfg = tmp_path / "offloadd.toml"
    cfg.write_text(CONFIG.format(offloadd_url=cluster.offloadd_url,
                                 pulsar_url=cluster.pulsar_url, tier=tmp_path / "tier",
                                 tmp=tmp_path) + f'[lakehouse]\nenabled = true\n'
                                                 f'path = "{tmp_path}/lakehouse"\n')
    settings = config.load(cfg)
    rt = await Runtime.open(settings, ownership=Ownership())
    daemon = asyncio.ensure_future(rt.daemon.run(install_signals=False))
    try:
        async with asyncio.timeout(90):
            while not await offloaded(cluster, A):
                await asyncio.sleep(0.25)
        await rt.start_lakehouse()  # the follower, given the source's schema reader
        reports = await rt.lakehouse.catch_up()
        assert all(r.error is None for r in reports), reports
    finally:
        rt.daemon.request_stop()
        await asyncio.gather(daemon, return_exceptions=True)
        await rt.close()
    table = open_catalog(settings, create=False).load_table((A.tenant, A.namespace, A.local))
    rows = table.scan().to_arrow().sort_by([("entry_id", "ascending")]).to_pylist()
    assert [r["decode_error"] for r in rows] == [None] * len(sent)
    assert [r["value"] for r in rows] == [
        {"note": None, **d, "at": t0 + dt.timedelta(milliseconds=i)} for i, d in enumerate(sent)]
