"""Metrics: probes feed the right series, the exposition lints clean, the deploy files query
series that exist, and the HTTP endpoint answers /metrics, /healthz and /readyz."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml  # type: ignore[import-untyped]  # PyYAML arrives with moto[server]
from prometheus_client import REGISTRY

from bench.metrics_scrape import report_all, synthetic
from offloadd.errors import ConfigError
from offloadd.metrics import Metrics, namespace_of
from offloadd.metrics_table import TABLE, Level, Series, series
from offloadd.shell.httpserver import MetricsServer, PortBusy, ServerState, parse_bind

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "offloadd-rules.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "offloadd-dashboard.json"

NS = "public/default"
TOPIC = "persistent://public/default/orders"
OTHER = "persistent://public/default/payments"

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool is not on PATH (Debian package 'prometheus'; `scripts/setup --servers`)",
)

# Every metric name we query starts with one of these; PromQL functions and labels do not.
_METRIC_NAME = re.compile(r"(?<![A-Za-z0-9_:])(?:brk_ledgeroffloader|offloadd)_[A-Za-z0-9_:]*")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def value(m: Metrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def declared(sample: str) -> Series:
    """The table's declaration of a sample name (``X_total``, ``X_sum``, ``X_bucket`` ...)."""
    for suffix in ("", "_total", "_sum", "_count", "_bucket", "_info"):
        if sample.endswith(suffix) and (name := sample.removesuffix(suffix) if suffix
                                        else sample) in {s.name for s in TABLE}:
            return series(name)
    raise KeyError(sample)


def topic_value(m: Metrics, name: str, topic: str = TOPIC, **labels: str) -> float | None:
    """A topic's sample where the topic's reports land: its own series at topic level, its
    namespace's otherwise (and for the series that are always per namespace)."""
    where = {"namespace": namespace_of(topic)}
    if declared(name).level is Level.TOPIC and m.topic_level_now():
        where["topic"] = topic
    return value(m, name, **where, **labels)


@pytest.fixture(params=[True, False], ids=["topic_level", "namespace_level"])
def level(request: pytest.FixtureRequest) -> bool:
    """Both values of ``[metrics] topic_level``: every probe test runs in each."""
    return bool(request.param)


def populated(level: bool | None = None) -> Metrics:
    """A registry where every probe has reported at least once."""
    m = Metrics(topic_level=level)
    probe = m.topic(NS, TOPIC)
    report_all(probe)
    probe.lakehouse_table(3, 1.5, 100, 2, 1.7e9)  # only where the lakehouse projects the topic
    m.buffer(1 << 20, 1 << 28)
    m.throttle_limit(50_000_000)
    m.store_circuit("closed")
    m.store_circuit("open", store="metadata")
    m.metadata_writes()
    m.conditional_writes(True)
    return m


def backfill_names() -> set[str]:
    """Series of the backfill process's own registry (``offloadd backfill`` serves them)."""
    from prometheus_client.exposition import generate_latest

    from offloadd.backfill.progress import MetricsSink, Snapshot
    from offloadd.model import TopicName

    sink = MetricsSink(TopicName.parse(TOPIC))
    sink.show(Snapshot(planned=4, running=1, offloaded=2, failed_attempts=1, planned_bytes=400,
                       offloaded_bytes=200, elapsed_s=2.0))
    return sample_names(generate_latest(sink.registry).decode())


def sample_names(text: str) -> set[str]:
    return {
        re.split(r"[{ ]", line, maxsplit=1)[0]
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def exposition_text(m: Metrics) -> str:
    body, _ = m.exposition()
    return body.decode()


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], input=stdin, capture_output=True, text=True, timeout=60, check=False
    )


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def dashboard_queries() -> list[str]:
    exprs = [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]
    templating = [v["definition"] for v in dashboard()["templating"]["list"] if "definition" in v]
    return exprs + templating


def rule_exprs() -> dict[str, str]:
    doc = yaml.safe_load(RULES.read_text())
    return {r["alert"]: r["expr"] for g in doc["groups"] for r in g["rules"]}


