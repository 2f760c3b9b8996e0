"""Client set-up for the S3 driver: one aiobotocore client per endpoint, secrets kept out of logs.

botocore's own retries are off (one attempt per call: :mod:`offloadd.blobstore.s3.calls` retries)
and so are its checksums (``request_checksum_calculation="when_required"``: the driver computes
the CRC32C header itself, see :mod:`offloadd.blobstore.s3.checksums`). Bodies sent over HTTPS are
not SHA-256 signed (:func:`secure`).
"""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session

from offloadd.blobstore.s3.errors import BACKEND_ERRORS, translate
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


async def connect(options: S3Options,
                  stack: AsyncExitStack) -> tuple[Endpoint, tuple[Endpoint, ...]]:
    """The primary endpoint's client and one per read endpoint, entered into ``stack``; the
    stack is closed again when one cannot be made (``ConfigError`` for a bad endpoint)."""
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
        max_pool_connections=options.max_pool_connections,
        connect_timeout=options.connect_timeout_s,
        read_timeout=options.read_timeout_s,
        tcp_keepalive=True,
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    verify: bool | str = options.ca_bundle if options.ca_bundle else options.verify_tls

    async def client(url: str | None) -> Any:
        return await stack.enter_async_context(
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
