"""The operator's HTTP endpoint: ``/metrics``, ``/healthz``, ``/readyz``.

==========  =====================================================================================
path        answer
==========  =====================================================================================
/metrics    the :class:`~offloadd.metrics.Metrics` registry; Prometheus text format, or
            OpenMetrics when the scraper's ``Accept`` header asks for it
/healthz    ``200 ok`` whenever the event loop is running (it answers from the loop)
/readyz     ``200`` and the reason when ``ready()`` returns ``(True, reason)``; ``503`` and the
            reason when it returns False, raises, or takes longer than ``ready_timeout``
/status     the daemon's live state as JSON (topics, positions, buffer, store circuit), when a
            ``status`` callable is given; ``offloadd status`` merges it in
==========  =====================================================================================

Binds to loopback by default (``[metrics] bind = "127.0.0.1:9105"``); listening on other
interfaces must be asked for explicitly (``0.0.0.0:9105``). Lifecycle: ``UNOPENED`` →
``start()`` → ``OPENED`` → ``stop()`` → ``CLOSED``; a stopped server is not restarted.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from offloadd.errors import ConfigError
from offloadd.metrics import Metrics

__all__ = ["DEFAULT_BIND", "MetricsServer", "ReadyCheck", "ServerState", "parse_bind"]

DEFAULT_BIND = "127.0.0.1:9105"

ReadyCheck = Callable[[], Awaitable[tuple[bool, str]]]


class ServerState(enum.Enum):
    UNOPENED = "unopened"
    OPENED = "opened"
    CLOSED = "closed"


def parse_bind(bind: str) -> tuple[str, int]:
    """``host:port`` or ``[v6addr]:port`` → (host, port). Port 0 picks a free port."""
    host, sep, port_text = bind.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ConfigError(
            f"[metrics] bind = {bind!r} is not HOST:PORT (e.g. 127.0.0.1:9105, [::1]:9105, "
            "or 0.0.0.0:9105 to listen on every interface)"
        )
    return host, int(port_text)


class MetricsServer:
    """aiohttp server for the three endpoints; see the module docstring."""

    def __init__(
        self,
        bind: str = DEFAULT_BIND,
        *,
        metrics: Metrics,
        ready: ReadyCheck,
        ready_timeout: float = 5.0,
        status: Callable[[], Mapping[str, Any]] | None = None,
    ) -> None:
        self._bind = bind
        self._host, self._port = parse_bind(bind)
        self._metrics = metrics
        self._ready = ready
        self._ready_timeout = ready_timeout
        self._status = status
        self._runner: web.AppRunner | None = None
        self.state = ServerState.UNOPENED

    @property
    def port(self) -> int:
        """The port actually listened on (differs from the configured one when that was 0)."""
        if self._runner is None:
            raise RuntimeError("metrics server is not started")
        for address in self._runner.addresses:
            return int(address[1])
        raise RuntimeError("metrics server has no listening socket")

    @property
    def url(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        if self.state is not ServerState.UNOPENED:
            raise RuntimeError(f"metrics server cannot start: it is {self.state.value}")
        app = web.Application()
        app.router.add_get("/metrics", self._handle_metrics)
        app.router.add_get("/healthz", self._handle_healthz)
        app.router.add_get("/readyz", self._handle_readyz)
        if self._status is not None:
            app.router.add_get("/status", self._handle_status)
        # Scrapes every few seconds would flood the log; handle_signals: the daemon owns signals.
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        try:
            await web.TCPSite(runner, self._host, self._port).start()
        except OSError as e:
            await runner.cleanup()
            self.state = ServerState.CLOSED
            reason = e.strerror or str(e)
            raise ConfigError(
                f"metrics server cannot listen on {self._bind} ([metrics] bind): {reason}"
            ) from e
        self._runner = runner
        self.state = ServerState.OPENED

    async def stop(self) -> None:
        """Close the listener; idempotent."""
        runner, self._runner = self._runner, None
        self.state = ServerState.CLOSED
        if runner is not None:
            await runner.cleanup()

    async def _handle_metrics(self, request: web.Request) -> web.Response:
        # Rendering thousands of series is CPU work measured in tens of milliseconds; a worker
        # thread keeps it off the loop that paces uploads (the registry is thread-safe).
        body, content_type = await asyncio.to_thread(
            self._metrics.exposition, request.headers.get("Accept")
        )
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def _handle_healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _handle_status(self, request: web.Request) -> web.Response:
        assert self._status is not None
        return web.json_response(dict(self._status()))

    async def _handle_readyz(self, request: web.Request) -> web.Response:
        try:
            ok, reason = await asyncio.wait_for(self._ready(), self._ready_timeout)
        except TimeoutError:
            ok, reason = False, f"readiness check did not answer within {self._ready_timeout:g} s"
        except Exception as e:  # the probe must answer whatever the check does
            ok, reason = False, f"readiness check failed: {type(e).__name__}: {e}"
        return web.Response(status=200 if ok else 503, text=f"{reason or 'ready'}\n")
