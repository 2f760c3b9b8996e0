"""The operator's HTTP endpoint: ``/metrics``, ``/healthz``, ``/readyz``, ``/status``, and
``POST /offload-now``.

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
POST        close open segments now (``offloadd offload-now --url``), when an ``offload_now``
/offload-   callable is given. JSON body, every key optional: ``{"topics": ["persistent://..."],
now         "wait": true, "timeout_s": 300, "metadata": "zk://..."}``; answers ``{"ok": bool,
            "results": [...]}``. ``topics`` absent (or null) means every topic; an empty list
            names none and is refused (400), as is any body that is not such an object
            (malformed or too deeply nested JSON included). ``409`` when ``metadata`` names
            another deployment than this daemon's (``/status``'s ``metadata``): nothing is done.
            Without ``control_token`` only loopback clients may call it (403 otherwise); with
            one, every caller must send ``Authorization: Bearer <token>`` (401 otherwise)
==========  =====================================================================================

Binds to loopback by default (``[metrics] bind = "127.0.0.1:9105"``); listening on other
interfaces must be asked for explicitly (``0.0.0.0:9105``). A malformed HTTP request (junk, a
port scanner, TLS to the plain port) is logged as one WARNING line without a traceback, at most
once a minute with the count of those not logged (:class:`_QuietServerLog`).
Lifecycle: ``UNOPENED`` → ``start()`` → ``OPENED`` → ``stop()`` → ``CLOSED``; a stopped
server is not restarted.
"""

from __future__ import annotations

import asyncio
import enum
import errno
import hmac
import ipaddress
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from offloadd.errors import ConfigError, OffloaddError
from offloadd.metrics import Metrics
from offloadd.model.hostport import HostPort

__all__ = ["DEFAULT_BIND", "MetricsServer", "PortBusy", "ReadyCheck", "ServerState",
           "parse_bind"]

log = logging.getLogger(__name__)

DEFAULT_BIND = "127.0.0.1:9105"

ReadyCheck = Callable[[], Awaitable[tuple[bool, str]]]
# (topics or None for the default set, wait, timeout seconds) -> per-topic result dicts;
# ValueError for a bad topic name (400)
OffloadNowFn = Callable[[list[str] | None, bool, float],
                        Awaitable[list[Mapping[str, Any]]]]
_MAX_WAIT_S = 3600.0
_BAD_REQUEST_LOG_EVERY_S = 60.0


class _QuietServerLog:
    """The ``logger`` aiohttp's request handler logs through. aiohttp logs every request it
    cannot parse with ``logger.exception`` — an ERROR and a traceback per request, a flood for
    anyone who reaches the port. Those become one WARNING line, at most one per
    :data:`_BAD_REQUEST_LOG_EVERY_S` with the number left out; every other exception (a bug in
    a handler) is still logged in full."""

    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger
        self._next = 0.0  # monotonic time from which the next bad request is logged
        self._quiet = 0   # bad requests not logged since the last line

    def exception(self, msg: str, *args: object, exc_info: object = True,
                  **kw: Any) -> None:
        if not isinstance(exc_info, HttpProcessingError):
            self._log.exception(msg, *args, exc_info=exc_info, **kw)  # type: ignore[arg-type]
            return
        now = time.monotonic()
        if now < self._next:
            self._quiet += 1
            return
        more = f" ({self._quiet} more since the last such line)" if self._quiet else ""
        self._quiet, self._next = 0, now + _BAD_REQUEST_LOG_EVERY_S
        text = " ".join(str(exc_info.message or exc_info).split())[:200]
        self._log.warning(msg % args + ": malformed HTTP request (%d %s)%s", exc_info.code,
                          text, more)

    def debug(self, msg: str, *args: object, **kw: Any) -> None:
        kw.pop("exc_info", None)  # aiohttp's non-HTTP-traffic case: no traceback either
        self._log.debug(msg, *args, **kw)

    def warning(self, msg: str, *args: object, **kw: Any) -> None:
        self._log.warning(msg, *args, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)


class PortBusy(OffloaddError):
    """The metrics port stayed in use for all of ``[metrics] bind_retry_s``. Not a
    configuration error (exit 2, which the systemd unit never restarts): the process exits
    with :attr:`exit_code`, 75 (``EX_TEMPFAIL``), and a restart may find the port free."""

    exit_code = 75


class ServerState(enum.Enum):
    UNOPENED = "unopened"
    OPENED = "opened"
    CLOSED = "closed"


def parse_bind(bind: str) -> tuple[str, int]:
    """``host:port`` or ``[v6addr]:port`` → (host, port). Port 0 picks a free port."""
    try:
        hp = HostPort.parse(bind, allow_zero=True)
    except ValueError:
        raise ConfigError(
            f"[metrics] bind = {bind!r} is not HOST:PORT (e.g. 127.0.0.1:9105, [::1]:9105, "
            "or 0.0.0.0:9105 to listen on every interface)"
        ) from None
    return hp.host, hp.port


