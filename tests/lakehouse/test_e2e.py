"""The lakehouse end to end: ``offloadd standalone`` for 60 s with 3 topics writes Pulsar-format
entries (every codec), offloads them, and projects them into one Iceberg table per topic. Then,
per topic, the table's rows are exactly the messages the writer sent (count, and the SHA-1 of the
payloads in (ledger, entry, batch index) order), ``offloadd query`` answers with DuckDB, and Spark
reads the same table.

One standalone run serves every test of this module (it is the slow part).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from offloadd.model import TopicName
from tests.lakehouse.support import (
    digest,
    distinct_positions,
    run,
    settings_of,
    summary,
    table_rows,
    write_config,
)

pytestmark = pytest.mark.integration
SECONDS = 60
TOPICS = [f"persistent://public/default/topic-{i}" for i in range(3)]


class Run:
    def __init__(self, cwd: Path, cfg: Path, result: dict[str, Any]) -> None:
        self.cwd, self.cfg, self.summary = cwd, cfg, result
        self.settings = settings_of(cfg)

    def query(self, sql: str) -> list[dict[str, Any]]:
        out = run(["query", "--config", str(self.cfg), "--json", sql], self.cwd, timeout=120)
        rows: list[dict[str, Any]] = json.loads(out.stdout)
        return rows


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Run:
    cwd = tmp_path_factory.mktemp("lakehouse-e2e")
    cfg = write_config(cwd)
    out = run(["standalone", "--json", "--config", str(cfg), "--duration", str(SECONDS),
               "--topics", "3",
               "--rate", "1000000"], cwd, timeout=SECONDS + 180)
    return Run(cwd, cfg, summary(out.stdout))


@pytest.mark.timeout(400)
def test_every_message_sent_is_one_row_in_log_order(standalone: Run) -> None:
    s = standalone.summary
    assert s["drained"] is True
    for topic in TOPICS:
        sent = s["topics"][topic]["sent"]
        assert sent["messages"] > 10_000
        assert s["lakehouse"][topic] == {"last_position": s["topics"][topic]["last_offloaded"],
                                         "error": None}
        rows = table_rows(standalone.settings, topic)
        assert digest(rows) == sent, topic
        assert distinct_positions(rows) == rows.num_rows  # no duplicate
        assert rows.column("decode_error").null_count == rows.num_rows
        codecs = {r["producer_name"].rsplit("-", 1)[1] for r in
                  rows.select(["producer_name"]).to_pylist()}
        assert codecs == {"lz4", "zstd", "snappy", "zlib", "none"}
        assert rows.column("broker_index").to_pylist()[-1] == sent["messages"] - 1


@pytest.mark.timeout(400)
def test_query_answers_count_publish_time_range_and_a_key_filter(standalone: Run) -> None:
    per_topic = standalone.query(" UNION ALL ".join(
        f"SELECT {i} AS topic, count(*) AS n, min(publish_time) AS lo, max(publish_time) AS hi "
        f"FROM topic_{i}" for i in range(len(TOPICS))) + " ORDER BY topic")
    assert [r["topic"] for r in per_topic] == list(range(len(TOPICS)))
    for one, topic in zip(per_topic, TOPICS, strict=True):
        times = table_rows(standalone.settings, topic).column("publish_time").to_pylist()
        assert one["n"] == standalone.summary["topics"][topic]["sent"]["messages"]
        assert dt.datetime.fromisoformat(one["lo"]) == min(times)
        assert dt.datetime.fromisoformat(one["hi"]) == max(times)
    rows = table_rows(standalone.settings, TOPICS[1])
    want = [(r["ledger_id"], r["entry_id"], r["batch_index"])
            for r in rows.select(["ledger_id", "entry_id", "batch_index", "key"]).to_pylist()
            if r["key"] == "key-7"]
    assert want
    got = standalone.query('SELECT ledger_id, entry_id, batch_index FROM "topic-1" '
                           "WHERE key = 'key-7' ORDER BY 1, 2, 3")
    assert [(r["ledger_id"], r["entry_id"], r["batch_index"]) for r in got] == want


@pytest.mark.timeout(400)
def test_spark_reads_the_same_table(standalone: Run) -> None:
    from pyspark.sql import SparkSession

    from offloadd.backfill.spark import session
    from offloadd.lakehouse.spark import read_table

    shared = SparkSession.getActiveSession() is not None  # e.g. the backfill tests' session
    spark = session("local[2]", app_name="offloadd-lakehouse-tests", log_level="ERROR",
                    conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"})
    try:
        topic = TOPICS[2]
        df = read_table(spark, str(standalone.cfg), TopicName.parse(topic))
        assert df.count() == standalone.summary["topics"][topic]["sent"]["messages"]
        ordered = df.orderBy("ledger_id", "entry_id", "batch_index").select("payload")
        import pyarrow as pa

        payloads = pa.table({"payload": pa.array(
            [bytes(r.payload) for r in ordered.toLocalIterator()], pa.binary())})
        assert digest(payloads) == standalone.summary["topics"][topic]["sent"]
        keyed = df.where("key = 'key-3'").count()
        rows = table_rows(standalone.settings, topic)
        assert keyed == sum(1 for k in rows.column("key").to_pylist() if k == "key-3")
    finally:
        if not shared:
            spark.stop()
