"""Prometheus metrics, reached only through probe objects.

Business code asks for a probe and reports what happened, in natural units (bytes, seconds)::

    probe = metrics.topic("public/default", "persistent://public/default/orders")
    probe.offload_bytes(nbytes, entries)
    probe.upload_latency(seconds)

Registration, label values, unit conversion and rate windows live here and nowhere else
(STYLE.md item 11). Everything is registered in the :class:`Metrics` object's own
``CollectorRegistry``, never the process-global one, so two daemons or tests in one process do
not collide. ``docs/metrics.md`` is the operator's table of every series.

Two families of names
---------------------
``brk_ledgeroffloader_*``
    Apache Pulsar's offloader series, with Pulsar's types, units and labels (``namespace`` =
    ``tenant/ns``, ``topic`` = ``persistent://tenant/ns/name``), so existing Pulsar dashboards
    keep working. Pulsar builds them with the Prometheus Java client 0.15+ (Pulsar 2.11 and
    later), which exposes a counter ``X`` as the series ``X_total`` (plus ``X_created``); the
    Python client does the same, so the series names on the wire are identical. Pulsar 2.10
    exposed the counters without ``_total``; dashboards from that release need the suffix
    added. Pulsar's latency summaries are in microseconds and carry no quantiles (``_count``
    and ``_sum`` only); its ``*_rate`` gauges are bytes per second averaged over a stats period
    (60 s here, the default of Pulsar's ``managedLedgerStatsPeriodSeconds``), recomputed when
    scraped after the period has passed. PIP-211's three series follow the same conventions.
``offloadd_*``
    Ours, following Prometheus conventions: counters end in ``_total``, durations are
    histograms in ``_seconds``, sizes are in ``_bytes``.

Labels only ever carry topic and namespace names and a few fixed enumerations (``state``,
``status``, ``store``, ``object``, ``version``): no endpoint, bucket, path or credential.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, Summary
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from offloadd import __version__
from offloadd.errors import ConfigError
from offloadd.model import TopicName

__all__ = ["CIRCUIT_STATES", "SEGMENT_STATES", "Metrics", "TopicProbe", "namespace_of"]

SEGMENT_STATES = ("assigned", "offloaded", "failed")
CIRCUIT_STATES = ("closed", "open", "half_open")

_TOPIC_LABELS = ("namespace", "topic")
_DELETE_STATUSES = ("succeed", "failed")  # Pulsar's label values
_MICROS = 1_000_000.0
_UNKNOWN = "unknown"  # Pulsar's label value when a topic name does not parse

# Block uploads range from a few ms (small blocks, nearby store) to minutes (64 MiB over a slow
# link); reads of one block or index are usually well under a second.
_UPLOAD_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_READ_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

_DEFAULT_RATE_PERIOD = 60.0

_M = TypeVar("_M", bound=MetricWrapperBase)


def namespace_of(topic: str) -> str:
    """The ``namespace`` label for a topic name (``tenant/ns``), or ``unknown`` like Pulsar."""
    try:
        return TopicName.parse(topic).ns
    except ConfigError:
        return _UNKNOWN


@dataclass
class _RateWindow:
    offload_total: int = 0
    read_total: int = 0
    since: float = 0.0
    offload_mark: int = 0
    read_mark: int = 0
    offload_rate: float = 0.0
    read_rate: float = 0.0


class _PulsarRates(Collector):
    """``brk_ledgeroffloader_offload_rate`` and ``_read_offload_rate``: bytes/s per period.

    Pulsar resets byte adders every stats period and publishes bytes/period as a gauge. Here the
    running totals stay, and a scrape that finds the period over publishes the average since
    the previous mark; scrapes inside a period see the last published value. Probes update it
    from the event loop while /metrics may collect from a worker thread, hence the lock.
    """

    def __init__(self, clock: Callable[[], float], period: float) -> None:
        self._clock = clock
        self._period = period
        self._lock = threading.Lock()
        self._windows: dict[tuple[str, str], _RateWindow] = {}

    def add(self, key: tuple[str, str], *, offload: int = 0, read: int = 0) -> None:
        with self._lock:
            window = self._windows.get(key)
            if window is None:
                window = self._windows[key] = _RateWindow(since=self._clock())
            window.offload_total += offload
            window.read_total += read

    def forget(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._windows.pop(key, None)

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        now = self._clock()
        with self._lock:
            for window in self._windows.values():
                elapsed = now - window.since
                if elapsed >= self._period:
                    window.offload_rate = (window.offload_total - window.offload_mark) / elapsed
                    window.read_rate = (window.read_total - window.read_mark) / elapsed
                    window.offload_mark = window.offload_total
                    window.read_mark = window.read_total
                    window.since = now
            rows = [(k, w.offload_rate, w.read_rate) for k, w in self._windows.items()]
        offload, read = self._families()
        for key, offload_rate, read_rate in rows:
            offload.add_metric(list(key), offload_rate)
            read.add_metric(list(key), read_rate)
        return [offload, read]

    @staticmethod
    def _families() -> list[GaugeMetricFamily]:
        return [
            GaugeMetricFamily(
                "brk_ledgeroffloader_offload_rate",
                "Bytes per second offloaded to the tier, averaged over the stats period.",
                labels=_TOPIC_LABELS,
            ),
            GaugeMetricFamily(
                "brk_ledgeroffloader_read_offload_rate",
                "Bytes per second read back from the tier, averaged over the stats period.",
                labels=_TOPIC_LABELS,
            ),
        ]


class TopicProbe:
    """Everything one topic reports. Get it from :meth:`Metrics.topic`; cheap to call often."""

    def __init__(self, metrics: Metrics, namespace: str, topic: str) -> None:
        self._m = metrics
        self.namespace = namespace
        self.topic = topic
        self._key = (namespace, topic)
        # Children are cached here (a dict hit instead of prometheus_client's label lookup on
        # every call) and remembered, so forget() can remove exactly this topic's series.
        self._children: dict[tuple[int, tuple[str, ...]], MetricWrapperBase] = {}
        self._owned: list[tuple[MetricWrapperBase, tuple[str, ...]]] = []
        # Counters exist from the start at 0, so rate() and "no progress" alerts work for a
        # topic that has not offloaded anything yet.
        for counter in (
            metrics._offload_error,
            metrics._read_offload_error,
            metrics._read_rereads,
            metrics._write_storage_error,
            metrics._read_bytes,
            metrics._offload_limited,
            metrics._offloaded_bytes,
            metrics._offloaded_entries,
            metrics._throttle_wait,
            # at 0 from the start, so increase() sees the first loss (OffloaddDataLost)
            metrics._ledgers_lost,
        ):
            self._child(counter)
        for status in _DELETE_STATUSES:
            self._child(metrics._delete_ops, status)
        self._child(metrics._upload_seconds)

    def _child(self, metric: _M, *extra: str) -> _M:
        key = (id(metric), extra)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*self._key, *extra)
            self._owned.append((metric, extra))
        return cast(_M, child)

    def _forget(self) -> None:
        for metric, extra in self._owned:
            metric.remove(*self._key, *extra)
        self._owned.clear()
        self._children.clear()

    # -- writing to the tier --------------------------------------------------------------------

    def offload_bytes(self, nbytes: int, entries: int = 0) -> None:
        """Bytes (and entries) written to the tier. The topic task reports each data block's
        bytes as it lands (so rates move smoothly) and the entries in
        :meth:`segment_committed`."""
        self._child(self._m._offloaded_bytes).inc(nbytes)
        if entries:
            self._child(self._m._offloaded_entries).inc(entries)
        self._m._rates.add(self._key, offload=nbytes)

    def offload_error(self) -> None:
        """An offload attempt (a segment) failed."""
        self._child(self._m._offload_error).inc()

    def write_storage_error(self) -> None:
        """A write to the blob store failed."""
        self._child(self._m._write_storage_error).inc()

    def upload_latency(self, seconds: float) -> None:
        """One object or part upload finished after ``seconds``."""
        self._child(self._m._upload_seconds).observe(seconds)

    def ledger_offload_time(self, seconds: float) -> None:
        """A segment (PIP-211: a ledger) took ``seconds`` from start to commit."""
        self._child(self._m._offload_time).observe(seconds * _MICROS)

    def ledger_offload_limited(self) -> None:
        """The offload was held back once; :meth:`throttle_wait` already counts throttle waits."""
        self._child(self._m._offload_limited).inc()

    def ledger_reading_max_bytes(self, nbytes: int) -> None:
        """The most bytes this topic may read from its ledger in one go."""
        self._child(self._m._reading_max_bytes).set(nbytes)

    def segment_committed(self, entries: int, nbytes: int, seconds: float) -> None:
        """A segment was committed; ``seconds`` from closing it to its commit (PIP-211's
        ledger offload time). Its bytes were already counted block by block
        (:meth:`offload_bytes`); its entries are counted here."""
        if entries:
            self._child(self._m._offloaded_entries).inc(entries)
        self.ledger_offload_time(seconds)

    def metadata_write(self) -> None:
        """One compare-and-set write on this topic's behalf."""
        self._m.metadata_writes()

    def data_lost(self, ledger_id: int) -> None:
        """A ledger vanished from the source before it was offloaded (retention)."""
        self._child(self._m._ledgers_lost).inc()

    def throttle_wait(self, seconds: float) -> None:
        """Report each throttle acquire's wait; a non-zero wait also counts as 'limited'."""
        self._child(self._m._throttle_wait).inc(seconds)
        if seconds > 0:
            self._child(self._m._offload_limited).inc()

    # -- reading ----------------------------------------------------------------------------

    def read_offload(self, nbytes: int) -> None:
        """Bytes read back from the tier."""
        self._child(self._m._read_bytes).inc(nbytes)
        self._m._rates.add(self._key, read=nbytes)

    def read_error(self) -> None:
        """A read from the tier failed."""
        self._child(self._m._read_offload_error).inc()

    def reread(self) -> None:
        """An answer from the tier failed its checks and is read again (damage in transit is
        retried before an object is called corrupt)."""
        self._child(self._m._read_rereads).inc()

    def index_read(self, seconds: float) -> None:
        """An index object was fetched and parsed in ``seconds``."""
        self._child(self._m._index_latency).observe(seconds * _MICROS)
        self._child(self._m._read_seconds, "index").observe(seconds)

    def data_read(self, seconds: float) -> None:
        """A ranged read of data blocks took ``seconds``."""
        self._child(self._m._data_latency).observe(seconds * _MICROS)
        self._child(self._m._read_seconds, "data").observe(seconds)

    def ledger_read(self, seconds: float) -> None:
        """Reading entries from the source ledger (to offload them) took ``seconds``."""
        self._child(self._m._ledger_latency).observe(seconds * _MICROS)
        self._child(self._m._source_read_seconds).observe(seconds)

    # -- state --------------------------------------------------------------------------------

    def delete_op(self, succeeded: bool = True) -> None:
        """One deletion of offloaded objects was attempted."""
        self._child(self._m._delete_ops, "succeed" if succeeded else "failed").inc()

    def segment_states(self, assigned: int, offloaded: int, failed: int) -> None:
        """How many of this topic's segments are in each state right now."""
        for state, n in zip(SEGMENT_STATES, (assigned, offloaded, failed), strict=True):
            self._child(self._m._segments, state).set(n)

    def lag(self, entries: int, nbytes: int, seconds: float) -> None:
        """How far the tier trails the topic: from the last committed position to the source's
        LAC (measured by the daemon's lag loop, :mod:`offloadd.offload.lag`)."""
        self._child(self._m._lag_entries).set(entries)
        self._child(self._m._lag_bytes).set(nbytes)
        self._child(self._m._lag_seconds).set(seconds)

    def last_offloaded(self, ledger: int, entry: int) -> None:
        """The last position committed to the tier."""
        self._child(self._m._last_ledger).set(ledger)
        self._child(self._m._last_entry).set(entry)

    def last_commit_time(self, seconds: float) -> None:
        """Wall-clock time (seconds since the epoch) of the topic's last commit to the tier."""
        self._child(self._m._last_commit_ts).set(seconds)


