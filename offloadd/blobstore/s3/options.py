"""What the S3 driver is told: :class:`S3Options` (one bucket, its endpoints and limits)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from offloadd.blobstore.health import HealthPolicy
from offloadd.errors import ConfigError

SECRET_FIELDS = frozenset({"access_key_id", "secret_access_key", "session_token"})


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
    # credentials; all three None: the standard AWS credential chain
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    # server-side encryption
    sse: Literal["AES256", "aws:kms"] | None = None
    sse_kms_key_id: str | None = None
    # TLS: verify the endpoint's certificate, against these CAs when set
    verify_tls: bool = True
    ca_bundle: str | None = None
    # connections and deadlines
    max_pool_connections: int = 32
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 20.0  # per attempt; below request_timeout_s so a retry fits
    request_timeout_s: float = 30.0  # overall deadline of one operation, retries included...
    min_transfer_rate_bytes_per_s: float = 1024 * 1024  # ...plus its bytes at this rate
    # retries of one operation (see offloadd.blobstore.s3.calls)
    max_attempts: int = 8
    retry_base_s: float = 0.2
    retry_max_s: float = 10.0
    # replicated reads
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
        if self.max_attempts < 1 or self.max_pool_connections < 1:
            raise bad("max_attempts and max_pool_connections must be >= 1")
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

    def secrets(self) -> set[str]:
        """The credentials that are set (for the log filters)."""
        return {v for f in SECRET_FIELDS if (v := getattr(self, f))}

    def __repr__(self) -> str:
        parts = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            shown = "'***'" if f.name in SECRET_FIELDS and value is not None else repr(value)
            parts.append(f"{f.name}={shown}")
        return f"S3Options({', '.join(parts)})"

    __str__ = __repr__
