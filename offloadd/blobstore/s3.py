"""The S3 blob-store driver (``aws-s3``): any S3-compatible endpoint, through aiobotocore.

Keys: the store's ``prefix`` option is prepended to every key it is given (``prefix + key``) and
stripped from every key it lists; keys are otherwise the caller's (``offloadd.model.keys``).

Requests and retries
  botocore's own retries are off (one attempt per call); this driver retries, with exponential
  backoff and full jitter (``uniform(0, min(retry_max_s, retry_base_s * 2**n))``), only what can
  succeed later: HTTP 5xx and 429, S3's throttling codes (``SlowDown``...), ``RequestTimeout``,
  connection errors and resets, read timeouts and bodies cut short. ``NoSuchKey``/404 becomes
  ``NotFound``; every other answer (``AccessDenied``, ``NoSuchBucket``, ``EntityTooSmall``...)
  becomes ``Fatal`` with a message saying what to check. No botocore or aiohttp exception leaves
  this module.

Deadlines
  Every operation has one overall deadline: ``request_timeout_s``, plus ``nbytes /
  min_transfer_rate_bytes_per_s`` for the bytes it moves (a part, an object, a ranged read). It
  covers everything the operation waits for — a connection from the pool, an endpoint that never
  answers ``Expect: 100-continue`` (botocore sends it on ``PutObject`` and ``UploadPart``, and no
  socket timeout runs while the body waits for it), sending, the answer, every retry and
  backoff, and waiting for a paused circuit. An operation that misses it fails as ``Retriable``
  naming the operation, the key and the deadline, is logged at WARNING, and counts as an
  unanswered failure for the store's health. The prober's ``HeadBucket`` has the plain
  ``request_timeout_s`` deadline.

Store health
  Every primary-endpoint outcome is recorded in a :class:`~offloadd.blobstore.health.StoreHealth`,
  with every request's start and end (its stall watchdog) and whether a failure was an answer or
  silence. While it is PAUSED, write operations (create, part, complete, put, delete) wait for it
  instead of sending requests, and a background prober sends one ``HeadBucket`` per
  ``probe_interval_s`` until the store answers. Failures seen while the circuit is not HEALTHY
  do not use up an operation's ``max_attempts``; the policy's ``pause_timeout_s`` (and the
  operation's deadline) bound that operation instead (then ``Retriable``). Answers that need an
  operator (``NoSuchBucket``, ``AccessDenied``, bad credentials, ``EntityTooSmall``...) are
  reported as refusals, which make the store not ready until that operation succeeds again.

Integrity
  Every part and every ``put`` carries ``x-amz-checksum-crc32c``, computed here with the
  ``crc32c`` package: S3 rejects a body whose bytes do not match (``BadDigest``, retried), and the
  completed object keeps a composite CRC32C. botocore's own ``ChecksumAlgorithm="CRC32C"`` path
  needs ``awscrt`` (not installed) and its default would add a CRC32 of its own; computing the
  header ourselves avoids both (``request_checksum_calculation="when_required"``). Content-MD5
  would cost a second hash of every byte for no stronger check. For the same reason bodies sent
  over HTTPS (AWS, or an ``https://`` endpoint) are not SHA-256 signed (SigV4's
  ``UNSIGNED-PAYLOAD``): TLS and the CRC32C header already protect them, and botocore, which
  skips the hash only when it computed the checksum itself, would otherwise spend about a
  second of CPU per GiB uploaded. Over plain HTTP botocore signs every body.

Multipart
  Parts may be uploaded concurrently and in any order; ``complete()`` lists them sorted and
  checks that numbers run 1..N and offsets are contiguous before asking S3. S3 wants every part
  but the last to be at least 5 MiB: callers size blocks; S3's ``EntityTooSmall`` comes back as a
  ``Fatal`` that says so. Lost responses are handled where a blind retry would go wrong: a retried
  ``CreateMultipartUpload`` aborts the stray upload a lost answer may have left for the same key
  (keys are fresh per attempt, so any other upload of that key is ours), a retried
  ``CompleteMultipartUpload`` first checks (HEAD: size and multipart ETag) whether the earlier
  attempt already published the object, and ``NoSuchUpload`` on abort means done.

Replicated reads
  ``read_endpoints`` (optional) serve ``get_range`` and ``head``: the local zone first, then the
  fewest pending requests; an endpoint that fails in any way (including not having the object
  yet) is skipped at once for the rest of that operation, and the primary endpoint, retried as
  usual, is the last resort. Only the primary's outcomes feed the store-health circuit.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import enum
import hashlib
import logging
import random
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AsyncExitStack, suppress
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import aiohttp
import crc32c
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    CredentialRetrievalError,
    FlexibleChecksumError,
    HTTPClientError,
    IncompleteReadError,
    NoCredentialsError,
    PartialCredentialsError,
    SSLError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError
from botocore.parsers import ResponseParserError

from offloadd.blobstore.base import Buffers, ObjectInfo
from offloadd.blobstore.health import HealthPolicy, HealthState, StoreHealth
from offloadd.errors import ConfigError, Fatal, NotFound, OffloaddError, Retriable

__all__ = [
    "IncompleteUpload",
    "ReadEndpoint",
    "S3BlobStore",
    "S3MultipartUpload",
    "S3Options",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

MIN_PART_SIZE = 5 * 1024 * 1024  # S3's minimum for every part but the last
MAX_PART_NUMBER = 10_000
LIST_PAGE_SIZE = 1000  # S3's own maximum per list call
_SECRET_FIELDS = frozenset({"access_key_id", "secret_access_key", "session_token"})


@dataclass(frozen=True)
class ReadEndpoint:
    url: str
    zone: str = ""


@dataclass(frozen=True, repr=False)
class S3Options:
    bucket: str
    region: str = "us-east-1"
    endpoint: str | None = None  # set: path-style addressing (MinIO, Ceph, moto...)
    prefix: str = ""
    access_key_id: str | None = None  # all three None: the standard AWS credential chain
    secret_access_key: str | None = None
    session_token: str | None = None
    sse: Literal["AES256", "aws:kms"] | None = None
    sse_kms_key_id: str | None = None
    verify_tls: bool = True
    ca_bundle: str | None = None
    max_pool_connections: int = 32
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 20.0  # per attempt; below request_timeout_s so a retry fits
    request_timeout_s: float = 30.0  # overall deadline of one operation, retries included...
    min_transfer_rate_bytes_per_s: float = 1024 * 1024  # ...plus its bytes at this rate
    parts_in_flight: int = 4  # not used here: the uploader reads it
    max_attempts: int = 8
    retry_base_s: float = 0.2
    retry_max_s: float = 10.0
    read_endpoints: tuple[ReadEndpoint, ...] = ()
    local_zone: str | None = None
    health: HealthPolicy = field(default_factory=HealthPolicy)

    def __post_init__(self) -> None:
        def bad(what: str) -> ConfigError:
            return ConfigError(f"blobstore (aws-s3): {what}")

        if not self.bucket:
            raise bad("bucket must be set")
        if self.sse not in (None, "AES256", "aws:kms"):
            raise bad(f"sse must be AES256 or aws:kms, not {self.sse!r}")
        if self.sse_kms_key_id and self.sse != "aws:kms":
            raise bad("sse_kms_key_id needs sse = 'aws:kms'")
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise bad("set both access_key_id and secret_access_key, or neither")
        if self.session_token is not None and self.access_key_id is None:
            raise bad("session_token needs access_key_id and secret_access_key")
        if self.max_attempts < 1 or self.parts_in_flight < 1 or self.max_pool_connections < 1:
            raise bad("max_attempts, parts_in_flight and max_pool_connections must be >= 1")
        if not min(self.connect_timeout_s, self.read_timeout_s, self.retry_base_s,
                   self.request_timeout_s, self.min_transfer_rate_bytes_per_s) > 0:
            raise bad("connect_timeout_s, read_timeout_s, request_timeout_s, "
                      "min_transfer_rate_bytes_per_s and retry_base_s must be > 0")
        if self.retry_max_s < self.retry_base_s:
            raise bad("retry_max_s must be >= retry_base_s")
        if any(not ep.url for ep in self.read_endpoints):
            raise bad("every read endpoint needs a url")

    def deadline_s(self, nbytes: int = 0) -> float:
        """The overall deadline of one operation that moves ``nbytes``."""
        return self.request_timeout_s + nbytes / self.min_transfer_rate_bytes_per_s

    def __repr__(self) -> str:
        parts = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            shown = "'***'" if f.name in _SECRET_FIELDS and value is not None else repr(value)
            parts.append(f"{f.name}={shown}")
        return f"S3Options({', '.join(parts)})"

    __str__ = __repr__


@dataclass(frozen=True)
class IncompleteUpload:
    key: str  # without the store's prefix
    upload_id: str
    initiated: float  # seconds since the epoch


class _State(enum.Enum):
    OPEN = "open"
    CLOSED = "closed"


@dataclass(eq=False)
class _Endpoint:
    url: str | None
    zone: str | None
    client: Any
    primary: bool
    pending: int = 0


class _RedactSecrets(logging.Filter):
    """Blanks our credentials in botocore's DEBUG records (headers, canonical requests)."""

    # Only these loggers print request headers; the secret key itself is never logged.
    LOGGERS = ("botocore.auth", "botocore.endpoint", "aiobotocore.endpoint")

    def __init__(self) -> None:
        super().__init__()
        self.secrets: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            message = record.getMessage()
            if any(secret in message for secret in self.secrets):
                for secret in self.secrets:
                    message = message.replace(secret, "***")
                record.msg, record.args = message, None
        return True

    def protect(self, options: S3Options) -> None:
        new = {getattr(options, f) for f in _SECRET_FIELDS} - {None, ""}
        if new - self.secrets:
            self.secrets |= new
            for name in self.LOGGERS:
                if self not in logging.getLogger(name).filters:
                    logging.getLogger(name).addFilter(self)


