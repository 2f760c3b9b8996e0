"""Client set-up for the S3 driver: one aiobotocore client per endpoint, secrets kept out of logs.

botocore's own retries are off (one attempt per call: :mod:`offloadd.blobstore.s3.calls` retries)
and so are its checksums (``request_checksum_calculation="when_required"``: the driver computes
the CRC32C header itself, see :mod:`offloadd.blobstore.s3.checksums`). Bodies sent over HTTPS are
not SHA-256 signed (:func:`secure`).

Every HTTP request a client sends is counted (:func:`count_requests`) from botocore's
``response-received`` event, which fires once per request sent, answered or not — so requests
made outside :class:`~offloadd.blobstore.s3.calls.Requests` (the lost-reply checks, the health
probe) are counted too. A request our own deadline cuts short fires no event; ``Requests``
counts it as a ``timeout`` (:data:`ANSWERED` tells whether it was answered first).
"""

from __future__ import annotations

import contextvars
import logging
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

from aiobotocore.config import AioConfig
from aiobotocore.httpsession import AIOHTTPSession
from aiobotocore.session import get_session
from botocore.exceptions import ConnectTimeoutError, ReadTimeoutError

from offloadd.blobstore.requests import RequestCounts
from offloadd.blobstore.s3.errors import BACKEND_ERRORS, THROTTLING_CODES, translate
from offloadd.blobstore.s3.options import S3Options
from offloadd.errors import ConfigError
from offloadd.logs import RedactFilter, secret_pattern


@dataclass(eq=False)
class Endpoint:
    """One endpoint's client; ``pending``: its requests under way (reads go to the least busy)."""

    url: str | None
    zone: str | None
    client: Any
    primary: bool
    pending: int = 0


def secure(endpoint: str | None) -> bool:
    """HTTPS: AWS's own endpoints (none configured) or an ``https://`` one."""
    return endpoint is None or endpoint.lower().startswith("https://")


class OneTryHTTPSession(AIOHTTPSession):  # type: ignore[misc]  # aiobotocore is untyped
    """aiobotocore's HTTP session without aiohttp's hidden resend: aiohttp sends an idempotent
    request (GET, HEAD, PUT, DELETE) a second time when a kept-alive connection drops before the
    answer — a request the store saw and no botocore event reports, so it would go uncounted
    (and uncounted against ``max_attempts``). One attempt per call; ``calls.Requests`` retries.
    (aiohttp has no public switch; its own test client turns the same attribute off.)"""

    async def _get_session(self, proxy_url: Any) -> Any:
        session = await super()._get_session(proxy_url)
        session._retry_connection = False
        return session


# Requests answered in the current task since ``Requests.run`` reset it (see the docstring).
ANSWERED: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "offloadd_s3_answered", default=None)


def request_result(status: int | None, code: str | None, exc: BaseException | None) -> str:
    """One request's result label (``offloadd.blobstore.requests``)."""
    if exc is not None:
        return "timeout" if isinstance(exc, ReadTimeoutError | ConnectTimeoutError) else "io"
    if status is None or status < 400:
        return "ok"
    if status in (429, 503) or (code is not None and code in THROTTLING_CODES):
        return "throttled"
    return "server" if status >= 500 else "client"


def count_requests(client: Any, counts: RequestCounts) -> None:
    """Count every request ``client`` sends in ``counts``, by S3 operation and result."""

    def on_response(event_name: str = "", response_dict: Any = None,
                    parsed_response: Any = None, exception: BaseException | None = None,
                    **_: Any) -> None:
        op = event_name.rsplit(".", 1)[-1]
        status = response_dict.get("status_code") if isinstance(response_dict, dict) else None
        error = parsed_response.get("Error") if isinstance(parsed_response, dict) else None
        code = error.get("Code") if isinstance(error, dict) else None
        counts.count(op, request_result(status, code, exception))
        seen = ANSWERED.get()
        if seen is not None:
            seen[0] += 1

    client.meta.events.register("response-received.s3", on_response,
                                unique_id="offloadd-request-counts")


async def connect(options: S3Options, stack: AsyncExitStack,
                  requests: RequestCounts | None = None
                  ) -> tuple[Endpoint, tuple[Endpoint, ...]]:
    """The primary endpoint's client and one per read endpoint, entered into ``stack``; the
    stack is closed again when one cannot be made (``ConfigError`` for a bad endpoint).
    ``requests`` counts every request of every client."""
    protect(options)
    session = get_session()
    config = AioConfig(
        region_name=options.region,
        signature_version="s3v4",
        s3={
            "addressing_style": "path" if options.endpoint else "auto",
            **({"payload_signing_enabled": False} if secure(options.endpoint) else {}),
        },
        retries={"mode": "standard", "total_max_attempts": 1},
        http_session_cls=OneTryHTTPSession,
        max_pool_connections=options.max_pool_connections,
        connect_timeout=options.connect_timeout_s,
        read_timeout=options.read_timeout_s,
        tcp_keepalive=True,
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    verify: bool | str = options.ca_bundle if options.ca_bundle else options.verify_tls

    async def client(url: str | None) -> Any:
        made = await stack.enter_async_context(
            session.create_client(
                "s3",
                region_name=options.region,
                endpoint_url=url,
                aws_access_key_id=options.access_key_id,
                aws_secret_access_key=options.secret_access_key,
                aws_session_token=options.session_token,
                verify=verify,
                config=config,
            )
        )
        if requests is not None:
            count_requests(made, requests)
        return made

    try:
        primary = Endpoint(options.endpoint, None, await client(options.endpoint), True)
        replicas = [Endpoint(ep.url, ep.zone, await client(ep.url), False)
                    for ep in options.read_endpoints]
    except ValueError as exc:  # botocore's "Invalid endpoint"
        await stack.aclose()
        raise ConfigError(f"blobstore (aws-s3): {exc}") from None
    except BACKEND_ERRORS as exc:
        await stack.aclose()
        raise translate(exc, "open", options.bucket) from None
    return primary, tuple(replicas)


# Only these loggers print request headers (the access key id, a session token) and canonical
# requests; the secret key itself is never logged. One filter for every store of the process.
_LOGGERS = ("botocore.auth", "botocore.endpoint", "aiobotocore.endpoint")
_redact = RedactFilter(())
_secrets: set[str] = set()


def protect(options: S3Options) -> None:
    """Blank ``options``' credentials, in every form :func:`offloadd.logs.secret_pattern`
    knows, in botocore's DEBUG records."""
    new = options.secrets() - _secrets
    if not new:
        return
    _secrets.update(new)
    _redact.pattern = secret_pattern(_secrets)
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        if _redact not in logger.filters:
            logger.addFilter(_redact)
