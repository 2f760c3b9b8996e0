"""Every backend exception of the S3 driver, translated into the error tree (:func:`translate`).

==================================================  ==========================================
botocore / aiohttp                                  offloadd
==================================================  ==========================================
``NoSuchKey``, ``NotFound``, 404                    ``NotFound``
HTTP 5xx and 429, S3's throttling codes             ``Retriable``
(``SlowDown``...), ``RequestTimeout``, ``BadDigest``
connection errors and resets, read timeouts,        ``Retriable``
bodies cut short, unparseable answers
TLS failures, missing credentials, every other      ``Fatal``, with what to check
answer (``AccessDenied``, ``NoSuchBucket``,
``EntityTooSmall``...)
==================================================  ==========================================

:func:`is_refusal` tells the answers that need an operator (the store is up, but refuses) from
the rest: they make the store not ready (``StoreHealth.record_refused``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp
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

from offloadd.errors import Conflict, Fatal, NotFound, OffloaddError, Retriable

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
THROTTLING_CODES = _THROTTLING  # S3's (and S3-compatible stores') ways to say "slow down"
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
        "QuotaExceeded",  # Ceph RGW: the bucket's or user's quota is used up (403)
    }
)


def is_refusal(exc: BaseException) -> bool:
    """A definite answer that will not change until an operator acts."""
    if isinstance(exc, SSLError | NoCredentialsError | PartialCredentialsError
                  | CredentialRetrievalError):
        return True
    code = error_code(exc)
    return code in _REFUSALS or code.startswith("KMS.")


HINTS = {
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
    "raise [blobstore] part_size_bytes (and min_part_size_bytes, if lowered)",
    "InvalidPart": "a part's ETag or checksum does not match what the store holds",
    "InvalidPartOrder": "parts must be listed in ascending order",
    "NoSuchUpload": "the multipart upload no longer exists "
    "(aborted by a sweep or a lifecycle rule?)",
    "InvalidArgument": "check sse, sse_kms_key_id and the user metadata",
    "QuotaExceeded": "the bucket's or the user's quota is used up: raise it or free space",
    "KMS.NotFoundException": "check sse_kms_key_id",
    "KMS.DisabledException": "the KMS key is disabled",
}


def _client_error_parts(exc: ClientError) -> tuple[str, int, str]:
    response: Mapping[str, Any] = exc.response or {}
    error: Mapping[str, Any] = response.get("Error") or {}
    meta: Mapping[str, Any] = response.get("ResponseMetadata") or {}
    status = int(meta.get("HTTPStatusCode") or 0)
    return str(error.get("Code") or status or "Unknown"), status, str(error.get("Message") or "")


def error_code(exc: BaseException) -> str:
    return _client_error_parts(exc)[0] if isinstance(exc, ClientError) else ""


def translate(exc: BaseException, op: str, where: str) -> OffloaddError:
    """Map one backend exception to the error tree; ``where`` names bucket/key."""
    if isinstance(exc, OffloaddError):
        return exc
    if isinstance(exc, ClientError):
        code, status, message = _client_error_parts(exc)
        said = f"S3 {op} {where}: {code} (HTTP {status})"
        if code in _NOT_FOUND_CODES or (status == 404 and code not in HINTS):
            return NotFound(f"{where} not found")
        if code == "PreconditionFailed" or status == 412:
            # only create-only writes (If-None-Match: *) carry a precondition: the key exists
            return Conflict(f"{said}: {where} already exists; refused to overwrite it "
                            "(create-only writes: the store's second fence)")
        if code in _TRANSIENT_CODES or status >= 500 or status == 429:
            return Retriable(said)
        hint = HINTS.get(code) or (
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


BACKEND_ERRORS: tuple[type[BaseException], ...] = (
    BotoCoreError,
    ClientError,
    ResponseParserError,
    aiohttp.ClientError,
    OSError,
)
