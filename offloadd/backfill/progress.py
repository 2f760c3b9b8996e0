"""Progress of a running backfill: a terminal bar on stderr and Prometheus gauges.

:class:`Progress` holds the counts (segments planned / running / offloaded / failed attempts,
bytes planned / offloaded) and fans every change out to its sinks. The bar redraws one line
in place on a terminal (at most every ``min_interval`` seconds) and prints one line per committed
segment otherwise (logs, CI)::

    backfill public/default/orders [##########----------]  5/10 segments  320.0/640.0 MiB
        41.3 MiB/s  ETA 0:00:08

The gauges (labels ``namespace``, ``topic``) live in their own registry, served over HTTP for the
duration of the backfill when a bind address is given:

    offloadd_backfill_segments{state="planned|running|offloaded"}
    offloadd_backfill_bytes{kind="planned|offloaded"}
    offloadd_backfill_attempt_failures_total
    offloadd_backfill_throughput_bytes_per_second, offloadd_backfill_eta_seconds
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any, Protocol

from offloadd.model import TopicName
from offloadd.model.hostport import HostPort
from offloadd.model.sizes import MiB

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Snapshot:
    planned: int
    running: int
    offloaded: int
    failed_attempts: int
    planned_bytes: int
    offloaded_bytes: int
    elapsed_s: float

    @property
    def rate(self) -> float:
        """Bytes per second since the start; 0 before any segment is done."""
        return self.offloaded_bytes / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        left = self.planned_bytes - self.offloaded_bytes
        if left <= 0:
            return 0.0
        return left / self.rate if self.rate > 0 else None


class Sink(Protocol):
    def show(self, snap: Snapshot, *, final: bool = False) -> None: ...


class Progress:
    """The counts of one backfill; every change is pushed to the sinks."""

    def __init__(self, sinks: list[Sink], clock: Callable[[], float] = time.monotonic) -> None:
        self._sinks = sinks
        self._clock = clock
        self._t0 = clock()
        self.planned = self.running = self.offloaded = self.failed_attempts = 0
        self.planned_bytes = self.offloaded_bytes = 0

    def plan(self, segments: int, nbytes: int) -> None:
        self.planned, self.planned_bytes = segments, nbytes
        self._t0 = self._clock()
        self._push()

    def set_running(self, n: int) -> None:
        if n != self.running:
            self.running = n
            self._push()

    def segment_offloaded(self, nbytes: int) -> None:
        self.offloaded += 1
        self.offloaded_bytes += nbytes
        self._push()

    def attempt_failed(self) -> None:
        self.failed_attempts += 1
        self._push()

    def tick(self) -> None:
        self._push()

    def finish(self) -> None:
        self._push(final=True)

    def snapshot(self) -> Snapshot:
        return Snapshot(self.planned, self.running, self.offloaded, self.failed_attempts,
                        self.planned_bytes, self.offloaded_bytes, self._clock() - self._t0)

    def _push(self, final: bool = False) -> None:
        snap = self.snapshot()
        for s in self._sinks:
            s.show(snap, final=final)


def render(label: str, snap: Snapshot, width: int = 24) -> str:
    """One progress line (pure)."""
    frac = snap.offloaded_bytes / snap.planned_bytes if snap.planned_bytes else 1.0
    filled = min(int(frac * width), width)
    eta = snap.eta_s
    eta_text = "--:--:--" if eta is None else _hms(eta)
    failed = f"  {snap.failed_attempts} failed attempt(s)" if snap.failed_attempts else ""
    return (f"backfill {label} [{'#' * filled}{'-' * (width - filled)}] "
            f"{snap.offloaded}/{snap.planned} segments  "
            f"{snap.offloaded_bytes / MiB:.1f}/{snap.planned_bytes / MiB:.1f} MiB  "
            f"{snap.rate / MiB:.1f} MiB/s  ETA {eta_text}{failed}")


def _hms(seconds: float) -> str:
    s = int(seconds + 0.5)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class TerminalBar:
    """Redraws in place on a terminal; one line per finished segment elsewhere."""

    def __init__(self, label: str, stream: IO[str] | None = None, *, tty: bool | None = None,
                 min_interval: float = 0.2, clock: Callable[[], float] = time.monotonic) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self._min_interval = min_interval
        self._clock = clock
        self._last_draw = float("-inf")
        self._last_done = -1
        self._last_line = ""

    def show(self, snap: Snapshot, *, final: bool = False) -> None:
        line = render(self.label, snap)
        if self.tty:
            now = self._clock()
            if not final and now - self._last_draw < self._min_interval:
                return
            self._last_draw = now
            self.stream.write("\r\x1b[2K" + line + ("\n" if final else ""))
        elif snap.offloaded != self._last_done or (final and line != self._last_line):
            self._last_done = snap.offloaded
            self._last_line = line
            self.stream.write(line + "\n")
        self.stream.flush()


class MetricsSink:
    """Prometheus gauges of one topic's backfill, in a private registry."""

    def __init__(self, topic: TopicName) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = CollectorRegistry()
        labels = {"namespace": topic.ns, "topic": str(topic)}
        names = ["namespace", "topic"]
        seg = Gauge("offloadd_backfill_segments", "Backfill segments by state",
                    [*names, "state"], registry=self.registry)
        nbytes = Gauge("offloadd_backfill_bytes", "Backfill frame bytes planned and offloaded",
                       [*names, "kind"], registry=self.registry)
        self._failures = Counter("offloadd_backfill_attempt_failures",
                                 "Backfill segment attempts that failed (each is redone)",
                                 names, registry=self.registry).labels(**labels)
        self._rate = Gauge("offloadd_backfill_throughput_bytes_per_second",
                           "Backfill bytes offloaded per second since the start", names,
                           registry=self.registry).labels(**labels)
        self._eta = Gauge("offloadd_backfill_eta_seconds",
                          "Estimated seconds until the backfill is done (-1: unknown)", names,
                          registry=self.registry).labels(**labels)
        self._seg = {s: seg.labels(**labels, state=s) for s in ("planned", "running",
                                                                "offloaded")}
        self._bytes = {k: nbytes.labels(**labels, kind=k) for k in ("planned", "offloaded")}
        self._failed_seen = 0
        self._server: Any = None
        self.url: str | None = None

    def show(self, snap: Snapshot, *, final: bool = False) -> None:
        self._seg["planned"].set(snap.planned)
        self._seg["running"].set(snap.running)
        self._seg["offloaded"].set(snap.offloaded)
        self._bytes["planned"].set(snap.planned_bytes)
        self._bytes["offloaded"].set(snap.offloaded_bytes)
        if snap.failed_attempts > self._failed_seen:
            self._failures.inc(snap.failed_attempts - self._failed_seen)
            self._failed_seen = snap.failed_attempts
        self._rate.set(snap.rate)
        eta = snap.eta_s
        self._eta.set(-1 if eta is None else eta)

    def serve(self, bind: str) -> bool:
        """Serve ``/metrics`` on ``host:port`` until :meth:`stop`. A port already taken (by a
        daemon on the same host, whose port is the default) is followed by the next one,
        which is logged; False (logged) if neither is free."""
        from prometheus_client import start_http_server

        where = HostPort.parse(bind, allow_zero=True)
        host = where.host
        for p in (where.port, where.port + 1):
            try:
                self._server, _thread = start_http_server(p, host, registry=self.registry)
            except OSError as exc:
                log.warning("backfill metrics not served on %s:%d: %s", host, p, exc)
                continue
            self.url = f"http://{host}:{self._server.server_port}/metrics"
            log.info("backfill progress gauges on %s", self.url)
            return True
        return False

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
