"""Where the series of :data:`offloadd.metrics_table.TABLE` live between scrapes, and how a
scrape reads them (for :mod:`offloadd.metrics`).

A served topic keeps one list of floats (its *slots*: each TOPIC-level counter and gauge, and
the NAMESPACE-level gauges it feeds); a namespace keeps its own counters, its latency
distributions and the counted totals of its topics that went away. A scrape builds the
families from these: per topic, or per namespace (summed, or maxed where the table says).
Gauges not set yet are NaN and appear nowhere.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Iterator, Mapping

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
    SummaryMetricFamily,
)

from offloadd.metrics_table import TABLE, Kind, Level, Series

_NAN = math.nan


def _offsets(chosen: Iterable[Series]) -> tuple[dict[str, int], int]:
    out, at = {}, 0
    for s in chosen:
        out[s.name] = at
        at += s.width
    return out, at


# What a topic stores: its TOPIC-level counters and gauges, and the NAMESPACE-level gauges it
# feeds (a namespace's segment count is the sum of its topics'). Rates are derived at scrape.
FED = tuple(s for s in TABLE if s.rate_of is None and (
    (s.level is Level.TOPIC and s.kind in (Kind.COUNTER, Kind.GAUGE))
    or (s.level is Level.NAMESPACE and s.kind is Kind.GAUGE)))
T, TWIDTH = _offsets(FED)
COUNTER_SLOTS = tuple(i for s in FED if s.kind is Kind.COUNTER
                       for i in range(T[s.name], T[s.name] + s.width))
FRESH = [0.0 if s.kind is Kind.COUNTER else _NAN for s in FED for _ in range(s.width)]
# What a namespace stores itself: its counters (never per topic).
NS_COUNTERS = tuple(s for s in TABLE if s.level is Level.NAMESPACE and s.kind is Kind.COUNTER)
N, NWIDTH = _offsets(NS_COUNTERS)
RATES = tuple(s for s in TABLE if s.rate_of is not None)


class Window:
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


class Dist:
    """One latency distribution of a namespace: a histogram's bucket counts (not cumulative,
    the last one +Inf), or only count and sum (a Pulsar summary)."""

    __slots__ = ("buckets", "count", "total")

    def __init__(self, nbuckets: int) -> None:
        self.count, self.total = 0, 0.0
        self.buckets = [0] * nbuckets

    def copy(self) -> Dist:
        out = Dist(0)
        out.count, out.total, out.buckets = self.count, self.total, list(self.buckets)
        return out

    def observe(self, bounds: tuple[float, ...], value: float) -> None:
        self.count += 1
        self.total += value
        if self.buckets:
            self.buckets[bisect.bisect_left(bounds, value)] += 1


class Namespace:
    """What a namespace holds itself: its counters, its latency distributions (created at
    their first observation), the counted totals of its topics that went away, and the rate
    windows of its NAMESPACE-level ``*_rate`` gauges."""

    __slots__ = ("counters", "dists", "name", "retired", "windows")

    def __init__(self, name: str, now: float) -> None:
        self.name = name
        self.counters = [0.0] * NWIDTH
        # topic slots of the topics that went away (only the counters are read), and where a
        # probe of a topic not served writes: counted in the namespace, never per topic
        self.retired = list(FRESH)
        self.dists: dict[tuple[str, str], Dist] = {}
        self.windows = {s.name: Window(now) for s in RATES if s.level is Level.NAMESPACE}

    def copy(self) -> Namespace:
        """A copy of the values, for a scrape to read outside the lock (the windows are
        shared: only scrapes move them, under the lock)."""
        out = Namespace.__new__(Namespace)
        out.name, out.windows = self.name, self.windows
        out.counters, out.retired = list(self.counters), list(self.retired)
        out.dists = {k: d.copy() for k, d in self.dists.items()}
        return out

    def observe(self, series: Series, value: float, label: str = "") -> None:
        dist = self.dists.get((series.name, label))
        if dist is None:
            width = len(series.buckets) + 1 if series.buckets else 0
            dist = self.dists[series.name, label] = Dist(width)
        dist.observe(series.buckets, value)


class Snapshot:
    """One scrape's families. Made under the metrics lock from copies (``topics`` maps each
    served topic's (namespace, topic) to a copy of its slots and its rate window; ``process``
    holds the PROCESS-level values by label values), where only the rate windows move; then
    :meth:`families` builds the exposition outside the lock, so probes are not held up by a
    large scrape."""

    def __init__(self, topics: Mapping[tuple[str, str], tuple[list[float], Window]],
                 namespaces: Mapping[str, Namespace],
                 process: Mapping[str, Mapping[tuple[str, ...], float]], *, per_topic: bool,
                 now: float, period: float) -> None:
        self.topics, self.namespaces, self.process = topics, namespaces, process
        self.per_topic = per_topic
        # by (series, namespace, topic); topic "" is the namespace's (a sum of its topics')
        self.rates: dict[tuple[str, str, str], float] = {}
        for (ns, topic), (cells, window) in topics.items():
            for r in RATES:
                if r.level is Level.TOPIC and r.rate_of is not None:
                    rate = window.update(cells[T[r.rate_of]], now, period)
                    self.rates[r.name, ns, topic] = rate
                    self.rates[r.name, ns, ""] = self.rates.get((r.name, ns, ""), 0.0) + rate
        for space in namespaces.values():
            for r in RATES:
                if r.level is Level.NAMESPACE and r.rate_of is not None:
                    total = space.counters[N[r.rate_of]]
                    self.rates[r.name, space.name, ""] = space.windows[r.name].update(
                        total, now, period)
        self.sums: dict[str, list[float]] = {}
        self.maxes: dict[str, list[float]] = {}

    def _aggregate(self) -> None:
        """Per namespace: its live topics' slots summed and maxed."""
        for (ns, _), (cells, _) in self.topics.items():
            sums = self.sums.get(ns)
            if sums is None:
                sums, self.maxes[ns] = [_NAN] * TWIDTH, [_NAN] * TWIDTH
                self.sums[ns] = sums
            maxes = self.maxes[ns]
            for i, v in enumerate(cells):
                if v == v:  # not NaN: a gauge not set yet counts nowhere
                    s = sums[i]
                    sums[i] = v if s != s else s + v
                    if not maxes[i] >= v:
                        maxes[i] = v

    def families(self) -> Iterator[Metric]:
        self._aggregate()
        for s in TABLE:
            per_topic = self.per_topic and s.level is Level.TOPIC
            fam = family(s, per_topic=per_topic)
            if s.level is Level.PROCESS:
                for labels, v in sorted(self.process[s.name].items()):
                    add(fam, s, list(labels), v)
            elif s.kind in (Kind.SUMMARY, Kind.HISTOGRAM):
                self._dists(fam, s)
            elif s.rate_of is not None:
                self._rate(fam, s, per_topic)
            elif per_topic:
                at = T[s.name]
                for (ns, topic), (cells, _) in self.topics.items():
                    v = cells[at]
                    if v == v:
                        add(fam, s, [ns, topic], v)
            elif s.level is Level.NAMESPACE and s.kind is Kind.COUNTER:
                for space in self.namespaces.values():
                    for k in range(s.width):
                        add(fam, s, [space.name, *s.values[k:k + 1]],
                             space.counters[N[s.name] + k])
            else:
                self._aggregated(fam, s)
            yield fam

    def _aggregated(self, fam: Metric, s: Series) -> None:
        """A series fed per topic, one value per namespace: counters with the topics gone."""
        for ns in self.namespaces.values():
            live = (self.maxes if s.agg == "max" else self.sums).get(ns.name)
            for k in range(s.width):
                at = T[s.name] + k
                v = live[at] if live is not None else _NAN
                if s.kind is Kind.COUNTER:
                    v = ns.retired[at] + (v if v == v else 0.0)
                if v == v:
                    add(fam, s, [ns.name, *s.values[k:k + 1]], v)

    def _rate(self, fam: Metric, s: Series, per_topic: bool) -> None:
        if per_topic:
            for ns, topic in self.topics:
                add(fam, s, [ns, topic], self.rates[s.name, ns, topic])
        else:
            for ns in self.namespaces if s.level is Level.NAMESPACE else self.sums:
                add(fam, s, [ns], self.rates[s.name, ns, ""])

    def _dists(self, fam: Metric, s: Series) -> None:
        for ns in self.namespaces.values():
            for value in s.values or ("",):
                dist = ns.dists.get((s.name, value))
                if dist is None:
                    continue
                labels = [ns.name, *([value] if value else [])]
                if isinstance(fam, HistogramMetricFamily):
                    acc, cumulative = 0, []
                    for bound, n in zip((*s.buckets, math.inf), dist.buckets, strict=True):
                        acc += n
                        cumulative.append((le(bound), float(acc)))
                    fam.add_metric(labels, cumulative, dist.total)
                elif isinstance(fam, SummaryMetricFamily):
                    fam.add_metric(labels, dist.count, dist.total)


def le(bound: float) -> str:
    return "+Inf" if bound == math.inf else repr(float(bound))


def family(s: Series, *, per_topic: bool) -> Metric:
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


def add(fam: Metric, s: Series, labels: list[str], value: float) -> None:
    if isinstance(fam, InfoMetricFamily):
        fam.add_metric([], dict(zip(s.labels, labels, strict=True)))
    elif isinstance(fam, CounterMetricFamily | GaugeMetricFamily):
        fam.add_metric(labels, value)