class Metrics:
    """The process's registry and its probes.

    ``clock`` and ``rate_period`` drive Pulsar's ``*_rate`` gauges (see :class:`_PulsarRates`).
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        rate_period: float = _DEFAULT_RATE_PERIOD,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._topics: dict[tuple[str, str], TopicProbe] = {}

        # Pulsar's offloader series (LedgerOffloaderStatsImpl) and PIP-211's.
        self._offload_error = Counter(
            "brk_ledgeroffloader_offload_error",
            "Failed offload attempts.",
            _TOPIC_LABELS,
            registry=r,
        )
        self._read_offload_error = Counter(
            "brk_ledgeroffloader_read_offload_error",
            "Failed reads from the tier.",
            _TOPIC_LABELS,
            registry=r,
        )
        self._read_rereads = Counter(
            "offloadd_read_rereads",
            "Answers from the tier that failed their checks and were read again.",
            _TOPIC_LABELS,
            registry=r,
        )
        self._write_storage_error = Counter(
            "brk_ledgeroffloader_write_storage_error",
            "Failed writes to the blob store.",
            _TOPIC_LABELS,
            registry=r,
        )
        self._read_bytes = Counter(
            "brk_ledgeroffloader_read_bytes",
            "Bytes read back from the tier.",
            _TOPIC_LABELS,
            registry=r,
        )
        self._index_latency = Summary(
            "brk_ledgeroffloader_read_offload_index_latency",
            "Latency of reading an index object from the tier, in microseconds.",
            _TOPIC_LABELS,
            registry=r,
        )
        self._data_latency = Summary(
            "brk_ledgeroffloader_read_offload_data_latency",
            "Latency of reading data blocks from the tier, in microseconds.",
            _TOPIC_LABELS,
            registry=r,
        )
        self._ledger_latency = Summary(
            "brk_ledgeroffloader_read_ledger_latency",
            "Latency of reading entries from the source ledger, in microseconds.",
            _TOPIC_LABELS,
            registry=r,
        )
        self._delete_ops = Counter(
            "brk_ledgeroffloader_delete_offload_ops",
            "Deletions of offloaded objects, by outcome.",
            (*_TOPIC_LABELS, "status"),
            registry=r,
        )
        self._offload_limited = Counter(
            "brk_ledgeroffloader_ledger_offload_limited",
            "Times the offload had to wait for the broker-wide byte budget (PIP-211).",
            _TOPIC_LABELS,
            registry=r,
        )
        self._offload_time = Summary(
            "brk_ledgeroffloader_ledger_offload_time",
            "Time from starting a segment's offload to its commit, in microseconds (PIP-211).",
            _TOPIC_LABELS,
            registry=r,
        )
        self._reading_max_bytes = Gauge(
            "brk_ledgeroffloader_ledger_reading_max_bytes",
            "Most bytes the topic may read from its ledger in one go (PIP-211).",
            _TOPIC_LABELS,
            registry=r,
        )
        self._rates = _PulsarRates(clock, rate_period)
        r.register(self._rates)

        # Ours.
        self._offloaded_bytes = Counter(
            "offloadd_offloaded_bytes",
            "Bytes written to the tier's data objects, counted as each block lands.",
            _TOPIC_LABELS,
            registry=r,
        )
        self._offloaded_entries = Counter(
            "offloadd_offloaded_entries",
            "Entries committed to the tier.",
            _TOPIC_LABELS,
            registry=r,
        )
        self._lag_entries = Gauge(
            "offloadd_lag_entries",
            "Entries confirmed in the topic (up to its LAC) but not yet committed to the tier.",
            _TOPIC_LABELS,
            registry=r,
        )
        self._lag_bytes = Gauge(
            "offloadd_lag_bytes",
            "Bytes confirmed in the topic but not yet committed to the tier.",
            _TOPIC_LABELS,
            registry=r,
        )
        self._lag_seconds = Gauge(
            "offloadd_lag_seconds",
            "Age of the oldest entry not yet committed to the tier (an upper bound; 0 when "
            "nothing is uncommitted).",
            _TOPIC_LABELS,
            registry=r,
        )
        self._segments = Gauge(
            "offloadd_segments",
            "Offload segments by state.",
            (*_TOPIC_LABELS, "state"),
            registry=r,
        )
        self._last_ledger = Gauge(
            "offloadd_last_offloaded_ledger",
            "Ledger id of the last position committed to the tier.",
            _TOPIC_LABELS,
            registry=r,
        )
        self._last_entry = Gauge(
            "offloadd_last_offloaded_entry",
            "Entry id of the last position committed to the tier.",
            _TOPIC_LABELS,
            registry=r,
        )
        self._last_commit_ts = Gauge(
            "offloadd_last_commit_timestamp_seconds",
            "Unix time of the topic's last commit to the tier (from the catalog after a "
            "restart).",
            _TOPIC_LABELS,
            registry=r,
        )
        self._upload_seconds = Histogram(
            "offloadd_upload_duration_seconds",
            "Duration of one object or part upload.",
            _TOPIC_LABELS,
            buckets=_UPLOAD_BUCKETS,
            registry=r,
        )
        self._read_seconds = Histogram(
            "offloadd_read_duration_seconds",
            "Duration of one read from the tier, by object kind (index or data).",
            (*_TOPIC_LABELS, "object"),
            buckets=_READ_BUCKETS,
            registry=r,
        )
        self._source_read_seconds = Histogram(
            "offloadd_source_read_duration_seconds",
            "Duration of one read of entries from the source ledger.",
            _TOPIC_LABELS,
            buckets=_READ_BUCKETS,
            registry=r,
        )
        self._throttle_wait = Counter(
            "offloadd_throttle_wait_seconds",
            "Seconds spent waiting for the broker-wide byte budget (summed over concurrent waits).",
            _TOPIC_LABELS,
            registry=r,
        )
        self._throttle_limit = Gauge(
            "offloadd_throttle_limit_bytes_per_second",
            "The broker-wide offload byte budget; 0 means unlimited.",
            registry=r,
        )
        self._buffer_bytes = Gauge(
            "offloadd_buffer_bytes",
            "Bytes held in the offload buffer.",
            registry=r,
        )
        self._buffer_capacity = Gauge(
            "offloadd_buffer_capacity_bytes",
            "Capacity of the offload buffer.",
            registry=r,
        )
        self._circuit = Gauge(
            "offloadd_store_circuit_state",
            "1 for the store's current circuit-breaker state, 0 for the others.",
            ("store", "state"),
            registry=r,
        )
        self._circuit_states: dict[str, set[str]] = {}
        self._ledgers_lost = Counter(
            "offloadd_ledgers_lost_to_retention",
            "Ledgers deleted from the source before they were offloaded (data lost).",
            _TOPIC_LABELS,
            registry=r,
        )
        self._blobstore_requests = Counter(
            "offloadd_blobstore_requests",
            "Requests the blob-store driver sent, by S3 operation and result (ok, throttled, "
            "server, client, io, timeout).",
            ("driver", "op", "result"),
            registry=r,
        )
        self._metadata_writes = Counter(
            "offloadd_metadata_writes",
            "Compare-and-set writes to the metadata store.",
            registry=r,
        )
        topics = Gauge(
            "offloadd_topics",
            "Topics with a probe (topics this process offloads or reads).",
            registry=r,
        )
        topics.set_function(lambda: len(self._topics))
        Info("offloadd_build", "offloadd build.", registry=r).info({"version": __version__})

    # -- probes -------------------------------------------------------------------------------

    def topic(self, namespace: str, topic: str) -> TopicProbe:
        """The probe for one topic (one per topic; repeated calls return the same probe)."""
        key = (namespace, topic)
        probe = self._topics.get(key)
        if probe is None:
            probe = self._topics[key] = TopicProbe(self, namespace, topic)
        return probe

    def topic_named(self, topic: str) -> TopicProbe:
        """The probe for a full topic name; the namespace label is derived from it."""
        return self.topic(namespace_of(topic), topic)

    def forget_topic(self, namespace: str, topic: str) -> None:
        """Drop every series of a topic this process no longer serves."""
        key = (namespace, topic)
        probe = self._topics.pop(key, None)
        if probe is not None:
            probe._forget()
            self._rates.forget(key)

    def buffer(self, bytes_used: int, cap: int) -> None:
        """Offload buffer fill and capacity."""
        self._buffer_bytes.set(bytes_used)
        self._buffer_capacity.set(cap)

    def throttle_limit(self, bytes_per_second: float) -> None:
        """The configured broker-wide budget (0 = unlimited); set at start and on reload."""
        self._throttle_limit.set(bytes_per_second)

    def throttle_wait(self, topic: str, seconds: float) -> None:
        """Same as ``topic_named(topic).throttle_wait(seconds)``."""
        self.topic_named(topic).throttle_wait(seconds)

    def store_circuit(self, state_name: str, store: str = "blobstore") -> None:
        """The circuit breaker of ``store`` is now in ``state_name``."""
        known = self._circuit_states.setdefault(store, set(CIRCUIT_STATES))
        known.add(state_name)
        for state in known:
            self._circuit.labels(store, state).set(1 if state == state_name else 0)

    def blobstore_request(self, driver: str, op: str, result: str) -> None:
        """One request the blob-store driver sent (``offloadd.blobstore.requests``)."""
        self._blobstore_requests.labels(driver, op, result).inc()

    def metadata_writes(self, count: int = 1) -> None:
        """Writes (compare-and-set) to the metadata store."""
        self._metadata_writes.inc(count)

    # -- exposition ---------------------------------------------------------------------------

    def exposition(self, accept: str | None = None) -> tuple[bytes, str]:
        """The registry rendered for a scraper's ``Accept`` header: (body, content type).

        Safe to call from a worker thread.
        """
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type