_redactor = _RedactSecrets()


# -- error translation ------------------------------------------------------------------------

_THROTTLING = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "BandwidthLimitExceeded",
        "ProvisionedThroughputExceededException",
    }
)
_TRANSIENT_CODES = _THROTTLING | frozenset(
    {
        "InternalError",
        "ServiceUnavailable",
        "RequestTimeout",
        "RequestTimeoutException",
        "PriorRequestNotComplete",
        "OperationAborted",
        "IncompleteBody",
        # The bytes changed on the way: sending them again is the cure.
        "BadDigest",
        "XAmzContentSHA256Mismatch",
    }
)
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})
# Definite answers that will not change until an operator acts: the store is up, but refuses.
_REFUSALS = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "NoSuchBucket",
        "AuthorizationHeaderMalformed",
        "PermanentRedirect",
        "RequestTimeTooSkewed",
        "EntityTooSmall",
        "InvalidArgument",
    }
)


def _is_refusal(exc: BaseException) -> bool:
    if isinstance(exc, SSLError | NoCredentialsError | PartialCredentialsError
                  | CredentialRetrievalError):
        return True
    code = _error_code(exc)
    return code in _REFUSALS or code.startswith("KMS.")
_HINTS = {
    "AccessDenied": "check that the credentials' policy allows this operation on the bucket "
    "(and the KMS key when sse = aws:kms)",
    "AllAccessDisabled": "all access to this bucket is disabled",
    "InvalidAccessKeyId": "check access_key_id (or the AWS credential chain)",
    "SignatureDoesNotMatch": "check secret_access_key and region",
    "ExpiredToken": "the session token expired: refresh the credentials",
    "InvalidToken": "check session_token",
    "NoSuchBucket": "the bucket does not exist: check bucket, region and endpoint",
    "AuthorizationHeaderMalformed": "check region: the bucket may live in another one",
    "PermanentRedirect": "the bucket lives in another region or behind another endpoint",
    "RequestTimeTooSkewed": "this host's clock is off: fix its time sync",
    "EntityTooSmall": "every part except the last must be at least 5 MiB (S3's minimum): "
    "raise the block size",
    "InvalidPart": "a part's ETag or checksum does not match what the store holds",
    "InvalidPartOrder": "parts must be listed in ascending order",
    "NoSuchUpload": "the multipart upload no longer exists "
    "(aborted by a sweep or a lifecycle rule?)",
    "InvalidArgument": "check sse, sse_kms_key_id and the user metadata",
    "KMS.NotFoundException": "check sse_kms_key_id",
    "KMS.DisabledException": "the KMS key is disabled",
}


