"""Configuration: one TOML file plus ``OFFLOADD_...`` environment overrides (DESIGN §9).

Precedence, highest first: environment (``OFFLOADD_OFFLOAD__FLOW_PERMITS_PER_SECOND=...``, nested
keys joined by ``__``), the TOML file, defaults. Offload policy fields resolve per field
topic → namespace → broker (``[topics."persistent://t/ns/x"]``, ``[namespaces."t/ns"]``,
``[offload]``), like Pulsar's offload policies. Keys are snake_case; Pulsar's camelCase names are
accepted as aliases where one exists. Unknown keys are errors (a typo must not be ignored).
"""

from __future__ import annotations

import difflib
import json
import os
import tomllib
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from offloadd.errors import ConfigError
from offloadd.model import TopicName

MiB = 1024 * 1024
S3_MIN_PART_SIZE = 5 * MiB  # S3 refuses a smaller part but the last: EntityTooSmall
# The smallest block there is: a 128-byte header, one 0-byte frame header... and 4 bytes of padding
_SMALLEST_BLOCK = 128 + 4
# gc must not take a live upload for an abandoned one: orphan_grace_s must be at least this many
# times the longest an upload can legitimately stay open (see Settings._check_orphan_grace)
ORPHAN_GRACE_FACTOR = 2


def _alias(*names: str) -> Any:
    return AliasChoices(*names)


# Pulsar's names for the byte threshold: the offload policy's, broker.conf's older one, and
# the one issue reports used (accepted so such a file loads)
_THRESHOLD_BYTES = ("threshold_bytes", "managedLedgerOffloadThresholdInBytes",
                    "managedLedgerOffloadAutoTriggerSizeThresholdBytes",
                    "managedLedgerOffloadMaxThresholdInBytes")


class _Section(BaseModel):
    # nan and inf are valid TOML (and parse from the environment): never a usable setting
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True,
                              allow_inf_nan=False)


