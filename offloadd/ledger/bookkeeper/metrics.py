"""Counters of the BookKeeper source, exported to Prometheus through a custom collector.

Business code calls the probe methods (``entries_read``, ``failover``, ...); nothing here times
anything. :meth:`BookKeeperMetrics.snapshot` is a plain dict for status output and tests;
:meth:`BookKeeperMetrics.register` adds the collector to a ``prometheus_client`` registry:

==================================================  =======  =======================================
``offloadd_bookkeeper_entries_read_total``          counter  per ``bookie``
``offloadd_bookkeeper_bytes_read_total``            counter  payload bytes, per ``bookie``
``offloadd_bookkeeper_read_latency_seconds``        summary  per ``bookie`` (``_sum``, ``_count``)
``offloadd_bookkeeper_read_retries_total``          counter  reads re-sent after a failure
``offloadd_bookkeeper_read_failovers_total``        counter  per ``bookie`` that failed a read
``offloadd_bookkeeper_read_errors_total``           counter  per ``bookie`` and ``reason``
``offloadd_bookkeeper_digest_errors_total``         counter  per ``bookie`` (corrupt replicas)
``offloadd_bookkeeper_pending_reads``               gauge    per ``bookie``
``offloadd_bookkeeper_bookie_slow``                 gauge    1 while a bookie is judged slow
``offloadd_bookkeeper_lac_lag_entries``             gauge    per ``topic``: LAC − last entry read
``offloadd_bookkeeper_data_lost_entries_total``     counter  per ``topic``: lost to retention
``offloadd_bookkeeper_data_lost_ledgers_total``     counter  per ``topic``
``offloadd_bookkeeper_long_polls_total``            counter  LAC long polls sent
``offloadd_bookkeeper_long_poll_failures_total``    counter  long polls that failed: the tail was
                                                             then polled every 0.5 s instead
``offloadd_bookkeeper_pauses_total``                counter  stalls of this process (a clock jump
                                                             seen while waiting on a bookie): the
                                                             wait went on, no bookie was blamed
``offloadd_bookkeeper_quarantines_total``           counter  per ``bookie`` and ``reason``: bookies
                                                             put in quarantine (asked last)
``offloadd_bookkeeper_bookie_protocol``             gauge    1 per ``bookie``, labelled with the
                                                             protocol of its bulk ``reads`` (v2, v3)
                                                             and ``batched`` (yes, no, unknown, off)
==================================================  =======  =======================================
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

__all__ = ["BookKeeperMetrics"]

_PREFIX = "offloadd_bookkeeper_"


class BookKeeperMetrics:
    def __init__(self) -> None:
        self.entries: defaultdict[str, int] = defaultdict(int)
        self.bytes: defaultdict[str, int] = defaultdict(int)
        self.latency_sum: defaultdict[str, float] = defaultdict(float)
        self.latency_count: defaultdict[str, int] = defaultdict(int)
        self.retries = 0
        self.failovers: defaultdict[str, int] = defaultdict(int)
        self.errors: defaultdict[tuple[str, str], int] = defaultdict(int)
        self.digest_errors: defaultdict[str, int] = defaultdict(int)
        self.pending: dict[str, int] = {}
        self.slow: dict[str, bool] = {}
        self.lac_lag: dict[str, int] = {}
        self.lost_entries: defaultdict[str, int] = defaultdict(int)
        self.lost_ledgers: defaultdict[str, int] = defaultdict(int)
        self.long_polls = 0
        self.long_poll_failures = 0
        self.pauses = 0
        self.quarantines: defaultdict[tuple[str, str], int] = defaultdict(int)
        self.protocols: dict[str, tuple[str, str]] = {}

    # ---- probe ---------------------------------------------------------------------------
    def entries_read(self, bookie: str, count: int, nbytes: int, latency_sum_s: float) -> None:
        self.entries[bookie] += count
        self.bytes[bookie] += nbytes
        self.latency_sum[bookie] += latency_sum_s
        self.latency_count[bookie] += count

    def retry(self, count: int = 1) -> None:
        self.retries += count

    def failover(self, bookie: str, reason: str) -> None:
        self.failovers[bookie] += 1
        self.errors[(bookie, reason)] += 1
        if reason == "digest":
            self.digest_errors[bookie] += 1

    def set_pending(self, bookie: str, n: int) -> None:
        self.pending[bookie] = n

    def set_slow(self, bookie: str, slow: bool) -> None:
        self.slow[bookie] = slow

    def set_lac_lag(self, topic: str, entries: int) -> None:
        self.lac_lag[topic] = max(entries, 0)

    def forget_topic(self, topic: str) -> None:
        """The topic is gone: drop its gauge (its loss counters stay, for alerts on them)."""
        self.lac_lag.pop(topic, None)

    def data_lost(self, topic: str, ledgers: int, entries: int) -> None:
        self.lost_ledgers[topic] += ledgers
        self.lost_entries[topic] += max(entries, 0)

    def long_poll(self) -> None:
        self.long_polls += 1

    def long_poll_failed(self) -> None:
        self.long_poll_failures += 1

    def paused(self) -> None:
        self.pauses += 1

    def quarantine(self, bookie: str, reason: str) -> None:
        self.quarantines[(bookie, reason)] += 1

    def bookie_protocol(self, bookie: str, reads: str, batched: str) -> None:
        self.protocols[bookie] = (reads, batched)

    # ---- export --------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        return {
            "entries_read": dict(self.entries),
            "bytes_read": dict(self.bytes),
            "read_latency_avg_s": {b: self.latency_sum[b] / n
                                   for b, n in self.latency_count.items() if n},
            "retries": self.retries,
            "failovers": dict(self.failovers),
            "errors": {f"{b} {r}": n for (b, r), n in self.errors.items()},
            "digest_errors": dict(self.digest_errors),
            "pending": dict(self.pending),
            "slow": [b for b, s in self.slow.items() if s],
            "lac_lag": dict(self.lac_lag),
            "data_lost_entries": dict(self.lost_entries),
            "data_lost_ledgers": dict(self.lost_ledgers),
            "long_polls": self.long_polls,
            "long_poll_failures": self.long_poll_failures,
            "pauses": self.pauses,
            "quarantines": {f"{b} {r}": n for (b, r), n in self.quarantines.items()},
            "protocols": {b: {"reads": r, "batched": x} for b, (r, x) in self.protocols.items()},
        }

    def collect(self) -> Iterator[Any]:
        """``prometheus_client`` custom-collector protocol."""
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            SummaryMetricFamily,
        )

        def by(name: str, doc: str, label: str, values: dict[str, int] | dict[str, float],
               gauge: bool = False) -> Any:
            fam = (GaugeMetricFamily if gauge else CounterMetricFamily)(
                _PREFIX + name, doc, labels=[label])
            for k, v in sorted(values.items()):
                fam.add_metric([k], float(v))
            return fam

        yield by("entries_read", "Entries read from each bookie", "bookie", dict(self.entries))
        yield by("bytes_read", "Payload bytes read from each bookie", "bookie", dict(self.bytes))
        lat = SummaryMetricFamily(_PREFIX + "read_latency_seconds",
                                  "Bookie read latency", labels=["bookie"])
        for b in sorted(self.latency_count):
            lat.add_metric([b], self.latency_count[b], self.latency_sum[b])
        yield lat
        retries = CounterMetricFamily(_PREFIX + "read_retries", "Reads re-sent after a failure")
        retries.add_metric([], float(self.retries))
        yield retries
        yield by("read_failovers", "Reads that failed over to another replica", "bookie",
                 dict(self.failovers))
        errs = CounterMetricFamily(_PREFIX + "read_errors", "Failed bookie reads by reason",
                                   labels=["bookie", "reason"])
        for (b, r), n in sorted(self.errors.items()):
            errs.add_metric([b, r], float(n))
        yield errs
        yield by("digest_errors", "Entries whose digest did not match", "bookie",
                 dict(self.digest_errors))
        yield by("pending_reads", "Reads in flight", "bookie", dict(self.pending), gauge=True)
        yield by("bookie_slow", "1 while the bookie is judged slow", "bookie",
                 {b: int(s) for b, s in self.slow.items()}, gauge=True)
        yield by("lac_lag_entries", "Entries between the reader and the last-add-confirmed",
                 "topic", dict(self.lac_lag), gauge=True)
        yield by("data_lost_entries", "Entries deleted by Pulsar before offload", "topic",
                 dict(self.lost_entries))
        yield by("data_lost_ledgers", "Ledgers deleted by Pulsar before offload", "topic",
                 dict(self.lost_ledgers))
        polls = CounterMetricFamily(_PREFIX + "long_polls", "LAC long polls sent")
        polls.add_metric([], float(self.long_polls))
        yield polls
        failed = CounterMetricFamily(_PREFIX + "long_poll_failures", "LAC long polls that "
                                     "failed (the tail is then re-read every 0.5 s)")
        failed.add_metric([], float(self.long_poll_failures))
        yield failed
        pauses = CounterMetricFamily(_PREFIX + "pauses", "Stalls of this process seen while "
                                     "waiting on bookies (not blamed on them)")
        pauses.add_metric([], float(self.pauses))
        yield pauses
        quar = CounterMetricFamily(_PREFIX + "quarantines", "Bookies put in quarantine (asked "
                                   "last) after a failure, by reason",
                                   labels=["bookie", "reason"])
        for (b, r), n in sorted(self.quarantines.items()):
            quar.add_metric([b, r], float(n))
        yield quar
        proto = GaugeMetricFamily(_PREFIX + "bookie_protocol", "How bulk reads reach each "
                                  "bookie: protocol v2 or v3, batched reads or not",
                                  labels=["bookie", "reads", "batched"])
        for b, (r, x) in sorted(self.protocols.items()):
            proto.add_metric([b, r, x], 1.0)
        yield proto

    def describe(self) -> list[Any]:
        return []  # collected on every scrape; no fixed description needed

    def register(self, registry: Any) -> None:
        registry.register(self)
