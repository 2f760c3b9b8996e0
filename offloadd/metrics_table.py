"""Every series offloadd serves, declared once: name, type, labels, help and level.

:mod:`offloadd.metrics` builds its storage and its exposition from :data:`TABLE`; nothing is
registered by hand. ``docs/metrics.md`` is the operator's version of this table.

Levels
------
``TOPIC``
    Per topic (labels ``namespace``, ``topic``) when ``[metrics] topic_level`` is on; summed
    (counters and most gauges) or maxed (``agg="max"``) per namespace when it is off. A topic's
    series go when the process stops serving the topic; per namespace, its counted totals stay.
``NAMESPACE``
    Always per namespace (label ``namespace``), in both modes: every latency distribution
    (their buckets are what makes per-topic series expensive), and the series an operator
    reads per namespace anyway (reads of the tier, deletions, segment counts).
``PROCESS``
    One per process, with their own labels.

Pulsar's ``exposeTopicLevelMetricsInPrometheus=false`` does the same: its offloader series keep
their names and lose the ``topic`` label.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

__all__ = ["TABLE", "Kind", "Level", "Series", "series"]


class Kind(enum.Enum):
    COUNTER = "counter"
    GAUGE = "gauge"
    SUMMARY = "summary"  # Pulsar's: _count and _sum only, no quantiles
    HISTOGRAM = "histogram"
    INFO = "info"


class Level(enum.Enum):
    TOPIC = "topic"
    NAMESPACE = "namespace"
    PROCESS = "process"


# Block uploads range from a few ms (small blocks, nearby store) to minutes (64 MiB over a slow
# link); reads of one block or index are usually well under a second.
UPLOAD_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
READ_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class Series:
    """One family. ``name`` is the registered name (a counter's samples add ``_total``).

    ``labels`` are the labels after ``namespace``/``topic``; for TOPIC and NAMESPACE levels at
    most one, whose fixed values are ``values`` (a slot each). ``agg``: how a gauge fed per
    topic becomes one value per namespace. ``rate_of``: a gauge that is the bytes/s of that
    counter over the stats period (Pulsar's ``*_rate``).
    """

    name: str
    kind: Kind
    level: Level
    help: str
    labels: tuple[str, ...] = ()
    values: tuple[str, ...] = ()
    agg: Literal["sum", "max"] = "sum"
    buckets: tuple[float, ...] = ()
    rate_of: str | None = None

    @property
    def width(self) -> int:
        """Slots one topic or namespace needs for it (one per fixed label value)."""
        return len(self.values) or 1


C, G, S, H = Kind.COUNTER, Kind.GAUGE, Kind.SUMMARY, Kind.HISTOGRAM
T, N, P = Level.TOPIC, Level.NAMESPACE, Level.PROCESS

TABLE: tuple[Series, ...] = (
    # -- Pulsar's offloader series (LedgerOffloaderStatsImpl) and PIP-211's ----------------------
    Series("brk_ledgeroffloader_offload_error", C, T, "Failed offload attempts."),
    Series("brk_ledgeroffloader_write_storage_error", C, T, "Failed writes to the blob store."),
    Series("brk_ledgeroffloader_ledger_offload_limited", C, T,
           "Times the offload had to wait for the broker-wide byte budget (PIP-211)."),
    Series("brk_ledgeroffloader_offload_rate", G, T,
           "Bytes per second offloaded to the tier, averaged over the stats period.",
           rate_of="offloadd_offloaded_bytes"),
    Series("brk_ledgeroffloader_read_offload_error", C, N, "Failed reads from the tier."),
    Series("brk_ledgeroffloader_read_bytes", C, N, "Bytes read back from the tier."),
    Series("offloadd_read_rereads", C, N, "Answers from the tier that failed their checks and "
           "were read again."),
    Series("brk_ledgeroffloader_read_offload_rate", G, N,
           "Bytes per second read back from the tier, averaged over the stats period.",
           rate_of="brk_ledgeroffloader_read_bytes"),
    Series("brk_ledgeroffloader_delete_offload_ops", C, N,
           "Deletions of offloaded objects, by outcome.", ("status",), ("succeed", "failed")),
    Series("brk_ledgeroffloader_ledger_reading_max_bytes", G, N,
           "Most bytes a topic of the namespace may read from its ledger in one go (PIP-211).",
           agg="max"),
    Series("brk_ledgeroffloader_read_offload_index_latency", S, N,
           "Latency of reading an index object from the tier, in microseconds."),
    Series("brk_ledgeroffloader_read_offload_data_latency", S, N,
           "Latency of reading data blocks from the tier, in microseconds."),
    Series("brk_ledgeroffloader_read_ledger_latency", S, N,
           "Latency of reading entries from the source ledger, in microseconds."),
    Series("brk_ledgeroffloader_ledger_offload_time", S, N,
           "Time from starting a segment's offload to its commit, in microseconds (PIP-211)."),
    # -- ours, per topic ---------------------------------------------------------------------------
    Series("offloadd_offloaded_bytes", C, T,
           "Bytes written to the tier's data objects, counted as each block lands."),
    Series("offloadd_offloaded_entries", C, T, "Entries committed to the tier."),
    Series("offloadd_throttle_wait_seconds", C, T,
           "Seconds spent waiting for the broker-wide byte budget (summed over concurrent waits)."),
    Series("offloadd_ledgers_lost_to_retention", C, T,
           "Ledgers deleted from the source before they were offloaded (data lost)."),
    Series("offloadd_lag_entries", G, T,
           "Entries confirmed in the topic (up to its LAC) but not yet committed to the tier."),
    Series("offloadd_lag_bytes", G, T, "Bytes confirmed in the topic but not yet committed to "
           "the tier."),
    Series("offloadd_lag_seconds", G, T,
           "Age of the oldest entry not yet committed to the tier (an upper bound; 0 when "
           "nothing is uncommitted). Per namespace: the oldest of its topics.", agg="max"),
    Series("offloadd_last_commit_timestamp_seconds", G, T,
           "Unix time of the topic's last commit to the tier (from the catalog after a "
           "restart). Per namespace: the latest of its topics.", agg="max"),
    Series("offloadd_last_offloaded_ledger", G, T,
           "Ledger id of the last position committed to the tier. Per namespace: the highest.",
           agg="max"),
    Series("offloadd_last_offloaded_entry", G, T,
           "Entry id of the last position committed to the tier. Per namespace: the highest.",
           agg="max"),
    # -- the lakehouse, per topic table (docs/lakehouse.md; fed by the follower after each pass)
    Series("offloadd_lakehouse_lag_entries", G, T,
           "Entries committed to the tier but not yet in the topic's Iceberg table."),
    Series("offloadd_lakehouse_lag_seconds", G, T,
           "Age of the oldest commit to the tier whose entries are not all in the table (0 "
           "when the table has everything). Per namespace: the oldest of its topics.",
           agg="max"),
    Series("offloadd_lakehouse_rows", G, T, "Rows in the topic's table (current snapshot)."),
    Series("offloadd_lakehouse_data_files", G, T,
           "Data files of the table's current snapshot."),
    Series("offloadd_lakehouse_last_snapshot_timestamp_seconds", G, T,
           "Unix time of the table's current snapshot. Per namespace: the latest.", agg="max"),
    # -- the lakehouse's read-committed projection, per namespace (docs/lakehouse.md) ------------
    Series("offloadd_lakehouse_hidden_messages", C, N,
           "Messages read-committed kept out of the tables, by reason: broker markers "
           "(entries), messages of aborted transactions, of transactions timed out.",
           ("reason",), ("marker", "aborted", "timed_out")),
    Series("offloadd_lakehouse_transactions", C, N,
           "Transactions the projection decided, by outcome.", ("outcome",),
           ("committed", "aborted", "timed_out")),
    Series("offloadd_lakehouse_held_entries", G, N,
           "Entries held back behind an undecided transaction (no commit or abort marker "
           "offloaded yet) after the follower's last pass."),
    # -- ours, per namespace -----------------------------------------------------------------------
    Series("offloadd_segments", G, N, "Offload segments by state.", ("state",),
           ("assigned", "offloaded", "failed")),
    Series("offloadd_upload_duration_seconds", H, N, "Duration of one object or part upload.",
           buckets=UPLOAD_BUCKETS),
    Series("offloadd_read_duration_seconds", H, N,
           "Duration of one read from the tier, by object kind (index or data).", ("object",),
           ("index", "data"), buckets=READ_BUCKETS),
    Series("offloadd_source_read_duration_seconds", H, N,
           "Duration of one read of entries from the source ledger.", buckets=READ_BUCKETS),
    # -- ours, per process -------------------------------------------------------------------------
    Series("offloadd_throttle_limit_bytes_per_second", G, P,
           "The broker-wide offload byte budget; 0 means unlimited."),
    Series("offloadd_buffer_bytes", G, P, "Bytes held in the offload buffer."),
    Series("offloadd_buffer_capacity_bytes", G, P, "Capacity of the offload buffer."),
    Series("offloadd_store_circuit_state", G, P,
           "1 for the store's current circuit-breaker state, 0 for the others.",
           ("store", "state")),
    Series("offloadd_conditional_writes", G, P,
           "1 while the tier refuses overwrites (the conditional-write fence is on), 0 while "
           "it is off or its probe has not been answered; absent with [blobstore] "
           "conditional_writes = \"off\".", ("store",)),
    Series("offloadd_blobstore_requests", C, P,
           "Requests the blob-store driver sent, by S3 operation and result (ok, throttled, "
           "server, client, io, timeout).", ("driver", "op", "result")),
    Series("offloadd_metadata_writes", C, P, "Compare-and-set writes to the metadata store."),
    Series("offloadd_topics", G, P, "Topics with a probe (topics this process offloads or "
           "reads)."),
    Series("offloadd_metrics_topic_level", G, P,
           "1 while topic series carry a topic label ([metrics] topic_level), 0 while they are "
           "aggregated per namespace."),
    Series("offloadd_build", Kind.INFO, P, "offloadd build.", ("version",)),
)

_BY_NAME = {s.name: s for s in TABLE}


def series(name: str) -> Series:
    """The declaration of ``name`` (a KeyError names a series that is not declared)."""
    return _BY_NAME[name]