class MetricsServer:
    """aiohttp server for the endpoints in the module docstring."""

    def __init__(
        self,
        bind: str = DEFAULT_BIND,
        *,
        metrics: Metrics,
        ready: ReadyCheck,
        ready_timeout: float = 5.0,
        status: Callable[[], Mapping[str, Any]] | None = None,
        offload_now: OffloadNowFn | None = None,
        control_token: str | None = None,
        bind_retry_s: float = 0.0,
    ) -> None:
        self._bind = bind
        self._bind_retry_s = bind_retry_s
        self._host, self._port = parse_bind(bind)
        self._metrics = metrics
        self._ready = ready
        self._ready_timeout = ready_timeout
        self._status = status
        self._offload_now = offload_now
        self._token = control_token or None
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
        if self._offload_now is not None:
            app.router.add_post("/offload-now", self._handle_offload_now)
        # Scrapes every few seconds would flood the log; handle_signals: the daemon owns signals.
        runner = web.AppRunner(app, access_log=None, handle_signals=False,
                               logger=_QuietServerLog(logging.getLogger("aiohttp.server")))
        await runner.setup()
        try:
            await self._listen(runner)
        except BaseException:
            await runner.cleanup()
            self.state = ServerState.CLOSED
            raise
        self._runner = runner
        self.state = ServerState.OPENED

    async def _listen(self, runner: web.AppRunner) -> None:
        """Listen on the bind address. A port in use is a passing state (the daemon this one
        replaces still exiting, a restart racing it): retried every second for
        ``bind_retry_s``, then :class:`PortBusy`. Any other failure (no such address,
        permission) is a configuration error."""
        deadline = time.monotonic() + self._bind_retry_s
        busy = 0
        while True:
            site = web.TCPSite(runner, self._host, self._port)
            try:
                await site.start()
            except OSError as e:
                await site.stop()  # unregister the failed site from the runner
                reason = e.strerror or str(e)
                where = f"metrics server cannot listen on {self._bind} ([metrics] bind)"
                if e.errno != errno.EADDRINUSE:
                    raise ConfigError(f"{where}: {reason}") from e
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PortBusy(
                        f"{where}: {reason}, for {self._bind_retry_s:g} s ([metrics] "
                        f"bind_retry_s); exiting with {PortBusy.exit_code} for the service "
                        "manager to restart offloadd") from e
                if busy == 0:
                    log.warning("%s: %s; retrying every second for up to %g s ([metrics] "
                                "bind_retry_s)", where, reason, self._bind_retry_s)
                busy += 1
                await asyncio.sleep(min(1.0, left))
                continue
            if busy:
                log.info("metrics server listening on %s after %d busy attempt(s)", self._bind,
                         busy)
            return

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

    def _refused(self, request: web.Request) -> web.Response | None:
        """Why this caller may not use the control endpoint, or None when it may."""
        if self._token is None:
            if _is_loopback(request.remote):
                return None
            return web.json_response(
                {"ok": False, "error": "offload-now over HTTP is for loopback clients unless "
                 "[metrics] control_token is set"}, status=403)
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(),
                                                              self._token.encode()):
            return None
        return web.json_response({"ok": False, "error": "missing or wrong bearer token "
                                  "([metrics] control_token)"}, status=401,
                                 headers={"WWW-Authenticate": "Bearer"})

    def _other_deployment(self, expected: object) -> web.Response | None:
        """409 when the caller names a deployment (its ``metadata``, as ``/status`` shows it)
        other than this daemon's: a command configured for one deployment must not close
        another's segments because that daemon answers on the address it was given."""
        if expected is None or self._status is None:
            return None
        if not isinstance(expected, str):
            raise ValueError('"metadata" must be a string')
        ours = self._status().get("metadata")
        if ours == expected:
            return None
        return web.json_response(
            {"ok": False, "metadata": ours, "error": f"this daemon serves {ours}, not "
             f"{expected}: refusing to act for another deployment"}, status=409)

    async def _handle_offload_now(self, request: web.Request) -> web.Response:
        assert self._offload_now is not None
        refused = self._refused(request)
        if refused is not None:
            return refused
        try:
            try:
                body = await request.json() if request.can_read_body else {}
            except RecursionError:  # json.loads of a deeply nested document
                raise ValueError("the body is nested too deeply to be a request") from None
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            topics = body.get("topics")
            if topics is not None and (not isinstance(topics, list)
                                       or not all(isinstance(t, str) for t in topics)):
                raise ValueError('"topics" must be a list of topic names')
            if topics == []:
                # An empty list named no topic; closing every topic instead would do the
                # most of all when the caller meant the least.
                raise ValueError('"topics" is an empty list: name at least one topic, or '
                                 'leave the key out for every topic')
            wait = body.get("wait", False)
            if not isinstance(wait, bool):
                raise ValueError('"wait" must be true or false')
            timeout = body.get("timeout_s", 300.0)
            if isinstance(timeout, bool) or not isinstance(timeout, int | float) \
                    or not 0 < timeout <= _MAX_WAIT_S:
                raise ValueError(f'"timeout_s" must be a number in (0, {_MAX_WAIT_S:g}]')
            wrong = self._other_deployment(body.get("metadata"))
            if wrong is not None:
                return wrong
            results = await self._offload_now(topics, wait, float(timeout))
        except ValueError as e:  # also malformed JSON (json.JSONDecodeError)
            return web.json_response({"ok": False, "error": str(e)}, status=400)
        ok = all(r.get("result") in ("committed", "triggered", "nothing") for r in results)
        return web.json_response({"ok": ok, "results": [dict(r) for r in results]})


def _is_loopback(remote: str | None) -> bool:
    if not remote:
        return False
    try:
        addr = ipaddress.ip_address(remote.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped.is_loopback  # ::ffff:127.0.0.1 on a dual-stack socket
    return addr.is_loopback