class TestTopicProbe:
    """A topic probe's calls land in the series named for them, in the documented units."""

    def test_counters_exist_at_zero_before_anything_happens(self, level: bool) -> None:
        m = Metrics(topic_level=level)
        m.topic(NS, TOPIC)
        for name in (
            "brk_ledgeroffloader_offload_error_total",
            "brk_ledgeroffloader_write_storage_error_total",
            "brk_ledgeroffloader_read_offload_error_total",
            "offloadd_offloaded_bytes_total",
            "offloadd_throttle_wait_seconds_total",
            "offloadd_read_rereads_total",
        ):
            assert topic_value(m, name) == 0.0, name
        assert topic_value(m, "brk_ledgeroffloader_delete_offload_ops_total", status="failed") == 0

    def test_offloaded_bytes_and_entries_are_counted(self, level: bool) -> None:
        m = Metrics(topic_level=level)
        p = m.topic(NS, TOPIC)
        p.offload_bytes(1000, entries=3)
        p.offload_bytes(24)
        assert topic_value(m, "offloadd_offloaded_bytes_total") == 1024
        assert topic_value(m, "offloadd_offloaded_entries_total") == 3

    @pytest.mark.parametrize(
        ("method", "series"),
        [
            ("offload_error", "brk_ledgeroffloader_offload_error_total"),
            ("write_storage_error", "brk_ledgeroffloader_write_storage_error_total"),
            ("read_error", "brk_ledgeroffloader_read_offload_error_total"),
            ("ledger_offload_limited", "brk_ledgeroffloader_ledger_offload_limited_total"),
            ("reread", "offloadd_read_rereads_total"),
        ],
    )
    def test_each_error_goes_to_its_own_pulsar_counter(
        self, level: bool, method: str, series: str
    ) -> None:
        m = Metrics(topic_level=level)
        p = m.topic(NS, TOPIC)
        getattr(p, method)()
        getattr(p, method)()
        assert topic_value(m, series) == 2
        others = {
            "brk_ledgeroffloader_offload_error_total",
            "brk_ledgeroffloader_write_storage_error_total",
            "brk_ledgeroffloader_read_offload_error_total",
            "brk_ledgeroffloader_ledger_offload_limited_total",
            "offloadd_read_rereads_total",
        } - {series}
        assert all(topic_value(m, other) == 0 for other in others)

    def test_read_latencies_feed_pulsar_summaries_in_microseconds_and_histograms_in_seconds(
        self, level: bool,
    ) -> None:
        m = Metrics(topic_level=level)
        p = m.topic(NS, TOPIC)
        p.index_read(0.003)
        p.data_read(0.5)
        p.ledger_read(0.25)
        p.ledger_read(0.25)
        pulsar = "brk_ledgeroffloader_read_offload_{}_latency_sum"
        assert topic_value(m, pulsar.format("index")) == pytest.approx(3000)
        assert topic_value(m, pulsar.format("data")) == pytest.approx(500_000)
        assert topic_value(m, "brk_ledgeroffloader_read_ledger_latency_sum") == pytest.approx(5e5)
        assert topic_value(m, "brk_ledgeroffloader_read_ledger_latency_count") == 2
        ours = "offloadd_read_duration_seconds_sum"
        assert topic_value(m, ours, object="index") == pytest.approx(0.003)
        assert topic_value(m, ours, object="data") == pytest.approx(0.5)
        assert topic_value(m, "offloadd_source_read_duration_seconds_count") == 2

    def test_upload_latency_and_offload_time(self, level: bool) -> None:
        m = Metrics(topic_level=level)
        p = m.topic(NS, TOPIC)
        p.upload_latency(0.2)
        p.ledger_offload_time(2.0)
        assert topic_value(m, "offloadd_upload_duration_seconds_bucket", le="0.25") == 1
        assert topic_value(m, "offloadd_upload_duration_seconds_bucket", le="0.1") == 0
        assert topic_value(m, "brk_ledgeroffloader_ledger_offload_time_sum") == 2_000_000

    def test_throttle_wait_counts_seconds_and_limited_only_when_it_waited(
        self, level: bool
    ) -> None:
        m = Metrics(topic_level=level)
        p = m.topic(NS, TOPIC)
        p.throttle_wait(0.0)
        p.throttle_wait(0.5)
        p.throttle_wait(0.25)
        assert topic_value(m, "offloadd_throttle_wait_seconds_total") == 0.75
        assert topic_value(m, "brk_ledgeroffloader_ledger_offload_limited_total") == 2

    def test_deletions_are_counted_by_outcome(self, level: bool) -> None:
        m = Metrics(topic_level=level)
        p = m.topic(NS, TOPIC)
        p.delete_op()
        p.delete_op(succeeded=True)
        p.delete_op(succeeded=False)
        series = "brk_ledgeroffloader_delete_offload_ops_total"
        assert topic_value(m, series, status="succeed") == 2
        assert topic_value(m, series, status="failed") == 1

    def test_state_gauges_hold_the_latest_report(self, level: bool) -> None:
        now = [100.0]
        m = Metrics(topic_level=level, clock=lambda: now[0])
        p = m.topic(NS, TOPIC)
        p.segment_states(2, 5, 1)
        p.segment_states(0, 8, 0)
        p.lag(10, 2048, 3.5)
        p.last_offloaded(12, 345)
        p.ledger_reading_max_bytes(4 << 20)
        assert topic_value(m, "offloadd_segments", state="assigned") == 0
        assert topic_value(m, "offloadd_segments", state="offloaded") == 8
        assert topic_value(m, "offloadd_segments", state="failed") == 0
        assert topic_value(m, "offloadd_lag_entries") == 10
        assert topic_value(m, "offloadd_lag_bytes") == 2048
        assert topic_value(m, "offloadd_lag_seconds") == 3.5
        assert topic_value(m, "offloadd_last_offloaded_ledger") == 12
        assert topic_value(m, "offloadd_last_offloaded_entry") == 345
        assert topic_value(m, "brk_ledgeroffloader_ledger_reading_max_bytes") == 4 << 20
        # the lag loop leaves a quiet topic unmeasured (issue 22): its lag's age moves on
        now[0] += 60
        assert topic_value(m, "offloadd_lag_seconds") == 63.5
        p.lag(0, 0, 0.0)  # no lag: nothing ages
        now[0] += 60
        assert topic_value(m, "offloadd_lag_seconds") == 0.0

    def test_one_probe_per_topic_and_namespace_from_the_name(self, level: bool) -> None:
        m = Metrics(topic_level=level)
        assert m.topic(NS, TOPIC) is m.topic(NS, TOPIC)
        assert m.topic_named(TOPIC) is m.topic(NS, TOPIC)
        assert namespace_of("persistent://t1/ns1/x") == "t1/ns1"
        assert namespace_of("not a topic") == "unknown"


