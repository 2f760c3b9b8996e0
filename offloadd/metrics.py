"""Prometheus metrics, reached only through probe objects.

Business code asks for a probe and reports what happened, in natural units (bytes, seconds)::

    probe = metrics.topic("public/default", "persistent://public/default/orders")
    probe.offload_bytes(nbytes, entries)
    probe.upload_latency(seconds)

The series are declared in :data:`offloadd.metrics_table.TABLE` (name, type, labels, help,
level); storage, label values, unit conversion, rate windows and the exposition follow from it
here and nowhere else. Everything is served by the :class:`Metrics` object's own
``CollectorRegistry``, never the process-global one, so two daemons or tests in one process do
not collide. ``docs/metrics.md`` is the operator's table of every series.

Two families of names
---------------------
``brk_ledgeroffloader_*``
    Apache Pulsar's offloader series, with Pulsar's types, units and labels (``namespace`` =
    ``tenant/ns``, ``topic`` = ``persistent://tenant/ns/name``), so existing Pulsar dashboards
    keep working. Pulsar builds them with the Prometheus Java client 0.15+ (Pulsar 2.11 and
    later), which exposes a counter ``X`` as the series ``X_total``; the series names on the
    wire are identical here. Pulsar 2.10 exposed the counters without ``_total``; dashboards
    from that release need the suffix added. Pulsar's latency summaries are in microseconds and
    carry no quantiles (``_count`` and ``_sum`` only); its ``*_rate`` gauges are bytes per
    second averaged over a stats period (60 s here, the default of Pulsar's
    ``managedLedgerStatsPeriodSeconds``), recomputed when scraped after the period has passed.
``offloadd_*``
    Ours, following Prometheus conventions: counters end in ``_total``, durations are
    histograms in ``_seconds``, sizes are in ``_bytes``.

The topic-level switch
----------------------
With ``topic_level`` on, TOPIC-level series carry ``namespace`` and ``topic`` (14 series per
topic); off, they are summed (or maxed) per namespace and no series has a ``topic`` label.
Latency distributions are per namespace in both modes. ``None`` ("auto") decides at each
scrape: per topic while fewer than :data:`AUTO_TOPIC_LIMIT` topics are served. Every topic's
values are kept the same way in both modes (a few floats per topic, no Prometheus child
objects), so the mode is only a view and may change between scrapes; counters of topics that
went away stay in their namespace's totals, so the aggregated counters never go down.

Labels only ever carry topic and namespace names and a few fixed enumerations (``state``,
``status``, ``store``, ``object``, ``version``): no endpoint, bucket, path or credential.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from offloadd import __version__
from offloadd.errors import ConfigError
from offloadd.metrics_table import TABLE, Kind, Level, Series
from offloadd.model import TopicName
from offloadd.offload import probes

__all__ = ["AUTO_TOPIC_LIMIT", "CIRCUIT_STATES", "SEGMENT_STATES", "Metrics", "TopicProbe",
           "namespace_of"]

SEGMENT_STATES = ("assigned", "offloaded", "failed")
CIRCUIT_STATES = ("closed", "open", "half_open")

# "auto": per-topic series below this many topics. Once there, per namespace until the count
# falls below 90 % of it, so a count hovering at the limit does not flip the series each scrape.
AUTO_TOPIC_LIMIT = 1000
_AUTO_BACK = 900

_MICROS = 1_000_000.0
_UNKNOWN = "unknown"  # Pulsar's label value when a topic name does not parse
_DEFAULT_RATE_PERIOD = 60.0
_NAN = math.nan


def namespace_of(topic: str) -> str:
    """The ``namespace`` label for a topic name (``tenant/ns``), or ``unknown`` like Pulsar."""
    try:
        return TopicName.parse(topic).ns
    except ConfigError:
        return _UNKNOWN


# -- storage layout, from the table ---------------------------------------------------------------
def _offsets(chosen: Iterable[Series]) -> tuple[dict[str, int], int]:
    out, at = {}, 0
    for s in chosen:
        out[s.name] = at
        at += s.width
    return out, at


# What a topic stores: its TOPIC-level counters and gauges, and the NAMESPACE-level gauges it
# feeds (a namespace's segment count is the sum of its topics'). Rates are derived at scrape.
_FED = tuple(s for s in TABLE if s.rate_of is None and (
    (s.level is Level.TOPIC and s.kind in (Kind.COUNTER, Kind.GAUGE))
    or (s.level is Level.NAMESPACE and s.kind is Kind.GAUGE)))
_T, _TWIDTH = _offsets(_FED)
_COUNTER_SLOTS = tuple(i for s in _FED if s.kind is Kind.COUNTER
                       for i in range(_T[s.name], _T[s.name] + s.width))
_FRESH = [0.0 if s.kind is Kind.COUNTER else _NAN for s in _FED for _ in range(s.width)]
# What a namespace stores itself: its counters (never per topic).
_NS_COUNTERS = tuple(s for s in TABLE if s.level is Level.NAMESPACE and s.kind is Kind.COUNTER)
_N, _NWIDTH = _offsets(_NS_COUNTERS)
_RATES = tuple(s for s in TABLE if s.rate_of is not None)

_OFFLOAD_ERROR = _T["brk_ledgeroffloader_offload_error"]
_WRITE_ERROR = _T["brk_ledgeroffloader_write_storage_error"]
_LIMITED = _T["brk_ledgeroffloader_ledger_offload_limited"]
_OFFLOADED_BYTES = _T["offloadd_offloaded_bytes"]
_OFFLOADED_ENTRIES = _T["offloadd_offloaded_entries"]
_THROTTLE_WAIT = _T["offloadd_throttle_wait_seconds"]
_LOST = _T["offloadd_ledgers_lost_to_retention"]
_LAG_ENTRIES = _T["offloadd_lag_entries"]
_LAG_BYTES = _T["offloadd_lag_bytes"]
_LAG_SECONDS = _T["offloadd_lag_seconds"]
_LAST_COMMIT = _T["offloadd_last_commit_timestamp_seconds"]
_LAST_LEDGER = _T["offloadd_last_offloaded_ledger"]
_LAST_ENTRY = _T["offloadd_last_offloaded_entry"]
_READING_MAX = _T["brk_ledgeroffloader_ledger_reading_max_bytes"]
_SEGMENTS = _T["offloadd_segments"]
_READ_ERROR = _N["brk_ledgeroffloader_read_offload_error"]
_READ_BYTES = _N["brk_ledgeroffloader_read_bytes"]
_DELETES = _N["brk_ledgeroffloader_delete_offload_ops"]


class _Window:
    """One ``*_rate`` gauge's stats period: Pulsar resets byte adders every period and
    publishes bytes/period; here the running total stays and a scrape that finds the period
    over publishes the average since the previous mark (scrapes inside a period see the last
    published value)."""

    __slots__ = ("mark", "rate", "since")

    def __init__(self, since: float) -> None:
        self.since, self.mark, self.rate = since, 0.0, 0.0

    def update(self, total: float, now: float, period: float) -> float:
        elapsed = now - self.since
        if elapsed >= period:
            self.rate = (total - self.mark) / elapsed
            self.mark, self.since = total, now
        return self.rate


class _Dist:
    """One latency distribution of a namespace: a histogram's bucket counts (not cumulative,
    the last one +Inf), or only count and sum (a Pulsar summary)."""

    __slots__ = ("buckets", "count", "total")

    def __init__(self, nbuckets: int) -> None:
        self.count, self.total = 0, 0.0
        self.buckets = [0] * nbuckets

    def observe(self, bounds: tuple[float, ...], value: float) -> None:
        self.count += 1
        self.total += value
        if self.buckets:
            self.buckets[bisect.bisect_left(bounds, value)] += 1


class _Namespace:
    __slots__ = ("counters", "dists", "name", "retired", "windows")

    def __init__(self, name: str, now: float) -> None:
        self.name = name
        self.counters = [0.0] * _NWIDTH
        # topic slots of the topics that went away (only the counters are read), and where a
        # probe of a topic not served writes: counted in the namespace, never per topic
        self.retired = list(_FRESH)
        self.dists: dict[tuple[str, str], _Dist] = {}
        self.windows = {s.name: _Window(now) for s in _RATES if s.level is Level.NAMESPACE}

    def observe(self, series: Series, value: float, label: str = "") -> None:
        dist = self.dists.get((series.name, label))
        if dist is None:
            width = len(series.buckets) + 1 if series.buckets else 0
            dist = self.dists[series.name, label] = _Dist(width)
        dist.observe(series.buckets, value)


_UPLOAD = next(s for s in TABLE if s.name == "offloadd_upload_duration_seconds")
_READ = next(s for s in TABLE if s.name == "offloadd_read_duration_seconds")
_SOURCE_READ = next(s for s in TABLE if s.name == "offloadd_source_read_duration_seconds")
_INDEX_LATENCY = next(s for s in TABLE if s.name.endswith("read_offload_index_latency"))
_DATA_LATENCY = next(s for s in TABLE if s.name.endswith("read_offload_data_latency"))
_LEDGER_LATENCY = next(s for s in TABLE if s.name.endswith("read_ledger_latency"))
_OFFLOAD_TIME = next(s for s in TABLE if s.name.endswith("ledger_offload_time"))


class TopicProbe(probes.TopicProbe):
    """The one implementation of :class:`offloadd.offload.probes.TopicProbe` (whose methods
    say what each report means), plus the calls of the daemon and gc. Get it from
    :meth:`Metrics.topic`; a report is a few float operations under one lock."""

    __slots__ = ("_cells", "_lock", "_m", "_ns", "_window", "namespace", "topic")

    def __init__(self, metrics: Metrics, ns: _Namespace, topic: str, *,
                 served: bool = True) -> None:
        self.namespace = ns.name
        self.topic = topic
        self._m = metrics
        self._lock = metrics._lock
        self._ns = ns
        self._cells = list(_FRESH) if served else ns.retired
        self._window = _Window(metrics._clock())

    def _add(self, slot: int, amount: float) -> None:
        with self._lock:
            self._cells[slot] += amount

    def _set(self, slot: int, value: float) -> None:
        with self._lock:
            self._cells[slot] = value

    def _observe(self, series: Series, value: float, label: str = "") -> None:
        with self._lock:
            self._ns.observe(series, value, label)

    # -- writing to the tier --------------------------------------------------------------------
    def offload_bytes(self, nbytes: int, entries: int = 0) -> None:
        with self._lock:
            self._cells[_OFFLOADED_BYTES] += nbytes
            self._cells[_OFFLOADED_ENTRIES] += entries

    def offload_error(self) -> None:
        self._add(_OFFLOAD_ERROR, 1)

    def write_storage_error(self) -> None:
        self._add(_WRITE_ERROR, 1)

    def upload_latency(self, seconds: float) -> None:
        self._observe(_UPLOAD, seconds)

    def ledger_offload_time(self, seconds: float) -> None:
        """A segment (PIP-211: a ledger) took ``seconds`` from start to commit."""
        self._observe(_OFFLOAD_TIME, seconds * _MICROS)

    def ledger_offload_limited(self) -> None:
        """The offload was held back once; :meth:`throttle_wait` already counts throttle waits."""
        self._add(_LIMITED, 1)

    def ledger_reading_max_bytes(self, nbytes: int) -> None:
        self._set(_READING_MAX, nbytes)

    def segment_committed(self, entries: int, nbytes: int, seconds: float) -> None:
        self._add(_OFFLOADED_ENTRIES, entries)
        self.ledger_offload_time(seconds)

    def metadata_write(self) -> None:
        self._m.metadata_writes()

    def data_lost(self, ledger_id: int) -> None:
        self._add(_LOST, 1)

    def throttle_wait(self, seconds: float) -> None:
        """Report each throttle acquire's wait; a non-zero wait also counts as 'limited'."""
        with self._lock:
            self._cells[_THROTTLE_WAIT] += seconds
            if seconds > 0:
                self._cells[_LIMITED] += 1

    # -- reading ----------------------------------------------------------------------------
    def read_offload(self, nbytes: int) -> None:
        with self._lock:
            self._ns.counters[_READ_BYTES] += nbytes

    def read_error(self) -> None:
        with self._lock:
            self._ns.counters[_READ_ERROR] += 1

    def index_read(self, seconds: float) -> None:
        with self._lock:
            self._ns.observe(_INDEX_LATENCY, seconds * _MICROS)
            self._ns.observe(_READ, seconds, "index")

    def data_read(self, seconds: float) -> None:
        with self._lock:
            self._ns.observe(_DATA_LATENCY, seconds * _MICROS)
            self._ns.observe(_READ, seconds, "data")

    def ledger_read(self, seconds: float) -> None:
        with self._lock:
            self._ns.observe(_LEDGER_LATENCY, seconds * _MICROS)
            self._ns.observe(_SOURCE_READ, seconds)

    # -- state --------------------------------------------------------------------------------
    def delete_op(self, succeeded: bool = True) -> None:
        """One deletion of offloaded objects was attempted (counted per namespace)."""
        with self._lock:
            self._ns.counters[_DELETES + (0 if succeeded else 1)] += 1

    def segment_states(self, assigned: int, offloaded: int, failed: int) -> None:
        with self._lock:
            self._cells[_SEGMENTS:_SEGMENTS + 3] = [assigned, offloaded, failed]

    def lag(self, entries: int, nbytes: int, seconds: float) -> None:
        with self._lock:
            self._cells[_LAG_ENTRIES] = entries
            self._cells[_LAG_BYTES] = nbytes
            self._cells[_LAG_SECONDS] = seconds

    def last_offloaded(self, ledger: int, entry: int) -> None:
        with self._lock:
            self._cells[_LAST_LEDGER] = ledger
            self._cells[_LAST_ENTRY] = entry

    def last_commit_time(self, seconds: float) -> None:
        self._set(_LAST_COMMIT, seconds)


