"""P10 table lag: how long after a segment is committed to the tier its messages are visible in
the topic's Iceberg table.

Runs ``offloadd standalone`` at its defaults (demo policy: 4 MiB / 6 s segments; the lakehouse
follower polls every ``[lakehouse] interval_s`` = 5 s; 3 topics, Pulsar-format entries in every
codec) for ``--seconds``, then reads, per topic, every committed segment's ``offloadedTimestamp``
from the managed ledger and every table snapshot's commit time and ``offloadd.last-position``.
A segment is visible in the first snapshot whose last position reaches its end; lag = snapshot
time − segment commit time. Prints p50/p99/max as JSON, plus the projection's throughput (rows
per second of follower time is not separable here, so rows and wall time are reported).

    .venv/bin/python bench/lakehouse_lag.py [--seconds 90] [--rate 1000000] [--topics 3]
        [--transactions] [--schema avro|json]

``--schema``: messages of a registered schema (``standalone --schema``), projected into typed
columns; with ``--transactions`` they are written inside transactions (read-committed tables).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop

from offloadd import config
from offloadd.lakehouse.tables import LAST_POSITION, open_catalog
from offloadd.metadata import managed_ledger
from offloadd.metadata.embedded import EmbeddedMetadataStore
from offloadd.model import Position, TopicName, catalog


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def segments(root: Path, topic: TopicName) -> list[tuple[Position, int]]:
    md = await EmbeddedMetadataStore.open(str(root / "data" / "metadata"))
    try:
        info, _ = await managed_ledger.load(md, topic.managed_ledger)
    finally:
        await md.close()
    return [(s.end, s.offloaded_ms) for s in catalog.segments(info) if s.complete]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=90)
    ap.add_argument("--rate", type=float, default=1_000_000)
    ap.add_argument("--topics", type=int, default=3)
    ap.add_argument("--transactions", action="store_true",
                    help="transactional messages, aborts and markers (read-committed tables)")
    ap.add_argument("--schema", choices=("avro", "json"),
                    help="messages of a registered schema: typed columns in the tables")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="offloadd-lakelag-") as d:
        root = Path(d)
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "offloadd", "standalone", "--json",
                              "--duration",
                              str(a.seconds), "--rate", str(a.rate), "--topics", str(a.topics),
                              *(["--transactions"] if a.transactions else []),
                              *(["--schema", a.schema] if a.schema else [])],
                             cwd=root, capture_output=True, text=True, check=True,
                             env={**os.environ, "OFFLOADD_METRICS__ENABLED": "false"})
        wall = time.monotonic() - t0
        summary = json.loads(out.stdout.strip().splitlines()[-1])
        cwd = os.getcwd()
        os.chdir(root)
        try:
            cat = open_catalog(config.load(None, lakehouse__path=str(root / "data" /
                                                                     "lakehouse")),
                               create=False)
        finally:
            os.chdir(cwd)
        lags: list[float] = []
        rows = 0
        snapshots = 0
        for i in range(a.topics):
            topic = TopicName.parse(f"persistent://public/default/topic-{i}")
            table = cat.load_table((topic.tenant, topic.namespace, topic.local))
            snaps = sorted((s.timestamp_ms, Position.parse(s.summary[LAST_POSITION]))
                           for s in table.metadata.snapshots
                           if s.summary is not None and s.summary[LAST_POSITION])
            snapshots += len(snaps)
            cur = table.current_snapshot()
            rows += int(cur.summary["total-records"]) if cur and cur.summary else 0
            for end, committed_ms in uvloop.run(segments(root, topic)):
                seen = next((ts for ts, pos in snaps if pos >= end), None)
                if seen is None:
                    raise SystemExit(f"{topic}: segment ending {end} never became visible")
                lags.append(max(0.0, (seen - committed_ms) / 1000))
    result: dict[str, Any] = {
        "seconds": a.seconds, "rate_bytes_per_s": a.rate, "topics": a.topics,
        "transactions": a.transactions, "schema": a.schema,
        "segments": len(lags), "table_snapshots": snapshots, "rows": rows,
        "messages_sent": sum(t["sent"]["messages"] for t in summary["topics"].values()),
        # read-committed: what the tables must hold (rows above)
        "visible_messages": sum(t["sent"].get("visible_messages", t["sent"]["messages"])
                                for t in summary["topics"].values()),
        "wall_s": round(wall, 1),
        "lag_p50_s": round(percentile(lags, 0.50), 2),
        "lag_p99_s": round(percentile(lags, 0.99), 2),
        "lag_max_s": round(max(lags), 2),
        "goal_p99_s": 30,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