class TestPulsarRates:
    """Pulsar's *_rate gauges publish bytes/s averaged over each stats period."""

    def test_rate_is_published_once_the_period_has_passed(self, level: bool) -> None:
        clock = FakeClock()
        m = Metrics(topic_level=level, clock=clock, rate_period=60.0)
        p = m.topic(NS, TOPIC)
        p.offload_bytes(6000)
        p.read_offload(1200)
        clock.now += 30
        assert topic_value(m, "brk_ledgeroffloader_offload_rate") == 0
        clock.now += 30
        assert topic_value(m, "brk_ledgeroffloader_offload_rate") == pytest.approx(100)
        assert topic_value(m, "brk_ledgeroffloader_read_offload_rate") == pytest.approx(20)

    def test_scrapes_inside_a_period_see_the_last_published_value(self, level: bool) -> None:
        clock = FakeClock()
        m = Metrics(topic_level=level, clock=clock, rate_period=10.0)
        p = m.topic(NS, TOPIC)
        p.offload_bytes(1000)
        clock.now += 10
        assert topic_value(m, "brk_ledgeroffloader_offload_rate") == pytest.approx(100)
        p.offload_bytes(50_000)
        clock.now += 5
        assert topic_value(m, "brk_ledgeroffloader_offload_rate") == pytest.approx(100)
        clock.now += 5
        assert topic_value(m, "brk_ledgeroffloader_offload_rate") == pytest.approx(5000)


class TestProcessProbes:
    """Process-wide probes: buffer, throttle, store circuit, metadata, backfill, topics."""

    def test_buffer_and_throttle_limit(self, level: bool) -> None:
        m = Metrics(topic_level=level)
        m.buffer(100, 1000)
        m.throttle_limit(5e6)
        assert value(m, "offloadd_buffer_bytes") == 100
        assert value(m, "offloadd_buffer_capacity_bytes") == 1000
        assert value(m, "offloadd_throttle_limit_bytes_per_second") == 5e6

    def test_process_throttle_wait_reaches_the_topic_series(self, level: bool) -> None:
        m = Metrics(topic_level=level)
        m.topic(NS, TOPIC)
        m.throttle_wait(TOPIC, 1.5)
        assert topic_value(m, "offloadd_throttle_wait_seconds_total") == 1.5

    def test_exactly_one_circuit_state_is_set_per_store(self, level: bool) -> None:
        m = Metrics(topic_level=level)
        m.store_circuit("open")
        m.store_circuit("half_open")
        m.store_circuit("closed", store="metadata")
        states = {
            s: value(m, "offloadd_store_circuit_state", store="blobstore", state=s)
            for s in ("closed", "open", "half_open")
        }
        assert states == {"closed": 0, "open": 0, "half_open": 1}
        assert value(m, "offloadd_store_circuit_state", store="metadata", state="closed") == 1

    def test_metadata_writes(self, level: bool) -> None:
        m = Metrics(topic_level=level)
        m.metadata_writes()
        m.metadata_writes(4)
        assert value(m, "offloadd_metadata_writes_total") == 5

    def test_topics_gauge_and_build_info(self, level: bool) -> None:
        m = Metrics(topic_level=level)
        m.topic(NS, TOPIC)
        m.topic(NS, OTHER)
        assert value(m, "offloadd_topics") == 2
        text = exposition_text(m)
        assert re.search(r'^offloadd_build_info\{version="[^"]+"\} 1\.0$', text, re.M)