def _client_error_parts(exc: Any) -> tuple[str, int, str]:
    response: Mapping[str, Any] = getattr(exc, "response", None) or {}
    error: Mapping[str, Any] = response.get("Error") or {}
    meta: Mapping[str, Any] = response.get("ResponseMetadata") or {}
    status = int(meta.get("HTTPStatusCode") or 0)
    return str(error.get("Code") or status or "Unknown"), status, str(error.get("Message") or "")


def _error_code(exc: BaseException) -> str:
    return _client_error_parts(exc)[0] if isinstance(exc, ClientError) else ""


def _translate(exc: BaseException, op: str, where: str) -> OffloaddError:
    """Map one backend exception to the error tree; ``where`` names bucket/key."""
    if isinstance(exc, OffloaddError):
        return exc
    if isinstance(exc, ClientError):
        code, status, message = _client_error_parts(exc)
        said = f"S3 {op} {where}: {code} (HTTP {status})"
        if code in _NOT_FOUND_CODES or (status == 404 and code not in _HINTS):
            return NotFound(f"{where} not found")
        if code in _TRANSIENT_CODES or status >= 500 or status == 429:
            return Retriable(said)
        hint = _HINTS.get(code) or (
            "check sse_kms_key_id and the KMS key policy" if code.startswith("KMS.") else ""
        )
        detail = f": {message}" if message else ""
        return Fatal(f"{said}{detail}" + (f"; {hint}" if hint else ""))
    if isinstance(exc, SSLError):
        return Fatal(f"S3 {op} {where}: TLS failed ({exc}); check verify_tls and ca_bundle")
    if isinstance(exc, NoCredentialsError | PartialCredentialsError | CredentialRetrievalError):
        return Fatal(
            f"S3 {op} {where}: no usable AWS credentials; set access_key_id and "
            "secret_access_key or configure the AWS credential chain"
        )
    if isinstance(
        exc,
        HTTPClientError
        | BotoConnectionError
        | IncompleteReadError
        | FlexibleChecksumError
        | ResponseParserError
        | aiohttp.ClientError
        | OSError,  # TimeoutError and connection resets included
    ):
        return Retriable(f"S3 {op} {where}: {type(exc).__name__}: {exc}")
    return Fatal(f"S3 {op} {where}: {type(exc).__name__}: {exc}")