class Metrics:
    """The process's registry and its probes.

    ``topic_level``: True per topic, False per namespace, None "auto" (per topic below
    :data:`AUTO_TOPIC_LIMIT` served topics). ``clock`` and ``rate_period`` drive Pulsar's
    ``*_rate`` gauges.
    """

    def __init__(
        self,
        *,
        topic_level: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        rate_period: float = _DEFAULT_RATE_PERIOD,
    ) -> None:
        self.topic_level = topic_level
        self._clock = clock
        self._period = rate_period
        self._lock = threading.Lock()
        self._topics: dict[tuple[str, str], TopicProbe] = {}
        self._namespaces: dict[str, _Namespace] = {}
        self._process: dict[str, dict[tuple[str, ...], float]] = {
            s.name: {} for s in TABLE if s.level is Level.PROCESS}
        self._process["offloadd_build"][(__version__,)] = 1.0
        self._auto_topic_level = True
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_Exposition(self))

    # -- probes -------------------------------------------------------------------------------
    def _namespace(self, name: str) -> _Namespace:
        ns = self._namespaces.get(name)
        if ns is None:
            ns = self._namespaces[name] = _Namespace(name, self._clock())
        return ns

    def _probe(self, namespace: str, topic: str, *, served: bool) -> TopicProbe:
        return TopicProbe(self, self._namespace(namespace), topic, served=served)

    def topic(self, namespace: str, topic: str) -> TopicProbe:
        """The probe for one topic this process serves (one per topic; repeated calls return
        the same probe) until :meth:`forget_topic`."""
        key = (namespace, topic)
        probe = self._topics.get(key)
        if probe is None:
            with self._lock:
                probe = self._topics[key] = self._probe(namespace, topic, served=True)
        return probe

    def topic_named(self, topic: str) -> TopicProbe:
        """The probe of a full topic name; the namespace label is derived from it. For a topic
        this process does not serve (gc deleting a deleted topic's objects, a late report)
        it is a probe that counts in the namespace's totals only: it creates no per-topic
        series, so nothing is left behind to forget."""
        key = (namespace_of(topic), topic)
        probe = self._topics.get(key)
        if probe is None:
            with self._lock:
                probe = self._probe(*key, served=False)
        return probe

    def forget_topic(self, namespace: str, topic: str) -> None:
        """Drop every per-topic series of a topic this process no longer serves; its counters
        stay in the namespace's totals."""
        with self._lock:
            probe = self._topics.pop((namespace, topic), None)
            if probe is not None:
                retired = probe._ns.retired
                for slot in _COUNTER_SLOTS:
                    retired[slot] += probe._cells[slot]
                probe._cells = list(_FRESH)  # later reports of a stale holder count nowhere

    def buffer(self, bytes_used: int, cap: int) -> None:
        """Offload buffer fill and capacity."""
        self._set("offloadd_buffer_bytes", (), bytes_used)
        self._set("offloadd_buffer_capacity_bytes", (), cap)

    def throttle_limit(self, bytes_per_second: float) -> None:
        """The configured broker-wide budget (0 = unlimited); set at start and on reload."""
        self._set("offloadd_throttle_limit_bytes_per_second", (), bytes_per_second)

    def throttle_wait(self, topic: str, seconds: float) -> None:
        """Same as ``topic_named(topic).throttle_wait(seconds)``."""
        self.topic_named(topic).throttle_wait(seconds)

    def store_circuit(self, state_name: str, store: str = "blobstore") -> None:
        """The circuit breaker of ``store`` is now in ``state_name``."""
        with self._lock:
            cells = self._process["offloadd_store_circuit_state"]
            known = {s for (st, s) in cells if st == store} | set(CIRCUIT_STATES) | {state_name}
            for state in known:
                cells[store, state] = 1.0 if state == state_name else 0.0

    def blobstore_request(self, driver: str, op: str, result: str) -> None:
        """One request the blob-store driver sent (``offloadd.blobstore.requests``)."""
        self._inc("offloadd_blobstore_requests", (driver, op, result))

    def metadata_writes(self, count: int = 1) -> None:
        """Writes (compare-and-set) to the metadata store."""
        self._inc("offloadd_metadata_writes", (), count)

    def _inc(self, name: str, labels: tuple[str, ...], amount: float = 1.0) -> None:
        with self._lock:
            cells = self._process[name]
            cells[labels] = cells.get(labels, 0.0) + amount

    def _set(self, name: str, labels: tuple[str, ...], value: float) -> None:
        with self._lock:
            self._process[name][labels] = value

    # -- exposition ---------------------------------------------------------------------------
    def topic_level_now(self) -> bool:
        """Whether the next scrape shows per-topic series (decides "auto" with hysteresis)."""
        if self.topic_level is not None:
            return self.topic_level
        n = len(self._topics)
        if self._auto_topic_level and n >= AUTO_TOPIC_LIMIT:
            self._auto_topic_level = False
        elif not self._auto_topic_level and n < _AUTO_BACK:
            self._auto_topic_level = True
        return self._auto_topic_level

    def exposition(self, accept: str | None = None) -> tuple[bytes, str]:
        """The registry rendered for a scraper's ``Accept`` header: (body, content type).

        Safe to call from a worker thread.
        """
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type