class TestRegistry:
    """One private registry per Metrics; topics can be forgotten; labels carry no secrets."""

    def test_nothing_lands_in_the_global_registry(self) -> None:
        populated()
        names = {s.name for fam in REGISTRY.collect() for s in fam.samples}
        assert not any(n.startswith(("brk_ledgeroffloader", "offloadd_")) for n in names)

    def test_two_instances_do_not_share_series(self) -> None:
        a, b = Metrics(), Metrics()
        a.topic(NS, TOPIC).offload_error()
        assert topic_value(a, "brk_ledgeroffloader_offload_error_total") == 1
        assert topic_value(b, "brk_ledgeroffloader_offload_error_total") is None

    def test_forgetting_a_topic_removes_only_its_series(self) -> None:
        m = populated()
        m.topic(NS, OTHER).offload_bytes(7)
        m.forget_topic(NS, TOPIC)
        text = exposition_text(m)
        assert f'topic="{TOPIC}"' not in text
        assert topic_value(m, "offloadd_offloaded_bytes_total", topic=OTHER) == 7
        assert value(m, "offloadd_topics") == 1
        m.topic(NS, TOPIC).offload_bytes(1)  # comes back fresh
        assert topic_value(m, "offloadd_offloaded_bytes_total") == 1

    def test_pulsar_series_are_exposed_under_pulsar_names(self) -> None:
        names = sample_names(exposition_text(populated()))
        expected = {
            "brk_ledgeroffloader_offload_error_total",
            "brk_ledgeroffloader_offload_rate",
            "brk_ledgeroffloader_read_offload_error_total",
            "brk_ledgeroffloader_read_offload_rate",
            "brk_ledgeroffloader_read_bytes_total",
            "brk_ledgeroffloader_write_storage_error_total",
            "brk_ledgeroffloader_read_offload_index_latency_count",
            "brk_ledgeroffloader_read_offload_index_latency_sum",
            "brk_ledgeroffloader_read_offload_data_latency_sum",
            "brk_ledgeroffloader_read_ledger_latency_sum",
            "brk_ledgeroffloader_delete_offload_ops_total",
            "brk_ledgeroffloader_ledger_offload_limited_total",
            "brk_ledgeroffloader_ledger_offload_time_sum",
            "brk_ledgeroffloader_ledger_reading_max_bytes",
        }
        assert expected <= names

    def test_labels_are_only_names_and_fixed_enumerations(self) -> None:
        allowed = {"namespace", "topic", "state", "status", "store", "object", "version"}
        allowed |= {"reason", "outcome"}  # the lakehouse's read-committed counts
        allowed |= {"le", "quantile"}
        m = populated()
        used = {k for fam in m.registry.collect() for s in fam.samples for k in s.labels}
        assert used <= allowed


class TestTopicLevel:
    """``[metrics] topic_level``: what a scrape holds per topic and per namespace at many topics
    (issue 22: <= 15 series per topic, no ``topic`` label when off, histograms per namespace)."""

    TOPICS = 300

    @staticmethod
    def scrape(level: bool | None, topics: int = TOPICS) -> tuple[Metrics, list[str]]:
        m = synthetic(topics, namespaces=10, topic_level=level)
        lines = [ln for ln in exposition_text(m).splitlines() if ln and not ln.startswith("#")]
        return m, lines

    def test_on_each_topic_has_at_most_15_series_and_distributions_are_per_namespace(
        self,
    ) -> None:
        _, lines = self.scrape(True)
        per_topic: dict[str, int] = {}
        for line in lines:
            if (t := re.search(r'topic="([^"]*)"', line)) is not None:
                per_topic[t.group(1)] = per_topic.get(t.group(1), 0) + 1
                assert not re.match(r"\w+_(bucket|sum|count|created)\{", line), line
        assert len(per_topic) == self.TOPICS
        assert max(per_topic.values()) <= 15
        # every series declared per topic is there for each topic; the lakehouse's five only
        # where the lakehouse projects the topic (issue 24: they come on top of the 15)
        assert min(per_topic.values()) == sum(1 for s in TABLE if s.level is Level.TOPIC
                                              and not s.name.startswith("offloadd_lakehouse_"))
        assert any(ln.startswith("offloadd_upload_duration_seconds_bucket{")
                   and 'namespace="tenant-0/ns-0"' in ln for ln in lines)

    def test_off_no_series_has_a_topic_label_and_the_size_does_not_grow_with_topics(
        self,
    ) -> None:
        _, few = self.scrape(False, topics=20)
        m, many = self.scrape(False)
        assert not [ln for ln in many if "topic=" in ln]
        assert len(many) == len(few)
        # the namespace totals are the sums of the topics' reports
        assert value(m, "offloadd_offloaded_entries_total", namespace="tenant-0/ns-0") == (
            8 * self.TOPICS / 10)
        # (the maximum, aged by the time since it was reported: lag is not re-measured while
        # nothing happens to a topic, issue 22)
        lag_s = value(m, "offloadd_lag_seconds", namespace="tenant-0/ns-0")
        assert lag_s is not None and 42.0 <= lag_s < 42.0 + 30

    def test_auto_is_per_topic_below_1000_topics_and_per_namespace_from_1000(self) -> None:
        m, lines = self.scrape(None, topics=999)
        assert m.topic_level_now() and any("topic=" in ln for ln in lines)
        assert value(m, "offloadd_metrics_topic_level") == 1
        m.topic("tenant-0/ns-0", "persistent://tenant-0/ns-0/one-more")
        assert not [ln for ln in exposition_text(m).splitlines() if "topic=" in ln]
        assert value(m, "offloadd_metrics_topic_level") == 0
        # back per topic only well below the limit: a count hovering there does not flap
        for i in range(50):
            m.forget_topic("tenant-0/ns-0", f"persistent://tenant-0/ns-0/topic-{i * 10:05d}")
        assert not m.topic_level_now()
        for i in range(500, 560):
            m.forget_topic(f"tenant-{i % 10}/ns-{i % 10}",
                           f"persistent://tenant-{i % 10}/ns-{i % 10}/topic-{i:05d}")
        assert m.topic_level_now()

    def test_a_topic_that_goes_away_leaves_no_series_and_its_counts_in_the_namespace(
        self, level: bool
    ) -> None:
        m = Metrics(topic_level=level)
        for t in (TOPIC, OTHER):
            p = m.topic(NS, t)
            p.offload_bytes(100, entries=1)
            p.lag(1, 2, 3.0)
        m.forget_topic(NS, TOPIC)
        text = exposition_text(m)
        assert f'topic="{TOPIC}"' not in text
        total = value(m, "offloadd_offloaded_bytes_total", namespace=NS)
        assert total == (None if level else 200)  # counters never go down per namespace
        assert value(m, "offloadd_lag_bytes", namespace=NS, **({"topic": OTHER} if level
                                                               else {})) == 2
        m.forget_topic(NS, OTHER)
        assert "topic=" not in exposition_text(m)

    def test_gc_of_a_topic_not_served_creates_no_topic_series(self, level: bool) -> None:
        m = Metrics(topic_level=level)
        m.topic_named(TOPIC).delete_op(False)
        m.throttle_wait(TOPIC, 0.5)
        assert "topic=" not in exposition_text(m)
        assert value(m, "offloadd_topics") == 0
        series_ = "brk_ledgeroffloader_delete_offload_ops_total"
        assert value(m, series_, namespace=NS, status="failed") == 1


