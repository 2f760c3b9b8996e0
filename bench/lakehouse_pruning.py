"""Issue 24 item 6: how many data files ``offloadd query`` reads for a one-hour query over a day
of data, by partition choice (goal: at most 1/10 of the files).

Builds a table per partition choice in a temporary SQLite catalog and filesystem warehouse: a day
of messages (``--rows-per-commit`` rows every ``--commit-minutes``, as the follower commits them:
in log order, one ledger per hour), then runs ``offloadd query``'s engine (``run_query``) on a
one-hour ``publish_time`` range, a ledger range and an entry range, and prints per query the data
files planned of the table's total and the answer's row count (checked against a full scan).

    .venv/bin/python bench/lakehouse_pruning.py [--commit-minutes 5] [--rows-per-commit 200]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]

from offloadd import config
from offloadd.lakehouse.query import run_query
from offloadd.lakehouse.tables import open_catalog, open_table
from offloadd.model import TopicName

TOPIC = TopicName.parse("persistent://public/default/day")
DAY = dt.datetime(2026, 11, 25, tzinfo=dt.UTC)


def build(root: Path, partition: str, commit_minutes: int, rows_per_commit: int) -> Any:
    settings = config.load(None, lakehouse__path=str(root / partition.replace("(", "_")))
    catalog = open_catalog(settings)
    table = open_table(catalog, TOPIC, partition=partition)
    schema = table.schema().as_arrow()
    for c in range(24 * 60 // commit_minutes):
        start = DAY + dt.timedelta(minutes=c * commit_minutes)
        step = dt.timedelta(minutes=commit_minutes) / rows_per_commit
        rows = [{"topic": str(TOPIC), "ledger_id": 1 + (start.hour), "entry_id":
                 (c * rows_per_commit + i) % (rows_per_commit * 60 // commit_minutes),
                 "batch_index": -1, "publish_time": start + i * step,
                 "event_time": start + i * step, "encrypted": False,
                 "payload": b"x" * 100} for i in range(rows_per_commit)]
        table.append(pa.Table.from_pylist(rows, schema))
    return catalog


QUERIES = {
    "one hour of publish_time": "SELECT count(*) AS n FROM day WHERE publish_time >= "
                                "'2026-11-25 13:00:00' AND publish_time < '2026-11-25 14:00:00'",
    "one ledger (an hour)": "SELECT count(*) AS n FROM day WHERE ledger_id = 14",
    "ledger and entry range": "SELECT count(*) AS n FROM day WHERE ledger_id = 14 AND "
                              "entry_id BETWEEN 0 AND 99",
    "whole day (no predicate)": "SELECT count(*) AS n FROM day",
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit-minutes", type=int, default=5)
    ap.add_argument("--rows-per-commit", type=int, default=200)
    args = ap.parse_args()
    out: dict[str, Any] = {"commit_minutes": args.commit_minutes,
                           "rows_per_commit": args.rows_per_commit, "layouts": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for partition in ("day(publish_time)", "hour(publish_time)", "none"):
            catalog = build(Path(tmp), partition, args.commit_minutes, args.rows_per_commit)
            results = {}
            for name, sql in QUERIES.items():
                t0 = time.perf_counter()
                res = run_query(catalog, sql)
                seconds = time.perf_counter() - t0
                (scan,) = res.scans
                full = run_query(catalog, sql.replace("FROM day", "FROM (SELECT * FROM day)"
                                                      ) + " ")
                assert full.rows == res.rows, (name, full.rows, res.rows)
                results[name] = {"files_read": scan.files, "files_total": scan.files_total,
                                 "share": round(scan.files / scan.files_total, 4),
                                 "rows": res.rows[0][0], "seconds": round(seconds, 3)}
            out["layouts"][partition] = results
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
