"""Prometheus metrics, reached only through probe objects.

Business code asks for a probe and reports what happened, in natural units (bytes, seconds)::

    probe = metrics.topic("public/default", "persistent://public/default/orders")
    probe.offload_bytes(nbytes, entries)
    probe.upload_latency(seconds)

The series are declared in :data:`offloadd.metrics_table.TABLE` (name, type, labels, help,
level); where their values live and how a scrape reads them is :mod:`offloadd.metrics_cells`;
probes, unit conversion and the topic-level switch are here. Nothing else registers a series.
Everything is served by the :class:`Metrics` object's own ``CollectorRegistry``, never the
process-global one, so two daemons or tests in one process do not collide. ``docs/metrics.md``
is the operator's table of every series.

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
``status``, ``store``, ``object``, ``version``, ``reason``, ``outcome``): no endpoint, bucket,
path or credential.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from offloadd import __version__
from offloadd.errors import ConfigError
from offloadd.metrics_cells import COUNTER_SLOTS, FRESH, N, Namespace, Snapshot, T, Window, family
from offloadd.metrics_table import TABLE, Level, Series, series
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


def namespace_of(topic: str) -> str:
    """The ``namespace`` label for a topic name (``tenant/ns``), or ``unknown`` like Pulsar."""
    try:
        return TopicName.parse(topic).ns
    except ConfigError:
        return _UNKNOWN


# where each report lands: a topic's slot (T) or its namespace's counter (N)
_OFFLOAD_ERROR = T["brk_ledgeroffloader_offload_error"]
_WRITE_ERROR = T["brk_ledgeroffloader_write_storage_error"]
_LIMITED = T["brk_ledgeroffloader_ledger_offload_limited"]
_OFFLOADED_BYTES = T["offloadd_offloaded_bytes"]
_OFFLOADED_ENTRIES = T["offloadd_offloaded_entries"]
_THROTTLE_WAIT = T["offloadd_throttle_wait_seconds"]
_LOST = T["offloadd_ledgers_lost_to_retention"]
_LAG_ENTRIES = T["offloadd_lag_entries"]
_LAG_BYTES = T["offloadd_lag_bytes"]
_LAG_SECONDS = T["offloadd_lag_seconds"]
_LAST_COMMIT = T["offloadd_last_commit_timestamp_seconds"]
_LAST_LEDGER = T["offloadd_last_offloaded_ledger"]
_LAST_ENTRY = T["offloadd_last_offloaded_entry"]
_READING_MAX = T["brk_ledgeroffloader_ledger_reading_max_bytes"]
_SEGMENTS = T["offloadd_segments"]
_LAKE = T["offloadd_lakehouse_lag_entries"]  # the five lakehouse slots, in TABLE order
_HELD = T["offloadd_lakehouse_held_entries"]
_HIDDEN = N["offloadd_lakehouse_hidden_messages"]  # marker, aborted, timed_out
_TXNS = N["offloadd_lakehouse_transactions"]  # committed, aborted, timed_out
_READ_ERROR = N["brk_ledgeroffloader_read_offload_error"]
_REREAD = N["offloadd_read_rereads"]
_READ_BYTES = N["brk_ledgeroffloader_read_bytes"]
_DELETES = N["brk_ledgeroffloader_delete_offload_ops"]

_UPLOAD = series("offloadd_upload_duration_seconds")
_READ = series("offloadd_read_duration_seconds")
_SOURCE_READ = series("offloadd_source_read_duration_seconds")
_INDEX_LATENCY = series("brk_ledgeroffloader_read_offload_index_latency")
_DATA_LATENCY = series("brk_ledgeroffloader_read_offload_data_latency")
_LEDGER_LATENCY = series("brk_ledgeroffloader_read_ledger_latency")
_OFFLOAD_TIME = series("brk_ledgeroffloader_ledger_offload_time")


class TopicProbe(probes.TopicProbe):
    """The one implementation of :class:`offloadd.offload.probes.TopicProbe` (whose methods
    say what each report means), plus the calls of the daemon and gc. Get it from
    :meth:`Metrics.topic`; a report is a few float operations under one lock."""

    __slots__ = ("_cells", "_lag_at", "_lock", "_m", "_ns", "_window", "namespace", "topic")

    def __init__(self, metrics: Metrics, ns: Namespace, topic: str, *,
                 served: bool = True) -> None:
        self.namespace = ns.name
        self.topic = topic
        self._m = metrics
        self._lock = metrics._lock
        self._ns = ns
        self._cells = list(FRESH) if served else ns.retired
        self._window = Window(metrics._clock())
        # when a non-zero lag was reported (the registry's clock): a scrape ages its seconds,
        # as the lag loop leaves a topic nothing happened to unmeasured (offload/lag.py)
        self._lag_at: float | None = None

    def cells(self, now: float) -> list[float]:
        """A copy of the slots as of ``now`` (the lag's seconds aged). Under the lock."""
        cells = list(self._cells)
        if self._lag_at is not None:
            cells[_LAG_SECONDS] += max(0.0, now - self._lag_at)
        return cells

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
        """Bytes (and entries) written to the tier. The topic task reports each data block's
        bytes as it lands (so rates move smoothly) and the entries in
        :meth:`segment_committed`."""
        with self._lock:
            self._cells[_OFFLOADED_BYTES] += nbytes
            self._cells[_OFFLOADED_ENTRIES] += entries

    def offload_error(self) -> None:
        """An offload attempt (a segment) failed."""
        self._add(_OFFLOAD_ERROR, 1)

    def write_storage_error(self) -> None:
        """A write to the blob store failed."""
        self._add(_WRITE_ERROR, 1)

    def upload_latency(self, seconds: float) -> None:
        """One object or part upload finished after ``seconds``."""
        self._observe(_UPLOAD, seconds)

    def ledger_offload_time(self, seconds: float) -> None:
        """A segment (PIP-211: a ledger) took ``seconds`` from start to commit."""
        self._observe(_OFFLOAD_TIME, seconds * _MICROS)

    def ledger_offload_limited(self) -> None:
        """The offload was held back once; :meth:`throttle_wait` already counts throttle waits."""
        self._add(_LIMITED, 1)

    def ledger_reading_max_bytes(self, nbytes: int) -> None:
        """The most bytes this topic may read from its ledger in one go."""
        self._set(_READING_MAX, nbytes)

    def segment_committed(self, entries: int, nbytes: int, seconds: float) -> None:
        """A segment was committed; ``seconds`` from closing it to its commit (PIP-211's
        ledger offload time). Its bytes were already counted block by block."""
        self._add(_OFFLOADED_ENTRIES, entries)
        self.ledger_offload_time(seconds)

    def metadata_write(self) -> None:
        """One compare-and-set write on this topic's behalf (counted per process)."""
        self._m.metadata_writes()

    def data_lost(self, ledger_id: int) -> None:
        """A ledger vanished from the source before it was offloaded (retention)."""
        self._add(_LOST, 1)

    def throttle_wait(self, seconds: float) -> None:
        """Report each throttle acquire's wait; a non-zero wait also counts as 'limited'."""
        with self._lock:
            self._cells[_THROTTLE_WAIT] += seconds
            if seconds > 0:
                self._cells[_LIMITED] += 1

    # -- reading ----------------------------------------------------------------------------
    def read_offload(self, nbytes: int) -> None:
        """Bytes read back from the tier."""
        with self._lock:
            self._ns.counters[_READ_BYTES] += nbytes

    def read_error(self) -> None:
        """A read from the tier failed."""
        with self._lock:
            self._ns.counters[_READ_ERROR] += 1

    def reread(self) -> None:
        """An answer from the tier failed its checks and is read again (damage in transit is
        retried before an object is called corrupt)."""
        with self._lock:
            self._ns.counters[_REREAD] += 1

    def index_read(self, seconds: float) -> None:
        """An index object was fetched and parsed in ``seconds``."""
        with self._lock:
            self._ns.observe(_INDEX_LATENCY, seconds * _MICROS)
            self._ns.observe(_READ, seconds, "index")

    def data_read(self, seconds: float) -> None:
        """A ranged read of data blocks took ``seconds``."""
        with self._lock:
            self._ns.observe(_DATA_LATENCY, seconds * _MICROS)
            self._ns.observe(_READ, seconds, "data")

    def ledger_read(self, seconds: float) -> None:
        """Reading entries from the source ledger (to offload them) took ``seconds``."""
        with self._lock:
            self._ns.observe(_LEDGER_LATENCY, seconds * _MICROS)
            self._ns.observe(_SOURCE_READ, seconds)

    # -- state --------------------------------------------------------------------------------
    def delete_op(self, succeeded: bool = True) -> None:
        """One deletion of offloaded objects was attempted (counted per namespace)."""
        with self._lock:
            self._ns.counters[_DELETES + (0 if succeeded else 1)] += 1

    def segment_states(self, assigned: int, offloaded: int, failed: int) -> None:
        """How many of this topic's segments are in each state right now."""
        with self._lock:
            self._cells[_SEGMENTS:_SEGMENTS + 3] = [assigned, offloaded, failed]

    def lag(self, entries: int, nbytes: int, seconds: float) -> None:
        """How far the tier trails the topic: from the last committed position to the source's
        LAC (measured by the daemon's lag loop, :mod:`offloadd.offload.lag`)."""
        with self._lock:
            self._cells[_LAG_ENTRIES] = entries
            self._cells[_LAG_BYTES] = nbytes
            self._cells[_LAG_SECONDS] = seconds
            self._lag_at = self._m._clock() if entries else None

    def last_offloaded(self, ledger: int, entry: int) -> None:
        """The last position committed to the tier."""
        with self._lock:
            self._cells[_LAST_LEDGER] = ledger
            self._cells[_LAST_ENTRY] = entry

    def last_commit_time(self, seconds: float) -> None:
        """Wall-clock time (seconds since the epoch) of the topic's last commit to the tier."""
        self._set(_LAST_COMMIT, seconds)

    def lakehouse_table(self, lag_entries: float, lag_seconds: float, rows: float,
                        data_files: float, last_snapshot_s: float) -> None:
        """The topic's Iceberg table after a projection pass (:mod:`offloadd.lakehouse.ops`);
        NaN for what is unknown."""
        with self._lock:
            self._cells[_LAKE:_LAKE + 5] = [lag_entries, lag_seconds, rows, data_files,
                                            last_snapshot_s]


    def lakehouse_held(self, entries: int) -> None:
        """Entries of the topic held behind an undecided transaction after the follower's
        last pass (summed per namespace, never per topic)."""
        self._set(_HELD, entries)

    def lakehouse_read_committed(self, markers: int, aborted: int, timed_out: int,
                                 committed_txns: int, aborted_txns: int,
                                 timed_out_txns: int) -> None:
        """What one projection pass kept out of the topic's table (markers; messages of
        aborted and of timed-out transactions) and the transactions it decided; counted per
        namespace only."""
        with self._lock:
            c = self._ns.counters
            for slot, n in ((_HIDDEN, markers), (_HIDDEN + 1, aborted),
                            (_HIDDEN + 2, timed_out), (_TXNS, committed_txns),
                            (_TXNS + 1, aborted_txns), (_TXNS + 2, timed_out_txns)):
                c[slot] += n


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
        self._namespaces: dict[str, Namespace] = {}
        self._process: dict[str, dict[tuple[str, ...], float]] = {
            s.name: {} for s in TABLE if s.level is Level.PROCESS}
        self._process["offloadd_build"][(__version__,)] = 1.0
        self._auto_topic_level = True
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_Exposition(self))

    # -- probes -------------------------------------------------------------------------------
    def _namespace(self, name: str) -> Namespace:
        ns = self._namespaces.get(name)
        if ns is None:
            ns = self._namespaces[name] = Namespace(name, self._clock())
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
                for slot in COUNTER_SLOTS:
                    retired[slot] += probe._cells[slot]
                probe._cells = list(FRESH)  # later reports of a stale holder count nowhere

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

    def conditional_writes(self, on: bool) -> None:
        """The tier's conditional-write fence is now on (or off): at start-up and at each
        re-probe (docs/s3.md, "Conditional writes")."""
        self._set("offloadd_conditional_writes", ("blobstore",), 1.0 if on else 0.0)

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

    def adopt(self, source: _Registers) -> None:
        """Serve a source's own collector (the BookKeeper client's ``source.register(registry)``)
        through the topic-level switch: with it off, a ``topic`` label of its series becomes
        ``namespace`` (values summed), so no series of the process has a ``topic`` label."""
        source.register(_Adopter(self))

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