class TestAdoptedSourceSeries:
    """The BookKeeper source's own series go through the same switch."""

    @pytest.mark.parametrize("level", [True, False], ids=["topic_level", "namespace_level"])
    def test_their_topic_label_becomes_the_namespace_when_off(self, level: bool) -> None:
        from offloadd.ledger.bookkeeper.metrics import BookKeeperMetrics

        m = Metrics(topic_level=level)
        bk = BookKeeperMetrics()
        m.adopt(bk)
        bk.set_lac_lag(TOPIC, 5)
        bk.set_lac_lag(OTHER, 7)
        bk.data_lost(TOPIC, 1, 10)
        bk.entries_read("bookie-1:3181", 3, 300, 0.01)
        text = exposition_text(m)
        lag = "offloadd_bookkeeper_lac_lag_entries"
        if level:
            assert value(m, lag, topic=TOPIC) == 5
        else:
            assert "topic=" not in text
            assert value(m, lag, namespace=NS) == 12
            assert value(m, "offloadd_bookkeeper_data_lost_entries_total", namespace=NS) == 10
        assert value(m, "offloadd_bookkeeper_entries_read_total", bookie="bookie-1:3181") == 3


class TestTopicLevelSetting:
    """``[metrics] topic_level``: a boolean or "auto" (the default), Pulsar's name accepted."""

    @pytest.mark.parametrize(("text", "expected"), [
        ("", "auto"),
        ('topic_level = "auto"', "auto"),
        ("topic_level = false", False),
        ("exposeTopicLevelMetricsInPrometheus = true", True),
    ])
    def test_file_values(self, tmp_path: Path, text: str, expected: bool | str) -> None:
        from offloadd import config

        path = tmp_path / "offloadd.toml"
        path.write_text(f"[metrics]\n{text}\n")
        assert config.load(path).metrics.topic_level == expected

    def test_environment_and_a_wrong_value(self, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
        from offloadd import config

        path = tmp_path / "offloadd.toml"
        path.write_text("")
        monkeypatch.setenv("OFFLOADD_METRICS__TOPIC_LEVEL", "false")
        assert config.load(path).metrics.topic_level is False
        monkeypatch.setenv("OFFLOADD_METRICS__TOPIC_LEVEL", "sometimes")
        with pytest.raises(ConfigError, match="topic_level"):
            config.load(path)


class TestExposition:
    """The text exposition lints clean; OpenMetrics is served when asked for."""

    @needs_promtool
    @pytest.mark.integration
    def test_promtool_check_metrics_passes(self, level: bool) -> None:
        result = promtool("check", "metrics", stdin=exposition_text(populated(level)))
        assert result.returncode == 0, result.stdout + result.stderr

    def test_openmetrics_on_request_names_counters_like_pulsar(self) -> None:
        body, ctype = populated().exposition("application/openmetrics-text; version=1.0.0")
        text = body.decode()
        assert ctype.startswith("application/openmetrics-text")
        assert text.endswith("# EOF\n")
        assert "# TYPE brk_ledgeroffloader_offload_error counter" in text
        assert "brk_ledgeroffloader_offload_error_total{" in text


class TestDeployFiles:
    """Alert rules and the dashboard are valid and query series that exist."""

    @needs_promtool
    @pytest.mark.integration
    def test_promtool_check_rules_passes(self) -> None:
        result = promtool("check", "rules", str(RULES))
        assert result.returncode == 0, result.stdout + result.stderr

    def test_rules_query_existing_series(self) -> None:
        names = sample_names(exposition_text(populated()))
        for alert, expr in rule_exprs().items():
            used = set(_METRIC_NAME.findall(expr))
            if alert in ("OffloaddDown", "OffloaddMissing"):  # Prometheus' own `up`
                assert not used and 'up{job="offloadd"}' in expr, alert
                continue
            assert used, alert
            assert used <= names, (alert, used - names)

    def test_rules_cover_the_required_alerts(self) -> None:
        assert {
            "OffloaddOffloadStalled",
            "OffloaddLagHigh",
            "OffloaddOffloadErrors",
            "OffloaddStorageWriteErrors",
            "OffloaddStoreCircuitOpen",
            "OffloaddThrottledMostOfTheTime",
            "OffloaddReadErrors",
            "OffloaddDown",
            "OffloaddMissing",
            "OffloaddDataLost",
        } <= set(rule_exprs())

    @needs_promtool
    @pytest.mark.integration
    def test_down_data_lost_and_read_error_alerts_fire(self, tmp_path: Path) -> None:
        """The alerts the dashboard could not show before: a dead target, a lost ledger, a
        read error every few minutes (the read-back check's pace)."""
        exprs = rule_exprs()
        case = {
            "rule_files": [],
            "evaluation_interval": "1m",
            "tests": [{
                "interval": "1m",
                "input_series": [
                    {"series": 'up{job="offloadd", instance="a"}', "values": "1x5 0x10"},
                    {"series": 'up{job="offloadd", instance="b"}', "values": "1x15"},
                    {"series": _s("offloadd_ledgers_lost_to_retention_total", "lost"),
                     "values": "0x5 1x10"},
                    {"series": _s("offloadd_ledgers_lost_to_retention_total", "fine"),
                     "values": "0x15"},
                    {"series": _s("brk_ledgeroffloader_read_offload_error_total", "bad"),
                     "values": "0+1x15"},
                ],
                "promql_expr_test": [
                    {"expr": exprs["OffloaddDown"], "eval_time": "10m", "exp_samples": [
                        {"labels": 'up{job="offloadd", instance="a"}', "value": 0}]},
                    {"expr": exprs["OffloaddDataLost"], "eval_time": "8m", "exp_samples": [
                        {"labels": _labels("lost"), "value": 1}]},
                    {"expr": exprs["OffloaddReadErrors"], "eval_time": "12m", "exp_samples": [
                        {"labels": '{namespace="ns"}', "value": 10}]},
                ],
            }],
        }
        test_file = tmp_path / "alerts-test.yml"
        test_file.write_text(yaml.safe_dump(case))
        result = promtool("test", "rules", str(test_file))
        assert result.returncode == 0, result.stdout + result.stderr

    @needs_promtool
    @pytest.mark.integration
    def test_alert_expressions_select_the_right_series(self, tmp_path: Path) -> None:
        exprs = rule_exprs()
        # 1-minute samples; "a+bxN" = a, a+b, ... for N steps.
        case = {
            "rule_files": [],
            "evaluation_interval": "1m",
            "tests": [
                {
                    "interval": "1m",
                    "input_series": [
                        # stalled: bytes flat, lag growing
                        {"series": _s("offloadd_offloaded_bytes_total", "stuck"), "values": "5x30"},
                        {"series": _s("offloadd_lag_bytes", "stuck"), "values": "0+100x30"},
                        # healthy: bytes moving, lag growing
                        {"series": _s("offloadd_offloaded_bytes_total", "ok"), "values": "0+9x30"},
                        {"series": _s("offloadd_lag_bytes", "ok"), "values": "0+100x30"},
                        # idle: nothing moves at all
                        {"series": _s("offloadd_offloaded_bytes_total", "idle"), "values": "5x30"},
                        {"series": _s("offloadd_lag_bytes", "idle"), "values": "0x30"},
                        # throttled 90% vs 50% of the time (54 s and 30 s per minute)
                        {
                            "series": _s("offloadd_throttle_wait_seconds_total", "stuck"),
                            "values": "0+54x30",
                        },
                        {
                            "series": _s("offloadd_throttle_wait_seconds_total", "ok"),
                            "values": "0+30x30",
                        },
                        {
                            "series": 'offloadd_store_circuit_state{instance="i",'
                            'store="blobstore",state="open"}',
                            "values": "1x30",
                        },
                        {
                            "series": 'offloadd_store_circuit_state{instance="i",'
                            'store="metadata",state="open"}',
                            "values": "0x30",
                        },
                    ],
                    "promql_expr_test": [
                        {
                            "expr": exprs["OffloaddOffloadStalled"],
                            "eval_time": "20m",
                            "exp_samples": [{"labels": _labels("stuck"), "value": 0}],
                        },
                        {
                            "expr": exprs["OffloaddThrottledMostOfTheTime"],
                            "eval_time": "20m",
                            "exp_samples": [{"labels": _labels("stuck"), "value": 0.9}],
                        },
                        {
                            "expr": exprs["OffloaddStoreCircuitOpen"],
                            "eval_time": "20m",
                            "exp_samples": [
                                {"labels": '{instance="i", store="blobstore"}', "value": 1}
                            ],
                        },
                    ],
                }
            ],
        }
        test_file = tmp_path / "rules-test.yml"
        test_file.write_text(yaml.safe_dump(case))
        result = promtool("test", "rules", str(test_file))
        assert result.returncode == 0, result.stdout + result.stderr

    @needs_promtool
    @pytest.mark.integration
    def test_alerts_fire_per_namespace_when_topic_series_are_off(self, tmp_path: Path) -> None:
        """topic_level = false: the same rules, over series with no topic label."""
        exprs = rule_exprs()

        def ns(name: str, extra: str = "") -> str:
            return f'{name}{{namespace="ns"{extra}}}'

        series = [
            (ns("offloadd_offloaded_bytes_total"), "5x30"),
            (ns("offloadd_lag_bytes"), "0+100x30"),
            (ns("offloadd_lag_seconds"), "2000x30"),
            (ns("offloadd_segments", ',state="failed"'), "1x30"),
            (ns("offloadd_ledgers_lost_to_retention_total"), "0x5 1x25"),
            (ns("brk_ledgeroffloader_offload_error_total"), "0+6x30"),
        ]
        expected = (("OffloaddOffloadStalled", 0), ("OffloaddLagHigh", 2000),
                    ("OffloaddSegmentsFailed", 1), ("OffloaddDataLost", 1),
                    ("OffloaddOffloadErrors", 0.1))
        case = {"rule_files": [], "evaluation_interval": "1m", "tests": [{
            "interval": "1m",
            "input_series": [{"series": name, "values": v} for name, v in series],
            "promql_expr_test": [
                {"expr": exprs[alert], "eval_time": "20m",
                 "exp_samples": [{"labels": '{namespace="ns"}', "value": v}]}
                for alert, v in expected],
        }]}
        test_file = tmp_path / "namespace-test.yml"
        test_file.write_text(yaml.safe_dump(case))
        result = promtool("test", "rules", str(test_file))
        assert result.returncode == 0, result.stdout + result.stderr

    @pytest.mark.parametrize("level", [True, False], ids=["topic_level", "namespace_level"])
    def test_dashboard_and_rules_query_series_that_exist_in_both_modes(self, level: bool) -> None:
        names = sample_names(exposition_text(populated(level))) | backfill_names()
        for query in dashboard_queries() + list(rule_exprs().values()):
            assert set(_METRIC_NAME.findall(query)) <= names, query

    def test_dashboard_parses_and_has_the_required_panels(self) -> None:
        titles = {p["title"] for p in dashboard()["panels"] if p["type"] != "row"}
        for wanted in (
            "Offload rate",
            "Lag (time)",
            "Offload and storage errors",
            "Throttle wait",
            "Offload buffer",
            "Segments by state",
            "Upload latency",
            "Read latency",
            "Store circuit",
        ):
            assert wanted in titles

    def test_dashboard_queries_existing_series(self) -> None:
        names = sample_names(exposition_text(populated())) | backfill_names()
        for query in dashboard_queries():
            used = set(_METRIC_NAME.findall(query))
            assert used, query
            assert used <= names, (query, used - names)

    @needs_promtool
    @pytest.mark.integration
    def test_dashboard_queries_are_valid_promql(self, tmp_path: Path) -> None:
        exprs = [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]
        # Grafana's variables, replaced by what they expand to with "All" selected.
        substituted = [
            re.sub(r"\$(namespace|topic|instance)", ".*", e.replace("$__rate_interval", "5m"))
            for e in exprs
        ]
        doc = {
            "groups": [
                {
                    "name": "dashboard",
                    "rules": [
                        {"record": f"dashboard:query_{i}", "expr": e}
                        for i, e in enumerate(substituted)
                    ],
                }
            ]
        }
        path = tmp_path / "dashboard-queries.yml"
        path.write_text(yaml.safe_dump(doc))
        result = promtool("check", "rules", str(path))
        assert result.returncode == 0, result.stdout + result.stderr


def _s(name: str, topic: str) -> str:
    return f'{name}{{namespace="ns",topic="{topic}"}}'


def _labels(topic: str) -> str:
    return f'{{namespace="ns", topic="{topic}"}}'


# -- HTTP endpoint ----------------------------------------------------------------------------


ReadyFn = Callable[[], Awaitable[tuple[bool, str]]]


def ready_with(answer: tuple[bool, str]) -> ReadyFn:
    async def ready() -> tuple[bool, str]:
        return answer

    return ready


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


async def started(ready: ReadyFn, **kw: Any) -> MetricsServer:
    server = MetricsServer("127.0.0.1:0", metrics=populated(), ready=ready, **kw)
    await server.start()
    return server


@pytest.mark.timeout(30)
class TestMetricsServer:
    """The endpoint serves the registry and health on loopback and explains failures."""

    async def test_serves_metrics_health_and_readiness(self, http: aiohttp.ClientSession) -> None:
        server = await started(ready_with((True, "3 topics owned")))
        try:
            assert server.state is ServerState.OPENED
            async with http.get(server.url + "/metrics") as resp:
                assert resp.status == 200
                assert resp.headers["Content-Type"].startswith("text/plain")
                text = await resp.text()
            assert "brk_ledgeroffloader_offload_error_total{" in text
            async with http.get(server.url + "/healthz") as resp:
                assert (resp.status, await resp.text()) == (200, "ok\n")
            async with http.get(server.url + "/readyz") as resp:
                assert (resp.status, await resp.text()) == (200, "3 topics owned\n")
        finally:
            await server.stop()
        assert server.state.value == "closed"  # (mypy keeps the OPENED narrowing otherwise)

    async def test_negotiates_openmetrics(self, http: aiohttp.ClientSession) -> None:
        server = await started(ready_with((True, "")))
        try:
            accept = {"Accept": "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"}
            async with http.get(server.url + "/metrics", headers=accept) as resp:
                assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
                assert (await resp.text()).endswith("# EOF\n")
        finally:
            await server.stop()

    async def test_not_ready_answers_503_with_the_reason(self, http: aiohttp.ClientSession) -> None:
        server = await started(ready_with((False, "metadata store unreachable")))
        try:
            async with http.get(server.url + "/readyz") as resp:
                assert resp.status == 503
                assert await resp.text() == "metadata store unreachable\n"
            async with http.get(server.url + "/healthz") as resp:
                assert resp.status == 200
        finally:
            await server.stop()

    async def test_failing_or_hanging_readiness_check_answers_503(
        self, http: aiohttp.ClientSession
    ) -> None:
        async def broken() -> tuple[bool, str]:
            raise RuntimeError("boom")

        async def hanging() -> tuple[bool, str]:
            await asyncio.Event().wait()
            return True, ""

        for check, reason in ((broken, "RuntimeError: boom"), (hanging, "did not answer")):
            server = await started(check, ready_timeout=0.2)
            try:
                async with http.get(server.url + "/readyz") as resp:
                    assert resp.status == 503
                    assert reason in await resp.text()
            finally:
                await server.stop()

    async def test_bind_error_names_the_address(self) -> None:
        first = await started(ready_with((True, "")))
        try:
            bind = f"127.0.0.1:{first.port}"
            second = MetricsServer(bind, metrics=Metrics(), ready=ready_with((True, "")))
            # a port in use is not a configuration error: the daemon exits 75, restarted
            with pytest.raises(PortBusy, match=re.escape(bind)):
                await second.start()
            assert second.state is ServerState.CLOSED
        finally:
            await first.stop()

    async def test_lifecycle_refuses_restart(self) -> None:
        server = await started(ready_with((True, "")))
        with pytest.raises(RuntimeError, match="opened"):
            await server.start()
        await server.stop()
        await server.stop()  # idempotent
        with pytest.raises(RuntimeError, match="closed"):
            await server.start()

    def test_default_bind_is_loopback(self) -> None:
        server = MetricsServer(metrics=Metrics(), ready=ready_with((True, "")))
        assert server._host == "127.0.0.1"

    @pytest.mark.parametrize("bad", ["9105", "localhost", ":9105", "127.0.0.1:http", "h:70000"])
    def test_malformed_bind_is_a_config_error(self, bad: str) -> None:
        with pytest.raises(ConfigError, match="bind"):
            parse_bind(bad)

    def test_bind_forms(self) -> None:
        assert parse_bind("127.0.0.1:9105") == ("127.0.0.1", 9105)
        assert parse_bind("[::1]:0") == ("::1", 0)
        assert parse_bind("0.0.0.0:80") == ("0.0.0.0", 80)


# -- a daemon that stops serving a topic ---------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("level", [True, False], ids=["topic_level", "namespace_level"])
async def test_a_topic_the_daemon_stops_serving_leaves_no_series(
        tmp_path: Path, level: bool) -> None:
    """A real daemon offloads two topics; one stops being served (its task ends as in a handover
    to another daemon, and the configuration no longer names it, so it is not picked up again):
    none of its series stays behind, and its counts stay in the namespace's."""
    from offloadd import wiring
    from offloadd.blobstore.base import StoreView
    from offloadd.blobstore.memory import MemoryBlobStore
    from offloadd.config import Settings
    from offloadd.ledger.local import LocalLedgerStore, RolloverPolicy
    from offloadd.metadata.memory import MemoryMetadataStore
    from offloadd.model import TopicName
    from offloadd.shell.daemon import Daemon

    kept, dropped = TopicName.parse(OTHER), TopicName.parse(TOPIC)
    md = MemoryMetadataStore()
    store = LocalLedgerStore(tmp_path / "ledgers", md, RolloverPolicy(max_entries=20))
    for topic in (kept, dropped):
        for _ in range(50):
            await store.writer.append(topic, [b"x" * 100])
    settings = Settings(metrics={"enabled": False},
                        offload={"max_segment_rollover_time_minutes": 0.005},
                        daemon={"lag_interval_s": 0.1, "status_interval_s": 0.2})
    metrics = Metrics(topic_level=level)
    daemon = Daemon(settings, source=wiring.local_view(store.source), metadata=md,
                    tier=StoreView(MemoryBlobStore()), discovery_interval_s=0.1,
                    probe_factory=lambda t: metrics.topic(t.ns, str(t)), metrics=metrics)
    running = asyncio.create_task(daemon.run(install_signals=False))

    def entries() -> float:  # the namespace's, in either mode
        return sum(s.value for fam in metrics.registry.collect() for s in fam.samples
                   if s.name == "offloadd_offloaded_entries_total")

    try:
        async with asyncio.timeout(40):
            while entries() < 80:
                await asyncio.sleep(0.05)
            assert (f'topic="{TOPIC}"' in exposition_text(metrics)) is level
            before = entries()
            daemon.reload(settings.model_copy(update={
                "source": settings.source.model_copy(update={"topics": (OTHER,)})}))
            daemon.topics[dropped].offloader.request_stop()
            while dropped in daemon.topics:
                await asyncio.sleep(0.05)
        text = exposition_text(metrics)
        assert f'topic="{TOPIC}"' not in text
        assert (f'topic="{OTHER}"' in text) is level
        assert value(metrics, "offloadd_topics") == 1
        if not level:
            assert entries() >= before  # the dropped topic's entries still count
    finally:
        daemon.request_stop()
        await asyncio.wait_for(running, 30)
        await store.close()
