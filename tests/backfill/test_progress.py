"""The backfill's progress: the line it draws, the bar's two modes, and the gauges."""

from __future__ import annotations

import io

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from offloadd.backfill.progress import MetricsSink, Progress, Snapshot, TerminalBar, render
from offloadd.model import TopicName

MiB = 1024 * 1024
TOPIC = TopicName.parse("persistent://public/default/orders")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class TestRender:
    """One line: bar, segments, bytes, rate and ETA."""

    def test_half_way_shows_half_a_bar_and_the_time_left_at_the_rate_so_far(self) -> None:
        snap = Snapshot(planned=10, running=2, offloaded=5, failed_attempts=0,
                        planned_bytes=640 * MiB, offloaded_bytes=320 * MiB, elapsed_s=8.0)
        line = render("t", snap, width=10)
        assert line == ("backfill t [#####-----] 5/10 segments  320.0/640.0 MiB  40.0 MiB/s  "
                        "ETA 0:00:08")

    def test_before_anything_is_done_the_eta_is_unknown_and_failures_are_named(self) -> None:
        snap = Snapshot(3, 1, 0, 2, 30 * MiB, 0, 1.0)
        line = render("t", snap, width=4)
        assert "[----]" in line and "ETA --:--:--" in line and "2 failed attempt(s)" in line


class TestTerminalBar:
    """In place on a terminal; one line per committed segment elsewhere."""

    def test_without_a_terminal_each_committed_segment_prints_one_line(self) -> None:
        out = io.StringIO()
        clock = Clock()
        p = Progress([TerminalBar("t", out, tty=False)], clock=clock)
        p.plan(2, 2 * MiB)
        p.set_running(2)
        p.tick()
        clock.now += 1
        p.segment_offloaded(MiB)
        p.segment_offloaded(MiB)
        p.finish()
        lines = out.getvalue().splitlines()
        assert [ln.split("] ")[1].split("  ")[0] for ln in lines] == [
            "0/2 segments", "1/2 segments", "2/2 segments"]

    def test_on_a_terminal_the_line_is_redrawn_at_most_every_interval(self) -> None:
        out = io.StringIO()
        clock = Clock()
        p = Progress([TerminalBar("t", out, tty=True, min_interval=1.0, clock=clock)],
                     clock=clock)
        p.plan(4, 4 * MiB)
        p.set_running(2)  # within the interval: not drawn
        clock.now += 2
        p.segment_offloaded(MiB)
        p.finish()
        text = out.getvalue()
        assert text.count("\r\x1b[2K") == 3 and text.endswith("\n")
        assert "1/4 segments" in text


class TestMetrics:
    """The gauges follow the counts, labelled by namespace and topic."""

    def test_gauges_report_segments_bytes_failures_and_eta(self) -> None:
        sink = MetricsSink(TOPIC)
        clock = Clock()
        p = Progress([sink], clock=clock)
        p.plan(4, 4 * MiB)
        p.set_running(2)
        p.attempt_failed()
        clock.now += 2
        p.segment_offloaded(MiB)
        p.set_running(0)
        got = {(smp.name, smp.labels.get("state") or smp.labels.get("kind")): smp.value
               for fam in text_string_to_metric_families(generate_latest(sink.registry).decode())
               for smp in fam.samples
               if smp.labels.get("topic") == str(TOPIC)
               and smp.labels.get("namespace") == "public/default"}
        assert got[("offloadd_backfill_segments", "planned")] == 4
        assert got[("offloadd_backfill_segments", "offloaded")] == 1
        assert got[("offloadd_backfill_segments", "running")] == 0
        assert got[("offloadd_backfill_bytes", "offloaded")] == MiB
        assert got[("offloadd_backfill_attempt_failures_total", None)] == 1
        assert got[("offloadd_backfill_eta_seconds", None)] == 6.0
        assert got[("offloadd_backfill_throughput_bytes_per_second", None)] == MiB / 2
