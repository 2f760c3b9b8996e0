"""What one ``/metrics`` scrape costs at many topics, in both ``[metrics] topic_level`` modes.

Builds a :class:`~offloadd.metrics.Metrics` for N synthetic topics spread over 10 namespaces,
where every topic has reported every probe call at least once (the worst case: a topic with
traffic, errors, reads and deletions), then renders it as Prometheus text and as OpenMetrics.

:func:`synthetic` is the building block ``bench/topic_scaling.py`` calls for its scrape-size
column; this script prints one JSON object per (topics, mode):

``text_bytes`` / ``openmetrics_bytes``
    one scrape's body in each format;
``samples``
    sample lines (each is a series Prometheus stores);
``series_per_topic``
    the most samples with one topic's ``topic`` label (0 when aggregated);
``build_s`` / ``scrape_s``
    seconds to create and feed the probes, and to render one text scrape.

Usage: ``python bench/metrics_scrape.py [--topics 1000 10000] [--namespaces 10] [--out FILE]``
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

from offloadd.metrics import Metrics, TopicProbe


def topic_names(topics: int, namespaces: int = 10) -> list[tuple[str, str]]:
    """(namespace, topic) for ``topics`` topics dealt round-robin over ``namespaces``."""
    out = []
    for i in range(topics):
        ns = f"tenant-{i % namespaces}/ns-{i % namespaces}"
        out.append((ns, f"persistent://{ns}/topic-{i:05d}"))
    return out


def report_all(p: TopicProbe, i: int = 0) -> None:
    """Every report a topic's probe takes, once (``i`` varies the positions and times)."""
    p.offload_bytes(4096 + i, entries=4)
    p.segment_committed(4, 4096, 0.5)
    p.offload_error()
    p.write_storage_error()
    p.upload_latency(0.2)
    p.ledger_offload_time(12.5)
    p.ledger_offload_limited()
    p.ledger_reading_max_bytes(1 << 20)
    p.throttle_wait(0.25)
    p.data_lost(1)
    p.read_offload(512)
    p.read_error()
    p.index_read(0.003)
    p.data_read(0.02)
    p.ledger_read(0.001)
    p.delete_op(True)
    p.delete_op(False)
    p.segment_states(1, 10, 0)
    p.lag(100, 1 << 20, 42.0)
    p.last_offloaded(7 + i, 99)
    p.last_commit_time(1.7e9 + i)
    p.metadata_write()


def synthetic(topics: int, namespaces: int = 10, topic_level: bool | None = None) -> Metrics:
    """A registry of ``topics`` topics that have each reported every probe call once."""
    m = Metrics(topic_level=topic_level)
    m.buffer(1 << 20, 1 << 28)
    m.throttle_limit(50_000_000)
    m.store_circuit("closed")
    m.store_circuit("closed", store="metadata")
    for op in ("PutObject", "UploadPart", "GetObject", "HeadObject"):
        m.blobstore_request("aws-s3", op, "ok")
    for i, (ns, topic) in enumerate(topic_names(topics, namespaces)):
        report_all(m.topic(ns, topic), i)
    return m


_TOPIC = re.compile(r'topic="([^"]*)"')


def measure(topics: int, namespaces: int, topic_level: bool | None) -> dict[str, Any]:
    t0 = time.perf_counter()
    m = synthetic(topics, namespaces, topic_level)
    t1 = time.perf_counter()
    text, _ = m.exposition()
    t2 = time.perf_counter()
    om, _ = m.exposition("application/openmetrics-text; version=1.0.0")
    lines = [ln for ln in text.decode().splitlines() if ln and not ln.startswith("#")]
    per_topic = Counter(t.group(1) for ln in lines if (t := _TOPIC.search(ln)))
    return {
        "topics": topics, "namespaces": namespaces,
        "topic_level": {None: "auto", True: "true", False: "false"}[topic_level],
        "topic_level_now": m.topic_level_now(),
        "text_bytes": len(text), "openmetrics_bytes": len(om), "samples": len(lines),
        "series_per_topic": max(per_topic.values(), default=0),
        "build_s": round(t1 - t0, 3), "scrape_s": round(t2 - t1, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topics", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--namespaces", type=int, default=10)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rows = [measure(n, args.namespaces, level)
            for n in args.topics for level in (True, False, None)]
    text = json.dumps(rows, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
