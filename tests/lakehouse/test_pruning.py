"""Partitioning and pruning (issue 24 item 6): the partition choice per topic and the declared
sort order, and ``offloadd query`` reading only the data files its predicates can need — checked
on a real SQLite catalog and filesystem warehouse, answers compared with a whole-table scan."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.transforms import HourTransform

from offloadd import config
from offloadd.lakehouse.pruning import scan_filters
from offloadd.lakehouse.query import run_query
from offloadd.lakehouse.tables import open_catalog, open_table
from offloadd.model import TopicName

TOPIC = TopicName.parse("persistent://public/default/day")
DAY = dt.datetime(2026, 11, 25, tzinfo=dt.UTC)


def filters(sql: str) -> dict[str, str]:
    con = duckdb.connect()
    try:
        return {k: str(v) for k, v in scan_filters(con, sql, ["day", "t"]).items()}
    finally:
        con.close()


def test_filters_come_only_from_predicates_that_hold_for_every_row_read() -> None:
    got = filters("SELECT * FROM day WHERE publish_time >= '2026-11-25 08:00:00' AND "
                  "ledger_id BETWEEN 3 AND 5 AND 7 >= entry_id AND key = 'a'")
    assert set(got) == {"day"}
    for part in ("publish_time", "2026-11-25T08:00:00+00:00", "ledger_id", "LongLiteral(3)",
                 "LongLiteral(5)", "entry_id", "LongLiteral(7)"):
        assert part in got["day"]
    assert "key" not in got["day"]
    assert "ledger_id" in filters("SELECT * FROM day d WHERE d.ledger_id = 3")["day"]
    assert "ledger_id" in filters("SELECT * FROM (SELECT * FROM day WHERE ledger_id > 2) "
                                  "WHERE entry_id < 4")["day"]
    for sql in ("SELECT * FROM day WHERE ledger_id = 3 OR entry_id = 2",  # OR
                "SELECT * FROM day a JOIN day b USING (ledger_id) WHERE a.ledger_id = 3",
                "SELECT * FROM day WHERE ledger_id = 3 UNION ALL SELECT * FROM day",
                "WITH day AS (SELECT 1 AS ledger_id) SELECT * FROM day WHERE ledger_id = 3",
                "SELECT * FROM day WHERE ledger_id + 1 = 3", "SELECT * FROM day WHERE",
                "SELECT * FROM day WHERE publish_time > 'yesterday'"):
        assert filters(sql) == {}, sql


def build(root: Path, partition: str) -> Catalog:
    """A day of messages committed every 10 minutes (144 files), one ledger per hour."""
    catalog = open_catalog(config.load(None, lakehouse__path=str(root)))
    table = open_table(catalog, TOPIC, partition=partition)
    schema = table.schema().as_arrow()
    for c in range(144):
        start = DAY + dt.timedelta(minutes=10 * c)
        rows = [{"topic": str(TOPIC), "ledger_id": 1 + start.hour,
                 "entry_id": (c % 6) * 20 + i, "batch_index": -1,
                 "publish_time": start + dt.timedelta(seconds=30 * i),
                 "event_time": start + dt.timedelta(seconds=30 * i), "encrypted": False,
                 "payload": b"m"} for i in range(20)]
        table.append(pa.Table.from_pylist(rows, schema))
    return catalog


def count(catalog: Catalog, sql: str) -> tuple[Any, Any]:
    res = run_query(catalog, sql)
    (scan,) = res.scans
    return res.rows[0][0], scan


@pytest.mark.timeout(300)
@pytest.mark.parametrize("partition", ["day(publish_time)", "hour(publish_time)"])
def test_a_one_hour_query_reads_at_most_a_tenth_of_a_days_files(
        tmp_path: Path, partition: str) -> None:
    catalog = build(tmp_path, partition)
    table = catalog.load_table(("public", "default", "day"))
    assert [table.schema().find_column_name(f.source_id) for f in table.sort_order().fields
            ] == ["ledger_id", "entry_id", "batch_index"]  # the declared log order
    hour = ("SELECT count(*) FROM day WHERE publish_time >= '2026-11-25 13:00:00' "
            "AND publish_time < '2026-11-25 14:00:00'")
    n, scan = count(catalog, hour)
    whole, _ = count(catalog, hour.replace("FROM day", "FROM (SELECT * FROM day)"))
    assert n == whole == 120 and scan.files_total == 144 and scan.files <= 144 // 10
    n, scan = count(catalog, "SELECT count(*) FROM day WHERE ledger_id = 14 AND "
                             "entry_id BETWEEN 20 AND 39")
    assert n == 20 and scan.files == 1
    n, scan = count(catalog, "SELECT count(*) FROM day")
    assert n == 144 * 20 and scan.files == scan.files_total == 144 and scan.row_filter is None


def test_the_partition_choice_is_per_topic_and_evolves_existing_tables(tmp_path: Path) -> None:
    settings = config.load(None, lakehouse__path=str(tmp_path), lakehouse__partitions={
        str(TOPIC): "hour(event_time)"})
    from offloadd.lakehouse.layout import choice_for

    assert choice_for(settings, TOPIC) == "hour(event_time)"
    assert choice_for(settings, TopicName.parse("persistent://public/default/x")) == \
        "day(publish_time)"
    catalog = open_catalog(settings)
    table = open_table(catalog, TOPIC, partition="none")
    assert not table.spec().fields
    table = open_table(catalog, TOPIC, partition=choice_for(settings, TOPIC))
    (field,) = table.spec().fields
    assert isinstance(field.transform, HourTransform)
    assert table.schema().find_column_name(field.source_id) == "event_time"
