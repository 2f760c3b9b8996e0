"""Spark (local mode, the offloadd-iceberg data source) reads a typed Avro table: the
``value`` struct with a nested record, a decimal, a timestamp, a list and a map."""

from __future__ import annotations

import datetime as dt
import decimal
from pathlib import Path
from typing import Any

import pytest

from offloadd.format.avro import encode as avro_encode
from offloadd.lakehouse.rows import RowBuilder
from offloadd.lakehouse.spark import spark_ddl
from offloadd.lakehouse.tables import open_catalog, open_table
from offloadd.lakehouse.typed import evolve
from offloadd.metadata.schemas import SchemaVersion
from offloadd.model import Position
from offloadd.shell.produce_schema import ORDER_SCHEMA, order, schema_info
from tests.lakehouse.support import settings_of, write_config
from tests.lakehouse.test_typed import NOW, TOPIC, entry

SCHEMA: dict[str, Any] = {**ORDER_SCHEMA, "fields": [
    *ORDER_SCHEMA["fields"],
    {"name": "price", "default": None, "type": ["null", {
        "type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}]},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "counts", "type": {"type": "map", "values": "long"}},
]}


def datum(i: int) -> dict[str, Any]:
    return {**order(i, NOW), "price": (1000 + i).to_bytes(4, "big", signed=True),
            "tags": [f"t{i}", "x"], "counts": {"a": i, "b": -i}}


@pytest.mark.timeout(300)
def test_spark_reads_the_typed_struct_columns(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    settings = settings_of(cfg)
    table = open_table(open_catalog(settings), TOPIC)
    decoder = evolve(table, str(TOPIC), [SchemaVersion(0, schema_info(TOPIC, "avro", SCHEMA,
                                                                      NOW))])
    b = RowBuilder(str(TOPIC), table.schema(), None, decoder)
    for i in range(5):
        b.add(Position(3, i), entry(0, avro_encode(SCHEMA, datum(i)), i))
    table.append(b.table())
    ddl = spark_ddl(table.schema())
    assert "`value` struct<" in ddl and "`address`: struct<`city`: string" in ddl
    assert "`price`: decimal(9, 2)" in ddl and "`created`: timestamp" in ddl

    from pyspark.sql import SparkSession

    from offloadd.backfill.spark import session  # sets PYSPARK_PYTHON, as docs/lakehouse.md
    from offloadd.lakehouse.spark import read_table

    shared = SparkSession.getActiveSession() is not None
    spark = session("local[1]", app_name="offloadd-typed-tests", log_level="ERROR",
                    conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "1"})
    try:
        df = read_table(spark, str(cfg), TOPIC)
        rows = df.orderBy("entry_id").select(
            "entry_id", "value.address.city", "value.address.zip", "value.price",
            "value.created", "value.tags", "value.counts", "value.note").collect()
        assert [r.entry_id for r in rows] == list(range(5))
        for i, r in enumerate(rows):
            o = datum(i)
            assert (r.city, r.zip) == (o["address"]["city"], o["address"]["zip"])
            assert r.price == decimal.Decimal(1000 + i).scaleb(-2)
            assert r.created.replace(tzinfo=None) == dt.datetime.fromtimestamp(
                o["created"] / 1000, dt.UTC).astimezone().replace(tzinfo=None)
            assert list(r.tags) == o["tags"] and dict(r.counts) == o["counts"]
            assert r.note == o["note"]
        assert df.where("value.address.city = 'Osaka'").count() == sum(
            1 for i in range(5) if datum(i)["address"]["city"] == "Osaka")
    finally:
        if not shared:
            spark.stop()