class _Exposition(Collector):
    """The table's families, filled from the probes' cells at each scrape."""

    def __init__(self, metrics: Metrics) -> None:
        self._m = metrics

    def describe(self) -> Iterable[Metric]:
        return [_family(s, per_topic=s.level is Level.TOPIC) for s in TABLE]

    def collect(self) -> Iterable[Metric]:
        m = self._m
        with m._lock:
            per_topic = m.topic_level_now()
            m._process["offloadd_topics"][()] = len(m._topics)
            m._process["offloadd_metrics_topic_level"][()] = 1.0 if per_topic else 0.0
            return list(_Snapshot(m, per_topic).families())


class _Snapshot:
    """One scrape's families (built under the metrics lock)."""

    def __init__(self, m: Metrics, per_topic: bool) -> None:
        self.m, self.per_topic = m, per_topic
        now = m._clock()
        # per namespace: its live topics' slots summed and maxed, and their rates summed
        self.sums: dict[str, list[float]] = {}
        self.maxes: dict[str, list[float]] = {}
        self.rates: dict[tuple[str, str], float] = {}
        for (ns, topic), probe in m._topics.items():
            cells = probe._cells
            sums = self.sums.get(ns)
            if sums is None:
                sums, self.maxes[ns] = [_NAN] * _TWIDTH, [_NAN] * _TWIDTH
                self.sums[ns] = sums
            maxes = self.maxes[ns]
            for i, v in enumerate(cells):
                if v == v:  # not NaN: a gauge not set yet counts nowhere
                    s = sums[i]
                    sums[i] = v if s != s else s + v
                    if not maxes[i] >= v:
                        maxes[i] = v
            for r in _RATES:
                if r.level is Level.TOPIC and r.rate_of is not None:
                    rate = probe._window.update(cells[_T[r.rate_of]], now, m._period)
                    self.rates[ns, topic] = rate
                    self.rates[ns, ""] = self.rates.get((ns, ""), 0.0) + rate
        for space in m._namespaces.values():
            for r in _RATES:
                if r.level is Level.NAMESPACE and r.rate_of is not None:
                    total = space.counters[_N[r.rate_of]]
                    self.rates[space.name, r.name] = space.windows[r.name].update(
                        total, now, m._period)

    def families(self) -> Iterator[Metric]:
        for s in TABLE:
            per_topic = self.per_topic and s.level is Level.TOPIC
            fam = _family(s, per_topic=per_topic)
            if s.level is Level.PROCESS:
                for labels, v in sorted(self.m._process[s.name].items()):
                    _add(fam, s, list(labels), v)
            elif s.kind in (Kind.SUMMARY, Kind.HISTOGRAM):
                self._dists(fam, s)
            elif s.rate_of is not None:
                self._rate(fam, s, per_topic)
            elif per_topic:
                at = _T[s.name]
                for (ns, topic), probe in self.m._topics.items():
                    v = probe._cells[at]
                    if v == v:
                        _add(fam, s, [ns, topic], v)
            elif s.level is Level.NAMESPACE and s.kind is Kind.COUNTER:
                for space in self.m._namespaces.values():
                    for k in range(s.width):
                        _add(fam, s, [space.name, *s.values[k:k + 1]],
                             space.counters[_N[s.name] + k])
            else:
                self._aggregated(fam, s)
            yield fam

    def _aggregated(self, fam: Metric, s: Series) -> None:
        """A series fed per topic, one value per namespace: counters with the topics gone."""
        for ns in self.m._namespaces.values():
            live = (self.maxes if s.agg == "max" else self.sums).get(ns.name)
            for k in range(s.width):
                at = _T[s.name] + k
                v = live[at] if live is not None else _NAN
                if s.kind is Kind.COUNTER:
                    v = ns.retired[at] + (v if v == v else 0.0)
                if v == v:
                    _add(fam, s, [ns.name, *s.values[k:k + 1]], v)

    def _rate(self, fam: Metric, s: Series, per_topic: bool) -> None:
        if s.level is Level.NAMESPACE:
            for ns in self.m._namespaces:
                _add(fam, s, [ns], self.rates[ns, s.name])
        elif per_topic:
            for key in self.m._topics:
                _add(fam, s, list(key), self.rates[key])
        else:
            for ns in self.sums:
                _add(fam, s, [ns], self.rates[ns, ""])

    def _dists(self, fam: Metric, s: Series) -> None:
        for ns in self.m._namespaces.values():
            for value in s.values or ("",):
                dist = ns.dists.get((s.name, value))
                if dist is None:
                    continue
                labels = [ns.name, *([value] if value else [])]
                if isinstance(fam, HistogramMetricFamily):
                    acc, cumulative = 0, []
                    for bound, n in zip((*s.buckets, math.inf), dist.buckets, strict=True):
                        acc += n
                        cumulative.append((_le(bound), float(acc)))
                    fam.add_metric(labels, cumulative, dist.total)
                elif isinstance(fam, SummaryMetricFamily):
                    fam.add_metric(labels, dist.count, dist.total)


def _le(bound: float) -> str:
    return "+Inf" if bound == math.inf else repr(float(bound))


def _family(s: Series, *, per_topic: bool) -> Metric:
    if s.kind is Kind.INFO:
        return InfoMetricFamily(s.name, s.help)
    if s.level is Level.PROCESS:
        labels = list(s.labels)
    else:
        labels = ["namespace", *(["topic"] if per_topic else []), *s.labels]
    if s.kind is Kind.COUNTER:
        return CounterMetricFamily(s.name, s.help, labels=labels)
    if s.kind is Kind.GAUGE:
        return GaugeMetricFamily(s.name, s.help, labels=labels)
    if s.kind is Kind.SUMMARY:
        return SummaryMetricFamily(s.name, s.help, labels=labels)
    return HistogramMetricFamily(s.name, s.help, labels=labels)


def _add(fam: Metric, s: Series, labels: list[str], value: float) -> None:
    if isinstance(fam, InfoMetricFamily):
        fam.add_metric([], dict(zip(s.labels, labels, strict=True)))
    elif isinstance(fam, CounterMetricFamily | GaugeMetricFamily):
        fam.add_metric(labels, value)