_BACKEND_ERRORS: tuple[type[BaseException], ...] = (
    BotoCoreError,
    ClientError,
    ResponseParserError,
    aiohttp.ClientError,
    OSError,
)


def _secure(endpoint: str | None) -> bool:
    """HTTPS: AWS's own endpoints (none configured) or an ``https://`` one."""
    return endpoint is None or endpoint.lower().startswith("https://")


def _crc32c_b64(data: bytes) -> str:
    return base64.b64encode(crc32c.crc32c(data).to_bytes(4, "big")).decode("ascii")


_MD5_ETAG = re.compile(r"^[0-9a-f]{32}$")


def _multipart_etag(etags: list[str]) -> str | None:
    """The ETag S3 gives a completed multipart object: MD5 of the parts' MD5s, dash, count."""
    digests = [e.strip('"') for e in etags]
    if not all(_MD5_ETAG.match(d) for d in digests):
        return None
    md5 = hashlib.md5(b"".join(bytes.fromhex(d) for d in digests), usedforsecurity=False)
    return f"{md5.hexdigest()}-{len(digests)}"


# -- the store --------------------------------------------------------------------------------


class S3BlobStore:
    """:class:`~offloadd.blobstore.base.BlobStore` on S3; create with :meth:`open`."""

    name = "aws-s3"

    def __init__(
        self,
        options: S3Options,
        stack: AsyncExitStack,
        primary: _Endpoint,
        replicas: tuple[_Endpoint, ...],
        health: StoreHealth,
    ) -> None:
        self._options = options
        self._stack = stack
        self._primary = primary
        self._readers = (*replicas, primary) if replicas else ()
        self._health = health
        self._rng = random.Random()
        self._state = _State.OPEN
        self._prober: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, options: S3Options, *, health: StoreHealth | None = None) -> S3BlobStore:
        _redactor.protect(options)
        session = get_session()
        config = AioConfig(
            region_name=options.region,
            signature_version="s3v4",
            s3={
                "addressing_style": "path" if options.endpoint else "auto",
                **({"payload_signing_enabled": False} if _secure(options.endpoint) else {}),
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
        stack = AsyncExitStack()

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
            primary = _Endpoint(options.endpoint, None, await client(options.endpoint), True)
            replicas = tuple(
                [
                    _Endpoint(ep.url, ep.zone, await client(ep.url), False)
                    for ep in options.read_endpoints
                ]
            )
        except ValueError as exc:  # botocore's "Invalid endpoint"
            await stack.aclose()
            raise ConfigError(f"blobstore (aws-s3): {exc}") from None
        except _BACKEND_ERRORS as exc:
            await stack.aclose()
            raise _translate(exc, "open", options.bucket) from None
        # the stall watchdog's patience is the request deadline (see health.py, "Stalls")
        health = health or StoreHealth(dataclasses.replace(
            options.health, stall_after_s=options.request_timeout_s))
        if health.name is None:
            health.name = f"s3://{options.bucket}/{options.prefix}".rstrip("/")
        store = cls(options, stack, primary, replicas, health)
        store._prober = asyncio.get_running_loop().create_task(
            store._health.run_prober(store._probe), name=f"s3-prober-{options.bucket}"
        )
        return store

    @property
    def options(self) -> S3Options:
        return self._options

    @property
    def health(self) -> StoreHealth:
        return self._health

    async def close(self) -> None:
        if self._state is _State.CLOSED:
            return
        self._state = _State.CLOSED
        if self._prober is not None:
            self._prober.cancel()
            await asyncio.gather(self._prober, return_exceptions=True)
        await self._stack.aclose()

    def driver_properties(self) -> Mapping[str, str]:
        return {
            "managedLedgerOffloadDriver": self.name,
            "bucket": self._options.bucket,
            "region": self._options.region,
            "serviceEndpoint": self._options.endpoint or "",
        }

    # -- plumbing ------------------------------------------------------------------------

    def _key(self, key: str) -> str:
        return self._options.prefix + key

    def _where(self, key: str | None) -> str:
        bucket = self._options.bucket
        return f"s3://{bucket}/{self._key(key)}" if key is not None else f"s3://{bucket}"

    def _sse(self) -> dict[str, str]:
        if self._options.sse is None:
            return {}
        args: dict[str, str] = {"ServerSideEncryption": self._options.sse}
        if self._options.sse_kms_key_id:
            args["SSEKMSKeyId"] = self._options.sse_kms_key_id
        return args

    def _backoff(self, attempt: int) -> float:
        o = self._options
        return self._rng.uniform(0.0, min(o.retry_max_s, o.retry_base_s * 2 ** (attempt - 1)))

    def _pick(self, read: bool, skip: set[int]) -> _Endpoint:
        if not read or not self._readers:
            return self._primary
        # The primary is never skipped, so there is always a candidate.
        candidates = [ep for ep in self._readers if id(ep) not in skip]
        local = self._options.local_zone

        def rank(ep: _Endpoint) -> tuple[bool, bool, int]:
            return (not (local and ep.zone == local), ep.primary, ep.pending)

        return min(candidates, key=rank)

    async def _call(
        self,
        op: str,
        key: str | None,
        fn: Callable[[Any], Awaitable[T]],
        *,
        write: bool = False,
        read: bool = False,
        already_done: Callable[[], Awaitable[T | None]] | None = None,
        nbytes: int = 0,
    ) -> T:
        """One S3 operation with retries, store-health gating, endpoint choice and one overall
        deadline (``S3Options.deadline_s(nbytes)``; see the module docstring).

        ``write``: wait while the store's circuit is open. ``read``: may use a read endpoint.
        ``already_done``: before each retry, may answer for an attempt whose reply was lost.
        ``nbytes``: what the operation moves, for its deadline.
        """
        if self._state is not _State.OPEN:
            raise Fatal(f"S3 {op} {self._where(key)}: the store is closed")
        loop = asyncio.get_running_loop()
        budget = self._options.deadline_s(nbytes)
        deadline = loop.time() + budget
        attempts = 0  # attempts that count against max_attempts
        paused_until: float | None = None  # set once the store's health holds this op up
        skip: set[int] = set()
        tries = 0
        last: OffloaddError | None = None

        def missed(why: str, level: int = logging.WARNING) -> Retriable:
            said = (f"S3 {op} {self._where(key)}: {why} (deadline {budget:.1f}s: [blobstore] "
                    "request_timeout_s)" + (f"; last error: {last}" if last is not None else ""))
            log.log(level, "%s", said)
            return Retriable(said)

        while True:
            if write and self._health.state is HealthState.PAUSED:
                if paused_until is None:
                    paused_until = loop.time() + self._health.policy.pause_timeout_s
                try:
                    await self._health.wait_until_healthy(
                        min(paused_until, deadline) - loop.time())
                except Retriable:
                    if loop.time() >= deadline - 1e-3:
                        # the circuit's own WARNING said why already: no line per operation
                        raise missed("the store's circuit was still open at the deadline",
                                     logging.DEBUG) from None
                    raise
            if tries and already_done is not None:
                try:
                    async with asyncio.timeout_at(deadline):
                        done = await already_done()
                except TimeoutError:
                    raise missed("no answer before the deadline") from None
                if done is not None:
                    return done
            ep = self._pick(read, skip)
            tries += 1
            ep.pending += 1
            ticket = self._health.request_started() if ep.primary else 0
            err: OffloaddError
            # A replica may use at most half of what is left: the primary needs time too.
            until = deadline if ep.primary else loop.time() + (deadline - loop.time()) / 2
            timer = asyncio.timeout_at(until)
            answered = False
            try:
                async with timer:
                    result = await fn(ep.client)
            except TimeoutError as exc:
                if not timer.expired():  # a socket timeout of botocore's, not our deadline
                    err = _translate(exc, op, self._where(key))
                    err.__cause__ = exc
                elif ep.primary:
                    self._health.record_stall()  # silence: the worst kind of failure
                    raise missed("no answer before the deadline") from None
                else:
                    err = Retriable(f"S3 {op} {self._where(key)}: read endpoint {ep.url} did "
                                    "not answer in time")
            except OffloaddError as exc:
                err = exc
            except _BACKEND_ERRORS as exc:
                err = _translate(exc, op, self._where(key))
                err.__cause__ = exc
                answered = isinstance(exc, ClientError)
                if ep.primary and not isinstance(err, Retriable | NotFound) and _is_refusal(exc):
                    self._health.record_refused(op, str(err))
                    raise err from None
            else:
                if ep.primary:
                    self._health.record_success(op)
                return result
            finally:
                ep.pending -= 1
                if ticket:
                    self._health.request_finished(ticket)

            transient = isinstance(err, Retriable)
            if ep.primary:
                # Any non-transient answer proves the store is up and answering.
                if transient:
                    self._health.record_failure(answered=answered)
                else:
                    self._health.record_success()
            if not ep.primary:
                # A replica that fails, or has not seen the object yet: another server may
                # answer, so fail over at once; the primary, never skipped, has the last word.
                log.debug("read endpoint %s failed over: %s", ep.url, err)
                skip.add(id(ep))
                continue
            if not transient:
                raise err
            last = err
            if write and self._health.state is not HealthState.HEALTHY:
                now = loop.time()
                if paused_until is None:
                    paused_until = now + self._health.policy.pause_timeout_s
                elif now >= paused_until:
                    raise Retriable(
                        f"{err} (store degraded for {self._health.policy.pause_timeout_s:.0f}s)"
                    ) from err
            else:
                attempts += 1
                if attempts >= self._options.max_attempts:
                    raise Retriable(f"{err} (gave up after {attempts} attempts)") from err
            delay = self._backoff(max(attempts, 1))
            if loop.time() + delay >= deadline:
                raise missed("still failing, and another try would pass the deadline") from err
            log.debug("retrying %s %s in %.2fs: %s", op, self._where(key), delay, err)
            await asyncio.sleep(delay)

    async def _probe(self) -> None:
        try:
            async with asyncio.timeout(self._options.request_timeout_s):
                await self._primary.client.head_bucket(Bucket=self._options.bucket)
        except TimeoutError as exc:
            raise Retriable(f"S3 HeadBucket {self._where(None)}: no answer within "
                            f"{self._options.request_timeout_s:.1f}s") from exc
        except _BACKEND_ERRORS as exc:
            err = _translate(exc, "HeadBucket", self._where(None))
            if isinstance(err, Retriable):
                raise err from None
            # 403 (no s3:ListBucket) or 404 still prove the store is answering.

    # -- objects -------------------------------------------------------------------------

    async def start_upload(self, key: str, metadata: Mapping[str, str]) -> S3MultipartUpload:
        full = self._key(key)
        calls = 0

        async def create(client: Any) -> str:
            nonlocal calls
            calls += 1
            resp = await client.create_multipart_upload(
                Bucket=self._options.bucket,
                Key=full,
                Metadata=dict(metadata),
                ChecksumAlgorithm="CRC32C",
                **self._sse(),
            )
            return str(resp["UploadId"])

        upload_id = await self._call("CreateMultipartUpload", key, create, write=True)
        if calls > 1:
            await self._abort_strays(key, keep=upload_id)
        return S3MultipartUpload(self, key, upload_id, metadata)

    async def _abort_strays(self, key: str, keep: str) -> None:
        """Abort uploads of ``key`` that lost CreateMultipartUpload answers left behind."""
        try:
            strays = [
                u
                async for u in self.list_incomplete_uploads(key)
                if u.key == key and u.upload_id != keep
            ]
            for u in strays:
                await self._abort_upload(u.key, u.upload_id)
        except OffloaddError as exc:
            log.warning("could not look for stray uploads of %s: %s", self._where(key), exc)

    async def _abort_upload(self, key: str, upload_id: str) -> bool:
        async def abort(client: Any) -> None:
            try:
                await client.abort_multipart_upload(
                    Bucket=self._options.bucket, Key=self._key(key), UploadId=upload_id
                )
            except ClientError as exc:
                if _error_code(exc) not in ("NoSuchUpload", "404"):
                    raise  # else: already gone, maybe by an earlier attempt whose reply was lost

        try:
            await self._call("AbortMultipartUpload", key, abort)
        except OffloaddError as exc:
            log.warning(
                "abort of upload %s of %s failed (%s); the start-up sweep will remove it",
                upload_id,
                self._where(key),
                exc,
            )
            return False
        return True

    async def put(self, key: str, data: Buffers, metadata: Mapping[str, str]) -> ObjectInfo:
        body = b"".join(data)
        checksum = _crc32c_b64(body)

        async def put(client: Any) -> None:
            await client.put_object(
                Bucket=self._options.bucket,
                Key=self._key(key),
                Body=body,
                Metadata=dict(metadata),
                ChecksumAlgorithm="CRC32C",
                ChecksumCRC32C=checksum,
                **self._sse(),
            )

        await self._call("PutObject", key, put, write=True, nbytes=len(body))
        return ObjectInfo(key, len(body), dict(metadata), time.time())

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        if start < 0 or end < start:
            raise Fatal(f"get_range {self._where(key)}: bad range [{start}, {end})")
        if end == start:
            await self.head(key)  # still NotFound for an absent object
            return b""

        async def get(client: Any) -> bytes:
            try:
                resp = await client.get_object(
                    Bucket=self._options.bucket,
                    Key=self._key(key),
                    Range=f"bytes={start}-{end - 1}",
                )
            except ClientError as exc:
                if _error_code(exc) == "InvalidRange":
                    return b""  # the range starts at or past the object's end
                raise
            async with resp["Body"] as stream:
                data: bytes = await stream.read()
            expected = resp.get("ContentLength")
            if expected is not None and len(data) != int(expected):
                raise Retriable(
                    f"S3 GetObject {self._where(key)}: body cut short "
                    f"({len(data)} of {expected} bytes)"
                )
            if not resp.get("ContentRange"):
                data = data[start:end]  # a server that ignored Range sent the whole object
            return data

        return await self._call("GetObject", key, get, read=True, nbytes=end - start)

    async def head(self, key: str) -> ObjectInfo:
        async def head(client: Any) -> ObjectInfo:
            resp = await client.head_object(Bucket=self._options.bucket, Key=self._key(key))
            return ObjectInfo(
                key,
                int(resp["ContentLength"]),
                dict(resp.get("Metadata") or {}),
                resp["LastModified"].timestamp(),
            )

        return await self._call("HeadObject", key, head, read=True)

    async def delete(self, key: str) -> None:
        async def delete(client: Any) -> None:
            await client.delete_object(Bucket=self._options.bucket, Key=self._key(key))

        with suppress(NotFound):  # deleting an absent key is not an error
            await self._call("DeleteObject", key, delete, write=True)

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        # Pages are fetched one call at a time (not through botocore's paginator) so that each
        # page is retried alone; continuation tokens stay on the primary endpoint.
        strip = len(self._options.prefix)
        args: dict[str, Any] = {
            "Bucket": self._options.bucket,
            "Prefix": self._key(prefix),
            "MaxKeys": LIST_PAGE_SIZE,
        }
        while True:
            page: dict[str, Any] = await self._call(
                "ListObjectsV2", prefix, lambda c: c.list_objects_v2(**args)
            )
            for obj in page.get("Contents") or ():
                yield ObjectInfo(
                    obj["Key"][strip:], int(obj["Size"]), {}, obj["LastModified"].timestamp()
                )
            if not page.get("IsTruncated"):
                return
            args["ContinuationToken"] = page["NextContinuationToken"]

    async def list_incomplete_uploads(self, prefix: str = "") -> AsyncIterator[IncompleteUpload]:
        strip = len(self._options.prefix)
        args: dict[str, Any] = {
            "Bucket": self._options.bucket,
            "Prefix": self._key(prefix),
            "MaxUploads": LIST_PAGE_SIZE,
        }
        while True:
            page: dict[str, Any] = await self._call(
                "ListMultipartUploads", prefix, lambda c: c.list_multipart_uploads(**args)
            )
            for u in page.get("Uploads") or ():
                yield IncompleteUpload(
                    u["Key"][strip:], str(u["UploadId"]), u["Initiated"].timestamp()
                )
            if not page.get("IsTruncated"):
                return
            args["KeyMarker"] = page.get("NextKeyMarker") or ""
            args["UploadIdMarker"] = page.get("NextUploadIdMarker") or ""

    async def sweep_incomplete_uploads(self, older_than_s: float) -> int:
        """Abort multipart uploads under our prefix started more than ``older_than_s`` ago.

        Run at start-up: an upload this old belongs to a crashed or abandoned attempt.
        Returns how many were aborted.
        """
        cutoff = time.time() - older_than_s
        # Collect first: aborting while paging would move the list's markers.
        stale = [u async for u in self.list_incomplete_uploads() if u.initiated < cutoff]
        aborted = 0
        for u in stale:
            if await self._abort_upload(u.key, u.upload_id):
                aborted += 1
        if aborted:
            log.info("swept %d stale multipart uploads from %s", aborted, self._where(""))
        return aborted


@dataclass(frozen=True)
class _Part:
    number: int
    offset: int
    size: int
    etag: str
    checksum: str


class S3MultipartUpload:
    """One S3 multipart upload; see the module docstring."""

    def __init__(
        self, store: S3BlobStore, key: str, upload_id: str, metadata: Mapping[str, str]
    ) -> None:
        self.key = key
        self.upload_id = upload_id
        self._store = store
        self._metadata = dict(metadata)
        self._parts: dict[int, _Part] = {}
        self._finished: Literal["completed", "aborted"] | None = None

    def _check_open(self, op: str) -> None:
        if self._finished is not None:
            raise Fatal(f"{op} {self._store._where(self.key)}: the upload was {self._finished}")

    async def put_part(self, part_number: int, offset: int, data: Buffers) -> None:
        self._check_open("UploadPart")
        if not 1 <= part_number <= MAX_PART_NUMBER or offset < 0:
            raise Fatal(
                f"UploadPart {self._store._where(self.key)}: part {part_number} at offset "
                f"{offset} (parts are numbered 1..{MAX_PART_NUMBER})"
            )
        body = b"".join(data)
        checksum = _crc32c_b64(body)
        store = self._store

        async def upload(client: Any) -> str:
            try:
                resp = await client.upload_part(
                    Bucket=store.options.bucket,
                    Key=store._key(self.key),
                    UploadId=self.upload_id,
                    PartNumber=part_number,
                    Body=body,
                    ChecksumAlgorithm="CRC32C",
                    ChecksumCRC32C=checksum,
                )
            except ClientError as exc:
                if _error_code(exc) == "NoSuchUpload":
                    raise Fatal(
                        f"UploadPart {store._where(self.key)} part {part_number}: "
                        f"{_HINTS['NoSuchUpload']}"
                    ) from None
                raise
            return str(resp["ETag"])

        etag = await store._call("UploadPart", self.key, upload, write=True, nbytes=len(body))
        self._parts[part_number] = _Part(part_number, offset, len(body), etag, checksum)

    async def complete(self) -> ObjectInfo:
        self._check_open("CompleteMultipartUpload")
        store = self._store
        where = store._where(self.key)
        parts = sorted(self._parts.values(), key=lambda p: p.number)
        if not parts:
            raise Fatal(f"CompleteMultipartUpload {where}: no parts were uploaded")
        expected_offset = 0
        for i, p in enumerate(parts, start=1):
            if p.number != i or p.offset != expected_offset:
                raise Fatal(
                    f"CompleteMultipartUpload {where}: parts are not contiguous at part "
                    f"{p.number} (offset {p.offset}, expected part {i} at {expected_offset})"
                )
            expected_offset += p.size
        size = expected_offset
        info = ObjectInfo(self.key, size, dict(self._metadata), 0.0)
        etag = None if store.options.sse == "aws:kms" else _multipart_etag([p.etag for p in parts])

        async def published() -> ObjectInfo | None:
            """Did an earlier attempt, whose reply was lost, already publish the object?"""
            try:
                resp = await store._primary.client.head_object(
                    Bucket=store.options.bucket, Key=store._key(self.key)
                )
            except _BACKEND_ERRORS:
                return None
            if int(resp["ContentLength"]) != size:
                return None
            if etag is not None and str(resp.get("ETag", "")).strip('"') != etag:
                return None
            return dataclasses.replace(info, mtime=resp["LastModified"].timestamp())

        calls = 0

        async def complete(client: Any) -> ObjectInfo:
            nonlocal calls
            calls += 1
            try:
                await client.complete_multipart_upload(
                    Bucket=store.options.bucket,
                    Key=store._key(self.key),
                    UploadId=self.upload_id,
                    MultipartUpload={
                        "Parts": [
                            {"PartNumber": p.number, "ETag": p.etag, "ChecksumCRC32C": p.checksum}
                            for p in parts
                        ]
                    },
                )
            except ClientError as exc:
                if calls > 1 and _error_code(exc) == "NoSuchUpload":
                    done = await published()
                    if done is not None:
                        return done
                raise
            return dataclasses.replace(info, mtime=time.time())

        result = await store._call(
            "CompleteMultipartUpload", self.key, complete, write=True, already_done=published
        )
        self._finished = "completed"
        return result

    async def abort(self) -> None:
        """Best effort (retried, never raises): what is left is for the start-up sweep."""
        if self._finished is not None:
            return
        if await self._store._abort_upload(self.key, self.upload_id):
            self._finished = "aborted"