class MetadataSettings(_Section):
    url: str = Field("embedded:./data/metadata",
                     description='"embedded:<dir>" or "zk://host:port[,host:port]/chroot"')
    session_timeout_s: float = Field(10.0, gt=0, description="ZooKeeper session timeout")
    connect_timeout_s: float = Field(15.0, gt=0, description="give up connecting after this")
    acl_digest: SecretStr | None = Field(
        None, description='"user:password": digest ACL on every node we create (a secret)')

    @field_validator("url")
    @classmethod
    def _check_url(cls, v: str) -> str:
        if v.startswith("embedded:"):
            return v
        if not v.startswith("zk://"):
            raise ValueError('must be "embedded:<dir>" or "zk://host:port[,host:port...]/chroot"')
        hosts, _, chroot = v[len("zk://"):].partition("/")
        if not hosts:
            raise ValueError("zk:// URL names no host")
        for hp in hosts.split(","):
            host, sep, port = hp.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"zk:// host {hp!r} must be host:port with a port in 1..65535")
        if chroot.endswith("/") or "//" in chroot:
            raise ValueError("zk:// chroot must be /name[/name...] without empty parts")
        return v

    @field_validator("acl_digest")
    @classmethod
    def _check_digest(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None:
            user, sep, pw = v.get_secret_value().partition(":")
            if not sep or not user or not pw:
                raise ValueError('must be "user:password"')
        return v


class SourceSettings(_Section):
    kind: Literal["local", "bookkeeper"] = "local"
    path: Path = Field(Path("./data/ledgers"), description="embedded managed-ledger store")
    topics: tuple[str, ...] = Field((), description="topic name patterns (fnmatch); empty = all")
    rollover_entries: int = Field(50_000, ge=1,
                                  validation_alias=_alias("rollover_entries",
                                                          "managedLedgerMaxEntriesPerLedger"))
    rollover_bytes: int = Field(64 * MiB, ge=1)
    rollover_minutes: float = Field(1.0, gt=0, validation_alias=_alias(
        "rollover_minutes", "managedLedgerMaxLedgerRolloverTimeMinutes"))
    max_entry_bytes: int = Field(5 * MiB, ge=1, description="larger entries are refused")
    verify_crc: bool = Field(True, description="check what is offloaded against the store's "
                             "checksums (chunk CRC32Cs, and each entry's where no chunk record "
                             "covers it): bit rot fails the segment instead of being uploaded "
                             "under a fresh block checksum; turn off only to measure")
    # kind = "bookkeeper": sidecar beside a Pulsar cluster (docs/sidecar.md)
    pulsar_zk: str | None = Field(None, description='Pulsar\'s ZooKeeper, read-only: '
                                  '"zk://h1:2181,h2:2181[/chroot]"')
    pulsar_zk_digest: SecretStr | None = Field(
        None, description='"user:password" to read protected Pulsar znodes (a secret)')
    ledgers_root: str = Field("/ledgers", description="BookKeeper's ledger metadata root")
    digest_password: SecretStr = Field(
        SecretStr(""), validation_alias=_alias("digest_password", "managedLedgerPassword"),
        description="ledger password when the metadata has none (a secret)")
    zone: str | None = Field(None, description="this host's zone: reads prefer bookies in it")
    zones: dict[str, str] = Field(default_factory=dict, description="bookie host:port → zone")
    read_timeout_s: float = Field(10.0, gt=0, description="per bookie read, then fail over")
    bookie_connect_timeout_s: float = Field(5.0, gt=0)
    bookie_quarantine_s: float = Field(10.0, ge=0,
                                       description="a failed bookie is asked last this long")
    reads_in_flight: int = Field(1024, ge=1, le=65536, description="entry reads per ledger")
    readahead_bytes: int = Field(8 * MiB, ge=0, description="read ahead of the offloader")
    bookie_protocol: Literal["auto", "v3"] = Field(
        "auto", description='"auto": bulk reads over protocol v2 (a bookie that refuses it '
        'is read over v3), the tail of open ledgers over v3; "v3": everything over v3')
    batch_reads: bool = Field(True, description="one request per run of entries where a "
                              "bookie supports batched reads (BookKeeper 4.17+)")


class ReadEndpointSettings(_Section):
    url: str
    zone: str = ""


class BlobstoreSettings(_Section):
    driver: Literal["filesystem", "aws-s3"] = Field("filesystem", validation_alias=_alias(
        "driver", "managedLedgerOffloadDriver"))
    path: Path = Path("./data/tier")
    bucket: str = Field("offload", min_length=1, validation_alias=_alias(
        "bucket", "s3ManagedLedgerOffloadBucket", "managedLedgerOffloadBucket"))
    endpoint: str | None = Field(None, description="S3-compatible endpoint (path-style)",
                                 validation_alias=_alias(
                                     "endpoint", "s3ManagedLedgerOffloadServiceEndpoint",
                                     "managedLedgerOffloadServiceEndpoint"))
    region: str = Field("us-east-1", validation_alias=_alias(
        "region", "s3ManagedLedgerOffloadRegion", "managedLedgerOffloadRegion"))
    prefix: str = ""
    access_key_id: str | None = None
    secret_access_key: SecretStr | None = None
    session_token: SecretStr | None = None
    sse: Literal["AES256", "aws:kms"] | None = None
    sse_kms_key_id: str | None = None
    verify_tls: bool = True
    ca_bundle: str | None = None
    max_pool_connections: int = Field(32, ge=1)
    connect_timeout_s: float = Field(10.0, gt=0)
    read_timeout_s: float = Field(20.0, gt=0)
    request_timeout_s: float = Field(
        30.0, gt=0, description="deadline of one store operation, all retries and waits "
        "included (also an endpoint that never answers Expect: 100-continue); /readyz turns "
        "503 within twice this when the store stops answering (docs/s3.md)")
    min_transfer_rate_bytes_per_s: float = Field(
        1048576.0, gt=0, description="an operation that moves N bytes gets N / this more "
        "seconds on top of request_timeout_s (large blocks over slow links)")
    max_attempts: int = Field(8, ge=1)
    min_part_size_bytes: int = Field(
        S3_MIN_PART_SIZE, ge=0,
        description="aws-s3 driver: the store's smallest multipart part but the last (S3: 5 MiB, "
        "EntityTooSmall below); every block is one part, so blocks are checked against it. "
        "Lower only for a store that takes smaller parts (Ceph's rgw_multipart_min_part_size, "
        "a test server)")
    read_endpoints: tuple[ReadEndpointSettings, ...] = Field(
        (), description="replicated read endpoints [{url, zone}], tried local zone first")
    local_zone: str | None = None
    health_window_s: float = Field(30.0, gt=0, description="error-rate window of the circuit")
    health_high: float = Field(0.5, gt=0, le=1, description="pause uploads above this error rate")
    health_low: float = Field(0.1, ge=0, lt=1, description="resume below this error rate")
    health_pause_timeout_s: float = Field(60.0, gt=0, description="an operation waits at most "
                                          "this long for a paused store")

    @field_validator("driver", mode="before")
    @classmethod
    def _pulsar_driver_names(cls, v: object) -> object:
        # Pulsar's broker.conf also says "S3" for any S3-compatible store
        return "aws-s3" if isinstance(v, str) and v.lower() == "s3" else v

    @model_validator(mode="after")
    def _check_credentials(self) -> BlobstoreSettings:
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise ValueError("set both access_key_id and secret_access_key, or neither "
                             "(neither: the standard AWS credential chain)")
        if self.session_token is not None and self.access_key_id is None:
            raise ValueError("session_token needs access_key_id and secret_access_key")
        if self.sse_kms_key_id is not None and self.sse != "aws:kms":
            raise ValueError('sse_kms_key_id needs sse = "aws:kms"')
        return self


class OffloadPolicy(_Section):
    """Per-topic fields; every level may set any of them."""

    mode: Literal["streaming", "ledger"] = Field(
        "streaming", description="streaming segments (PIP-76) or whole ledgers (PIP-17)")
    max_size_per_segment_mbytes: float = Field(64.0, gt=0, validation_alias=_alias(
        "max_size_per_segment_mbytes", "maxSizePerOffloadSegmentMbytes"))
    max_segment_rollover_time_minutes: float = Field(10.0, gt=0, validation_alias=_alias(
        "max_segment_rollover_time_minutes", "maxOffloadSegmentRolloverTimeMinutes"))
    max_block_size_bytes: int = Field(64 * MiB, ge=1024, validation_alias=_alias(
        "max_block_size_bytes", "managedLedgerOffloadMaxBlockSizeInBytes",
        "s3ManagedLedgerOffloadMaxBlockSizeInBytes"))
    min_block_size_bytes: int | None = Field(
        None, ge=0, description="pad blocks to this (default: 5 MiB on aws-s3, none on filesystem)")
    deletion_lag_ms: int = Field(14_400_000, ge=0, validation_alias=_alias(
        "deletion_lag_ms", "managedLedgerOffloadDeletionLagInMillis"))
    threshold_bytes: int = Field(-1, ge=-1, validation_alias=_alias(*_THRESHOLD_BYTES))
    threshold_seconds: float = Field(-1.0, ge=-1, validation_alias=_alias(
        "threshold_seconds", "managedLedgerOffloadThresholdInSeconds"))


class PolicyOverride(_Section):
    mode: Literal["streaming", "ledger"] | None = None
    max_size_per_segment_mbytes: float | None = Field(None, gt=0, validation_alias=_alias(
        "max_size_per_segment_mbytes", "maxSizePerOffloadSegmentMbytes"))
    max_segment_rollover_time_minutes: float | None = Field(None, gt=0, validation_alias=_alias(
        "max_segment_rollover_time_minutes", "maxOffloadSegmentRolloverTimeMinutes"))
    max_block_size_bytes: int | None = Field(None, ge=1024, validation_alias=_alias(
        "max_block_size_bytes", "managedLedgerOffloadMaxBlockSizeInBytes",
        "s3ManagedLedgerOffloadMaxBlockSizeInBytes"))
    min_block_size_bytes: int | None = Field(None, ge=0)
    deletion_lag_ms: int | None = Field(None, ge=0, validation_alias=_alias(
        "deletion_lag_ms", "managedLedgerOffloadDeletionLagInMillis"))
    threshold_bytes: int | None = Field(None, ge=-1, validation_alias=_alias(
        *_THRESHOLD_BYTES))
    threshold_seconds: float | None = Field(None, ge=-1, validation_alias=_alias(
        "threshold_seconds", "managedLedgerOffloadThresholdInSeconds"))


class OffloadSettings(OffloadPolicy):
    flow_permits_per_second: float = Field(0.0, ge=0, validation_alias=_alias(
        "flow_permits_per_second", "managedLedgerOffloadBrokerFlowPermitsPerSecond",
        "managedLedgerOffloadBrokerFlowPermits"),
        description="broker-wide upload bytes/s; 0 = unlimited")
    burst_bytes: int | None = Field(None, ge=1, description="default: one second of permits")
    buffer_max_bytes: int = Field(256 * MiB, ge=MiB, description="offload buffer cap")
    blocks_in_flight: int = Field(4, ge=1, le=64)
    read_prefetch_blocks: int = Field(8, ge=0, le=64, description="blocks fetched ahead of a "
                                      "reader (memory: this × block size)")
    read_buffer_bytes: int | None = Field(
        None, ge=1, validation_alias=_alias(
            "read_buffer_bytes", "s3ManagedLedgerOffloadReadBufferSizeInBytes",
            "managedLedgerOffloadReadBufferSizeInBytes"),
        description="bytes a reader may fetch ahead; when set, replaces read_prefetch_blocks "
        "by this ÷ max_block_size_bytes blocks (at least 1)")

    def prefetch_blocks(self) -> int:
        """Blocks a reader fetches ahead: ``read_buffer_bytes`` in blocks when set, else
        ``read_prefetch_blocks``."""
        if self.read_buffer_bytes is None:
            return self.read_prefetch_blocks
        return min(max(self.read_buffer_bytes // self.max_block_size_bytes, 1), 64)
    retry_base_s: float = Field(0.5, gt=0)
    retry_max_s: float = Field(30.0, gt=0)
    read_check_interval_s: float = Field(
        60.0, ge=0, description="read the newest committed segment of each topic that "
        "committed since the last check back from the tier (its index and a few KiB of data) "
        "this often; 0 = never")


class MetricsSettings(_Section):
    enabled: bool = True
    bind: str = "127.0.0.1:9105"
    control_token: SecretStr | None = Field(
        None, description="bearer token for POST /offload-now from other hosts (a secret); "
        "unset: only loopback clients may call it")

    @field_validator("bind")
    @classmethod
    def _check_bind(cls, v: str) -> str:
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ValueError('must be "host:port", e.g. "127.0.0.1:9105"')
        return v


class RetentionSettings(_Section):
    """Topic retention, source trimming and the orphan sweep (docs/retention.md)."""

    max_age_minutes: float = Field(-1.0, validation_alias=_alias(
        "max_age_minutes", "defaultRetentionTimeInMinutes"),
        description="delete offloaded ledgers closed longer ago than this; negative = off")
    max_size_mbytes: float = Field(-1.0, validation_alias=_alias(
        "max_size_mbytes", "defaultRetentionSizeInMB"),
        description="delete the oldest offloaded ledgers while the topic is bigger; "
                    "negative = off")
    trim_source: bool = Field(False, description="delete a ledger's local copy once it is "
                              "offloaded and older than offload.deletion_lag_ms")
    orphan_grace_s: float = Field(3600.0, ge=0, description="gc removes unreferenced objects "
                                  "(and stale incomplete uploads) older than this; at least "
                                  "twice the longest a segment's upload may stay open (see "
                                  "\"Checks across keys\")")
    interval_s: float = Field(300.0, gt=0, description="period of the daemon's gc pass")


class LakehouseSettings(_Section):
    """The projection of offloaded messages into Apache Iceberg tables (docs/lakehouse.md)."""

    enabled: bool = Field(False, description="run the projection in the daemon (standalone: "
                          "on when the lakehouse extra is installed)")
    path: Path = Field(Path("./data/lakehouse"), description="the SQL catalog's SQLite file "
                       "and, on the filesystem driver, the warehouse live here")
    catalog: Literal["sql", "rest"] = Field("sql", description='"sql": pyiceberg\'s SQL '
                                            'catalog; "rest": an Iceberg REST catalog')
    catalog_uri: str | None = Field(None, description="sql: an SQLAlchemy URL (default "
                                    "sqlite:///<path>/catalog.db); rest: the catalog URL")
    rest_credential: SecretStr | None = Field(None, description="rest: OAuth2 client "
                                              "credential (a secret)")
    rest_token: SecretStr | None = Field(None, description="rest: bearer token (a secret)")
    warehouse: str | None = Field(None, description="default: file://<path>/warehouse on the "
                                  "filesystem driver, s3://<bucket>/<prefix>lakehouse on aws-s3 "
                                  "(same endpoint and credentials as the tier)")
    topics: tuple[str, ...] = Field((), description="topic name patterns (fnmatch) to project; "
                                    "empty = all")
    interval_s: float = Field(5.0, gt=0, description="how often the follower looks for newly "
                              "committed segments")
    commit_max_bytes: int = Field(32 * MiB, ge=1, description="payload bytes per table commit "
                                  "(larger backlogs commit in several snapshots)")
    compact_interval_s: float = Field(300.0, gt=0, description="how often small files are "
                                      "compacted and old snapshots expired")
    compact_min_files: int = Field(8, ge=2, description="compact a day partition once it has "
                                   "this many small files")
    compact_small_file_bytes: int = Field(16 * MiB, ge=1, description="data files below this "
                                          "size are small")
    snapshot_max_age_minutes: float = Field(60.0, gt=0, description="expire snapshots older "
                                            "than this (the current one is always kept)")
    delete_with_retention: bool = Field(False, description="delete a topic's rows of ledgers "
                                        "that retention deleted from the tier; off: the table "
                                        "keeps them")
    json_fields: dict[str, dict[str, Literal["string", "long", "double", "boolean"]]] = Field(
        default_factory=dict, description="topic → {field: type}: top-level fields of JSON "
        "payloads as columns")

    @field_validator("json_fields")
    @classmethod
    def _check_json_topics(cls, v: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
        for name in v:
            try:
                TopicName.parse(name)
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
        return v


class DaemonSettings(_Section):
    pid_file: Path = Path("./data/offloadd.pid")
    shutdown_deadline_s: float = Field(30.0, gt=0)
    owner_id: str | None = Field(None, description="default: hostname-pid")
    log_format: Literal["auto", "json", "text"] = "auto"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    nice: int = Field(0, ge=0, le=19, description="lower the daemon's CPU priority by this "
                      "(like nice(1)) so offload yields to the broker and writers on a busy "
                      "host; under systemd prefer the unit's Nice=")
    offload_now_topics: tuple[str, ...] = Field(
        (), description="topic patterns (fnmatch) SIGUSR1 closes when `offloadd offload-now` "
        "names none; empty = all topics")
    lag_interval_s: float = Field(2.0, gt=0, le=60, description="how often each topic's lag "
                                  "(committed position to the source's LAC) is measured")
    status_interval_s: float = Field(30.0, gt=0, description="a topic's offload status record "
                                     "in the metadata store is written on every state change "
                                     "and otherwise at most this often")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="OFFLOADD_", env_nested_delimiter="__",
                                      extra="forbid", frozen=True, populate_by_name=True,
                                      allow_inf_nan=False)

    metadata: MetadataSettings = Field(default_factory=MetadataSettings)
    source: SourceSettings = Field(default_factory=SourceSettings)
    blobstore: BlobstoreSettings = Field(default_factory=BlobstoreSettings)
    offload: OffloadSettings = Field(default_factory=OffloadSettings)
    namespaces: dict[str, PolicyOverride] = Field(default_factory=dict)
    topics: dict[str, PolicyOverride] = Field(default_factory=dict)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    daemon: DaemonSettings = Field(default_factory=DaemonSettings)
    retention: RetentionSettings = Field(default_factory=RetentionSettings)
    lakehouse: LakehouseSettings = Field(default_factory=LakehouseSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # environment beats the file (passed as init values), which beats defaults
        return (env_settings, init_settings)

    @field_validator("topics")
    @classmethod
    def _check_topics(cls, v: dict[str, PolicyOverride]) -> dict[str, PolicyOverride]:
        for name in v:
            try:
                TopicName.parse(name)
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
        return v

    @field_validator("namespaces")
    @classmethod
    def _check_namespaces(cls, v: dict[str, PolicyOverride]) -> dict[str, PolicyOverride]:
        for name in v:
            if name.count("/") != 1 or not all(name.split("/")):
                raise ValueError(f'namespace key {name!r} must be "tenant/namespace"')
            if {".", ".."} & set(name.split("/")):
                raise ValueError(f"namespace key {name!r}: '.' and '..' cannot be a tenant or "
                                 "namespace name")
        return v

    @model_validator(mode="after")
    def _check_levels(self) -> Settings:
        # every level's effective policy must be usable, not only each value on its own
        levels: list[tuple[str, list[PolicyOverride]]] = [("offload", [])]
        levels += [(f"namespaces.{_key(ns)}", [o]) for ns, o in self.namespaces.items()]
        for name, o in self.topics.items():
            ns = self.namespaces.get(TopicName.parse(name).ns)
            levels.append((f"topics.{_key(name)}", [ns, o] if ns is not None else [o]))
        for where, overrides in levels:
            p = self._merge(overrides)
            if p.min_block_size_bytes is not None and (
                    p.min_block_size_bytes > p.max_block_size_bytes):
                raise ValueError(
                    f"[{where}] min_block_size_bytes ({p.min_block_size_bytes}) must not exceed "
                    f"max_block_size_bytes ({p.max_block_size_bytes})")
            self._check_part_size(where, p)
        if self.offload.retry_base_s > self.offload.retry_max_s:
            raise ValueError(f"[offload] retry_base_s ({self.offload.retry_base_s}) must not "
                             f"exceed retry_max_s ({self.offload.retry_max_s})")
        self._check_orphan_grace([(where, self._merge(o)) for where, o in levels])
        return self

    def _check_part_size(self, where: str, p: OffloadPolicy) -> None:
        """On aws-s3 every block is one multipart part, and S3 refuses a part under its minimum
        but the last (EntityTooSmall): a block size below it fails every segment, forever."""
        if self.blobstore.driver != "aws-s3":
            return
        floor = self.blobstore.min_part_size_bytes
        if p.max_block_size_bytes < floor:
            raise ValueError(
                f"[{where}] max_block_size_bytes ({p.max_block_size_bytes}) is below the "
                f"store's smallest multipart part ({floor} bytes, [blobstore] "
                "min_part_size_bytes): with driver = \"aws-s3\" every block is one part and S3 "
                "refuses smaller ones (EntityTooSmall); raise the block size")
        smallest = max(min(self.min_block_size(p), p.max_block_size_bytes), _SMALLEST_BLOCK)
        if p.mode == "streaming" and smallest < floor:
            raise ValueError(
                f"[{where}] min_block_size_bytes ({p.min_block_size_bytes}) is below the "
                f"store's smallest multipart part ({floor} bytes, [blobstore] "
                "min_part_size_bytes): a block cut short (at the end of a ledger) would be a "
                f"part S3 refuses (EntityTooSmall); set it to at least {floor} or leave it unset")

    def _check_orphan_grace(self, levels: list[tuple[str, OffloadPolicy]]) -> None:
        """gc aborts incomplete uploads and removes unreferenced objects older than
        ``orphan_grace_s``. A segment's upload starts with its first block and completes when
        it closes: by ``max_segment_rollover_time_minutes``, plus the time the broker-wide
        throttle needs for the rest of it (a whole ledger, in ledger mode). A grace shorter than
        twice that lets gc abort the daemon's own live uploads, again and again."""
        rate = self.offload.flow_permits_per_second
        longest, worst = 0.0, ""
        for where, p in levels:
            if p.mode == "streaming":
                size = p.max_size_per_segment_mbytes * MiB
                took = p.max_segment_rollover_time_minutes * 60 + (size / rate if rate else 0)
                why = (f"[{where}] max_segment_rollover_time_minutes = "
                       f"{p.max_segment_rollover_time_minutes:g}")
            else:
                size = float(self.source.rollover_bytes)
                took = size / rate if rate else 0.0
                why = f"[{where}] mode = \"ledger\" with [source] rollover_bytes = {size:.0f}"
            if rate:
                why += f" and {size / MiB:g} MiB at flow_permits_per_second = {rate:g}"
            if took > longest:
                longest, worst = took, why
        need = ORPHAN_GRACE_FACTOR * longest
        if self.retention.orphan_grace_s < need:
            raise ValueError(
                f"[retention] orphan_grace_s ({self.retention.orphan_grace_s:g}) must be at "
                f"least {need:.0f}: a segment's upload may stay open {longest:.0f} s "
                f"({worst}), and gc must not take the daemon's live uploads for abandoned "
                f"ones (the grace is {ORPHAN_GRACE_FACTOR}x that; docs/config.md)")

    def _merge(self, overrides: list[PolicyOverride]) -> OffloadPolicy:
        fields: dict[str, Any] = {k: getattr(self.offload, k) for k in OffloadPolicy.model_fields}
        for override in overrides:
            for k, val in override.model_dump(exclude_none=True).items():
                fields[k] = val
        return OffloadPolicy.model_validate(fields)

    def policy_for(self, topic: TopicName) -> OffloadPolicy:
        """The effective per-topic policy: topic over namespace over broker, per field."""
        return self._merge([o for o in (self.namespaces.get(topic.ns), self.topics.get(str(topic)))
                            if o is not None])

    def min_block_size(self, policy: OffloadPolicy) -> int:
        if policy.min_block_size_bytes is not None:
            return policy.min_block_size_bytes
        return 5 * MiB if self.blobstore.driver == "aws-s3" else 0


def load(path: Path | str | None, **overrides: Any) -> Settings:
    """Read the TOML file (if any) and the environment.

    Every problem is a ``ConfigError`` of one line: where the value came from (the file or the
    ``OFFLOADD_...`` variable), the key as ``[section.key]``, and what is allowed. Values of
    secret fields and of unknown keys (a misspelt secret is still a secret) are never echoed.
    """
    where = str(path) if path is not None else "<defaults>"
    data: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"{where}: config file not found") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{where}: not valid TOML ({exc})") from None
        except OSError as exc:
            raise ConfigError(f"{where}: cannot read ({exc.strerror})") from None
    try:
        data = _canonical_keys(data)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    for key, value in overrides.items():
        section, _, field = key.partition("__")
        data.setdefault(section, {})[field] = value
    env = _offloadd_environment()
    try:
        return Settings(**data)
    except ValidationError as exc:
        errors = exc.errors()
        raise ConfigError(_describe(errors[0], where, env, len(errors) - 1)) from None
    except SettingsError as exc:
        raise ConfigError(_describe_env_error(exc, env)) from None
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


# ---- load() helpers --------------------------------------------------------------------------
def _table_model(section: str) -> tuple[type[BaseModel], bool] | None:
    """The model of ``[section]`` and whether it is a table of tables (namespaces, topics)."""
    f = Settings.model_fields.get(section)
    if f is None:
        return None
    ann = f.annotation
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann, False
    args = get_args(ann)
    if len(args) == 2 and isinstance(args[1], type) and issubclass(args[1], BaseModel):
        return args[1], True
    return None


def _aliases(model: type[BaseModel]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, f in model.model_fields.items():
        if isinstance(f.validation_alias, AliasChoices):
            out.update({str(c): key for c in f.validation_alias.choices if c != key})
    return out


def _canonical_keys(data: dict[str, Any]) -> dict[str, Any]:
    """Rename Pulsar's aliases to our snake_case keys, so an environment override of the
    snake_case key replaces a file's alias instead of clashing with it."""

    def rename(table: dict[str, Any], model: type[BaseModel], where: str) -> dict[str, Any]:
        aliases = _aliases(model)
        out: dict[str, Any] = {}
        for key, value in table.items():
            canon = aliases.get(key, key)
            if canon in out:
                raise ConfigError(f"[{where}] both {canon} and its alias {key} are set; "
                                  "keep one")
            out[canon] = value
        return out

    out = dict(data)
    for section, table in data.items():
        tm = _table_model(section)
        if tm is None or not isinstance(table, dict):
            continue
        model, nested = tm
        if nested:
            out[section] = {k: rename(v, model, f"{section}.{_key(k)}") if isinstance(v, dict)
                            else v for k, v in table.items()}
        else:
            out[section] = rename(table, model, section)
    return out


def _offloadd_environment() -> dict[tuple[str, ...], str]:
    """``OFFLOADD_*`` variables meant for the configuration, by key path.

    A variable whose name starts with a section name (``OFFLOADD_OFFLOAD_...``) is taken as
    meant for the configuration and must name a real key: a typo such as one underscore
    instead of two would otherwise be ignored in silence. Other ``OFFLOADD_*`` names are not
    ours to judge and are left alone.
    """
    found: dict[tuple[str, ...], str] = {}
    sections = list(Settings.model_fields)
    for name in os.environ:
        if not name.upper().startswith("OFFLOADD_"):
            continue
        rest = name[len("OFFLOADD_"):].lower()
        section = next((s for s in sections if rest == s or rest.startswith(s + "_")), None)
        if section is None:
            continue
        parts = tuple(rest.split("__"))
        tm = _table_model(section)
        if parts == (section,):
            found[parts] = name
            continue
        if (len(parts) == 2 and parts[0] == section and tm is not None and not tm[1]
                and parts[1] in tm[0].model_fields):
            found[parts] = name
            continue
        hint = ""
        if tm is not None and not tm[1]:
            guess = difflib.get_close_matches(rest.removeprefix(section).strip("_"),
                                              list(tm[0].model_fields), n=1)
            if guess:
                hint = f"; did you mean OFFLOADD_{section.upper()}__{guess[0].upper()}?"
        raise ConfigError(f"environment {name}: names no configuration key (the form is "
                          f"OFFLOADD_<SECTION>__<KEY>{hint})")
    return found


def _key(part: object) -> str:
    text = str(part)
    return text if text.replace("_", "").replace("-", "").isalnum() else json.dumps(text)


def _secret_keys() -> set[tuple[str, str]]:
    out: set[tuple[str, str]] = set()
    for section in Settings.model_fields:
        tm = _table_model(section)
        if tm is None:
            continue
        for key, f in tm[0].model_fields.items():
            if "SecretStr" in str(f.annotation):
                out.add((section, key))
    return out


def secret_values(settings: Settings) -> list[str]:
    """Every secret the configuration holds (for the log filter); any section, any key typed
    ``SecretStr``, so a secret added later is covered without a list to keep up to date."""
    out = []
    for section, key in sorted(_secret_keys()):
        table = getattr(settings, section)
        for item in table.values() if isinstance(table, dict) else [table]:
            value = getattr(item, key, None)
            if isinstance(value, SecretStr):
                out.append(value.get_secret_value())
    return out


_TYPE_WORDS = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
    "float_type": "a number", "float_parsing": "a number",
    "finite_number": "a finite number (not nan or inf)",
    "bool_type": "true or false", "bool_parsing": "true or false",
    "string_type": "a string", "path_type": "a string (a path)",
    "dict_type": "a table", "model_type": "a table", "model_attributes_type": "a table",
    "tuple_type": "an array", "list_type": "an array",
}
_BOUND_WORDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<",
                "less_than_equal": "<="}


def _describe(err: Any, where: str, env: dict[tuple[str, ...], str], more: int) -> str:
    loc = tuple(str(p) for p in err["loc"])
    kind = err["type"]
    ctx = err.get("ctx") or {}
    secret = len(loc) >= 2 and (loc[0], loc[-1]) in _secret_keys()
    # unknown keys may be misspelt secrets; URLs may carry user:password@
    show_input = not secret and kind != "extra_forbidden" and "@" not in str(err.get("input"))
    if kind == "extra_forbidden":
        msg = "unknown key" + _suggest(loc)
    elif kind == "literal_error":
        msg = f"must be {ctx.get('expected', 'one of the documented values')}"
    elif kind in _TYPE_WORDS:
        msg = f"must be {_TYPE_WORDS[kind]}"
    elif kind in _BOUND_WORDS:
        bound = next(iter(ctx.values()), "?")
        msg = f"must be {_BOUND_WORDS[kind]} {bound}"
    elif kind in ("string_too_short", "too_short"):
        msg = "must not be empty"
    elif kind == "missing":
        msg = "is required"
    else:
        msg = str(err["msg"]).removeprefix("Value error, ")
    value = err.get("input")
    if show_input and isinstance(value, str | int | float | bool) and len(repr(value)) <= 80:
        msg += f" (got {value!r})"
    source = where
    for n in range(len(loc), 0, -1):
        if loc[:n] in env:
            source = f"environment {env[loc[:n]]}"
            break
    if more:
        msg += f" (and {more} more problem{'s' if more > 1 else ''})"
    if not loc:  # a whole-model check: its message names its own keys
        return f"{source}: {msg}"
    return f"{source}: [{'.'.join(_key(p) for p in loc)}] {msg}"


def _suggest(loc: tuple[str, ...]) -> str:
    if len(loc) == 1:
        choices = list(Settings.model_fields)
    else:
        tm = _table_model(loc[0])
        if tm is None:
            return ""
        choices = list(tm[0].model_fields) + list(_aliases(tm[0]))
    guess = difflib.get_close_matches(loc[-1], choices, n=1)
    if guess:
        return f"; did you mean {guess[0]!r}?"
    return f"; allowed: {', '.join(c for c in choices if c.islower())} (docs/config.md)"


def _describe_env_error(exc: SettingsError, env: dict[tuple[str, ...], str]) -> str:
    # pydantic-settings says 'error parsing value for field "X"': name the variable instead
    field = str(exc).partition('field "')[2].partition('"')[0]
    names = sorted(name for path, name in env.items() if path[0] == field)
    source = f"environment {names[0]}" if names else "environment"
    return (f"{source}: not valid JSON (arrays and tables come as JSON in the environment, "
            """e.g. '["a", "b"]')""")


# ---- reference --------------------------------------------------------------------------
def reference_markdown() -> str:
    """The configuration reference, generated from the model (docs/config.md)."""
    lines = [
        "# Configuration reference", "",
        "Generated by `offloadd config reference` from `offloadd/config.py`; do not edit "
        "(regenerate with `offloadd config reference > docs/config.md`).", "",
        "One TOML file (`offloadd ... --config FILE`; check it with `offloadd config check "
        "--config FILE`) plus environment overrides. Precedence, highest first: the "
        "environment, the file, the defaults below.", "",
        "- Environment: `OFFLOADD_<SECTION>__<KEY>`, e.g. "
        "`OFFLOADD_OFFLOAD__FLOW_PERMITS_PER_SECOND=1048576` or "
        "`OFFLOADD_BLOBSTORE__SECRET_ACCESS_KEY=...`; arrays and tables as JSON. A variable "
        "that starts with a section name but names no key is an error.",
        "- Keys are snake_case; where Pulsar has a name for the same setting (broker.conf or "
        "offload policies) it is accepted as an alias.",
        "- Unknown keys are errors. Every error is one line naming the file or variable, "
        "the key and what is allowed; `offloadd` exits 2.",
        "- Secrets (marked *secret*) are never printed or logged.", "",
    ]
    for section in Settings.model_fields:
        tm = _table_model(section)
        if tm is None:
            continue
        model, nested = tm
        if nested:
            continue
        lines += [f"## [{section}]", ""]
        doc = (model.__doc__ or "").strip()
        if doc:
            lines += [" ".join(doc.split()), ""]
        lines += _field_table(model, section)
    lines += [
        "## Per-namespace and per-topic levels", "",
        "Offload policy keys may be overridden per namespace and per topic, like Pulsar's "
        "namespace and topic offload policies. Each key resolves on its own: the topic's "
        "value if set, else the namespace's, else `[offload]`'s.", "",
        "```toml",
        "[offload]", 'mode = "streaming"', "max_size_per_segment_mbytes = 64", "",
        '[namespaces."public/archive"]', 'mode = "ledger"            # whole ledgers here', "",
        '[topics."persistent://public/archive/audit"]',
        "max_segment_rollover_time_minutes = 1", "```", "",
        "Namespace keys are `tenant/namespace`; topic keys are full "
        "`persistent://tenant/namespace/topic` names. The keys allowed at these levels:", "",
    ]
    lines += _field_table(PolicyOverride, None)
    lines += [
        "## Checks across keys", "",
        "A configuration that would load but could only fail is refused at load time, "
        "with the same one-line error and exit code 2:", "",
        "- Every number is finite: `nan` and `inf` (valid TOML, and accepted by float "
        "parsers from the environment) are refused everywhere, as they are for command-line "
        "flags (`--rate`, `--duration`, `--grace`, `--orphan-grace`).",
        "- `min_block_size_bytes` must not exceed `max_block_size_bytes`, at every level; "
        "`retry_base_s` must not exceed `retry_max_s`.",
        "- With `driver = \"aws-s3\"` every block is one multipart part, and S3 refuses a "
        "part smaller than 5 MiB but the last (`EntityTooSmall`): at every level "
        "`max_block_size_bytes` and (in streaming mode, where a block cut short at a "
        "ledger's end is padded to it) the effective `min_block_size_bytes` must be at "
        "least `[blobstore] min_part_size_bytes` (5 MiB; lower it only for a store that "
        "takes smaller parts).",
        f"- `[retention] orphan_grace_s` must be at least {ORPHAN_GRACE_FACTOR}× the longest "
        "a segment's upload may stay open. A streaming segment's multipart upload starts "
        "with its first block and completes when the segment closes: at the latest "
        "`max_segment_rollover_time_minutes` later, plus the time the broker-wide throttle "
        "needs for a whole segment (`max_size_per_segment_mbytes` ÷ "
        "`flow_permits_per_second`, when a throttle is set); in ledger mode an upload takes a "
        "whole ledger (`[source] rollover_bytes`) at the throttle. The longest over "
        "`[offload]` and every namespace and topic level counts. gc aborts incomplete uploads "
        "and deletes unreferenced objects older than the grace, so a shorter grace would "
        "abort the daemon's own live uploads, again on every retry. The factor of "
        f"{ORPHAN_GRACE_FACTOR} leaves room for a slow store and retried parts; with many "
        "topics sharing a tight throttle, give more.",
        "- Topic and namespace names may not be `.` or `..` (they would name a directory's "
        "self or parent in the paths built from them).", "",
    ]
    return "\n".join(lines).rstrip("\n") + "\n"


# Descriptions for fields declared without one (the reference must say what every key does).
_DOCS: dict[str, str] = {
    "source.kind": '"local": the embedded managed-ledger store at `path`; "bookkeeper": a '
                   "Pulsar cluster's bookies",
    "source.rollover_bytes": "the embedded writer closes a ledger at this size",
    "source.rollover_entries": "the embedded writer closes a ledger after this many entries",
    "source.rollover_minutes": "the embedded writer closes a ledger after this long",
    "blobstore.path": "filesystem driver: the directory objects are written under",
    "blobstore.bucket": "aws-s3 driver: the bucket",
    "blobstore.region": "aws-s3 driver: the signing region",
    "blobstore.prefix": "aws-s3 driver: prepended to every object key",
    "blobstore.access_key_id": "aws-s3 driver; unset with secret_access_key: the standard AWS "
                               "credential chain",
    "blobstore.secret_access_key": "aws-s3 driver; best given as "
                                   "OFFLOADD_BLOBSTORE__SECRET_ACCESS_KEY",
    "blobstore.session_token": "aws-s3 driver: temporary credentials",
    "blobstore.sse": "server-side encryption of every object",
    "blobstore.sse_kms_key_id": 'KMS key for sse = "aws:kms" (default: the account key)',
    "blobstore.verify_tls": "check the endpoint's TLS certificate",
    "blobstore.ca_bundle": "PEM file of CAs to trust for the endpoint",
    "blobstore.max_pool_connections": "HTTP connections kept per endpoint",
    "blobstore.connect_timeout_s": "per attempt: connecting",
    "blobstore.read_timeout_s": "per attempt: the longest wait for the next bytes of an "
                                "answer, then the attempt is retried on a fresh connection "
                                "(keep it below request_timeout_s)",
    "blobstore.max_attempts": "tries per request before the error reaches the offloader",
    "offload.mode": "streaming segments (PIP-76) or whole ledgers (PIP-17)",
    "offload.max_size_per_segment_mbytes": "a streaming segment closes at this size",
    "offload.max_segment_rollover_time_minutes": "a streaming segment closes this long after "
                                                 "its first entry (fractions allowed)",
    "offload.max_block_size_bytes": "data block size in the tier objects",
    "offload.min_block_size_bytes": "pad blocks to this (default: 5 MiB on aws-s3, none on "
                                    "filesystem)",
    "offload.deletion_lag_ms": "keep a ledger's source copy this long after it is offloaded",
    "offload.threshold_bytes": "offload an entry only once this many payload bytes follow it "
                               "(the newest stay only in the source); negative: no threshold",
    "offload.threshold_seconds": "offload an entry only once it is this old; with "
                                 "threshold_bytes, either suffices; negative: no threshold",
    "offload.blocks_in_flight": "multipart parts uploading at once, per topic",
    "offload.read_prefetch_blocks": "blocks `offloadd read` fetches ahead",
    "offload.retry_base_s": "first back-off after a failed segment (doubles up to retry_max_s)",
    "offload.retry_max_s": "longest back-off between attempts at a failed segment",
    "metrics.enabled": "serve /metrics, /healthz and /readyz",
    "metrics.bind": "host:port of the metrics HTTP endpoint",
    "daemon.pid_file": "written by `offloadd run`; `offloadd offload-now` signals the process "
                       "it names",
    "daemon.shutdown_deadline_s": "SIGTERM: time to finish in-flight uploads before they are "
                                  "abandoned (and redone on the next start)",
    "daemon.log_format": '"auto": JSON lines unless stderr is a terminal',
    "daemon.log_level": "applied again on SIGHUP",
}


def _field_table(model: type[BaseModel], section: str | None) -> list[str]:
    head = "| key | type | description |" if section is None else \
        "| key | type | default | environment | description |"
    out = [head, "|---|---|---|" + ("" if section is None else "---|---|")]
    for key, f in model.model_fields.items():
        aliases = [a for a, k in _aliases(model).items() if k == key]
        desc = f.description or _DOCS.get(f"{section or 'offload'}.{key}", "")
        if aliases:
            desc = (desc + "; " if desc else "") + "Pulsar: " + ", ".join(
                f"`{a}`" for a in aliases)
        secret = "SecretStr" in str(f.annotation)
        if secret:
            desc = "*secret*; " + desc if desc else "*secret*"
        cells = [f"`{key}`", _type_text(f)]
        if section is not None:
            cells.append("(unset)" if secret
                         else _toml_value(f.get_default(call_default_factory=True)))
            cells.append(f"`OFFLOADD_{section.upper()}__{key.upper()}`")
        cells.append(desc.replace("|", "\\|"))
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    return out


def _toml_value(v: object) -> str:
    if v is None:
        return "(unset)"
    if isinstance(v, bool):
        return f"`{'true' if v else 'false'}`"
    if isinstance(v, Path):
        return f"`{json.dumps(str(v))}`"
    if isinstance(v, str):
        return f"`{json.dumps(v)}`"
    if isinstance(v, tuple | list):
        return f"`{json.dumps(list(v))}`"
    if isinstance(v, dict):
        return "`{}`" if not v else f"`{json.dumps(v)}`"
    return f"`{v}`"


def _type_text(f: Any) -> str:
    ann = f.annotation
    args = [a for a in get_args(ann) if a is not type(None)]
    base = args[0] if len(args) == 1 and get_origin(ann) is not tuple else ann
    if get_origin(base) is Literal:
        text = "one of " + ", ".join(f"`{json.dumps(a)}`" for a in get_args(base))
    elif get_origin(base) is tuple:
        text = "array of strings"
    elif get_origin(base) is dict:
        text = "table of strings"
    else:
        text = {int: "integer", float: "number", bool: "boolean", str: "string",
                Path: "path", SecretStr: "string"}.get(base, str(base))
    bounds = []
    for m in f.metadata:
        for attr, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            val = getattr(m, attr, None)
            if val is not None:
                bounds.append(f"{sym} {val}")
        if getattr(m, "min_length", None):
            bounds.append("non-empty")
    return text + (" " + ", ".join(bounds) if bounds else "")