class _Registers(Protocol):
    def register(self, registry: Any) -> None: ...


class _Adopter:
    """Registry-shaped: what a source's ``register`` gets from :meth:`Metrics.adopt`."""

    def __init__(self, metrics: Metrics) -> None:
        self._m = metrics

    def register(self, collector: Collector) -> None:
        self._m.registry.register(_PerNamespace(self._m, collector))


class _PerNamespace(Collector):
    """A collector whose series carry a ``topic`` label, folded per namespace while the
    metrics are not topic level."""

    def __init__(self, metrics: Metrics, inner: Collector) -> None:
        self._m, self._inner = metrics, inner

    def describe(self) -> Iterable[Metric]:
        return []  # the inner collector's names vary with its topics

    def collect(self) -> Iterable[Metric]:
        with self._m._lock:
            per_topic = self._m.topic_level_now()
        for fam in self._inner.collect():
            if per_topic or not any("topic" in s.labels for s in fam.samples):
                yield fam
                continue
            folded: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
            for sample in fam.samples:
                labels = dict(sample.labels)
                if "topic" in labels:
                    labels["namespace"] = namespace_of(labels.pop("topic"))
                key = (sample.name, tuple(sorted(labels.items())))
                folded[key] = folded.get(key, 0.0) + sample.value
            out = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            for (name, labels_), v in folded.items():
                out.add_sample(name, dict(labels_), v)
            yield out


class _Exposition(Collector):
    """The table's families, filled from the probes' cells at each scrape."""

    def __init__(self, metrics: Metrics) -> None:
        self._m = metrics

    def describe(self) -> Iterable[Metric]:
        return [family(s, per_topic=s.level is Level.TOPIC) for s in TABLE]

    def collect(self) -> Iterable[Metric]:
        m = self._m
        with m._lock:  # copies only: the families are built after it
            now = m._clock()
            per_topic = m.topic_level_now()
            m._process["offloadd_topics"][()] = len(m._topics)
            m._process["offloadd_metrics_topic_level"][()] = 1.0 if per_topic else 0.0
            snapshot = Snapshot(
                {key: (p.cells(now), p._window) for key, p in m._topics.items()},
                {name: ns.copy() for name, ns in m._namespaces.items()},
                {name: dict(cells) for name, cells in m._process.items()},
                per_topic=per_topic, now=now, period=m._period)
        return list(snapshot.families())
