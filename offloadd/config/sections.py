"""The configuration's sections, one model each (``[metadata]``, ``[source]``, ``[blobstore]``...).

The offload policy's sections, which resolve per topic, are in :mod:`offloadd.config.policy`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator

from offloadd.config.fields import (
    BYTES,
    BYTES_PER_S,
    MIBS,
    Section,
    alias,
    http_url,
    topic_keys,
)
from offloadd.model.hostport import HostPort
from offloadd.model.sizes import MiB

S3_MIN_PART_SIZE = 5 * MiB  # S3 refuses a smaller part but the last: EntityTooSmall
DEFAULT_PART_SIZE = 8 * MiB  # a multipart part, and a reader's ranged GET


class MetadataSettings(Section):
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
        hosts, slash, chroot = v[len("zk://"):].partition("/")
        if not hosts:
            raise ValueError("zk:// URL names no host")
        if "@" in hosts:  # never echo it: what precedes the @ is a password
            raise ValueError("zk:// URLs carry no credentials: give them as [metadata] "
                             "acl_digest = \"user:password\"")
        for hp in hosts.split(","):
            try:
                HostPort.parse(hp)
            except ValueError:
                raise ValueError(f"zk:// host {hp!r} must be host:port with a port in 1..65535"
                                 ) from None
        # "zk://h:2181/" (an empty chroot: the whole tree, probably not what was meant) and
        # "/a/../b" (ZooKeeper has no . or .., the node would be named "..") are refused
        parts = chroot.split("/")
        if slash and (not chroot or "" in parts or {".", ".."} & set(parts)):
            raise ValueError("zk:// chroot must be /name[/name...] without empty, '.' or '..' "
                             "parts (leave out the slash for no chroot)")
        return v

    @field_validator("acl_digest")
    @classmethod
    def _check_digest(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None:
            user, sep, pw = v.get_secret_value().partition(":")
            if not sep or not user or not pw:
                raise ValueError('must be "user:password"')
        return v


class SourceSettings(Section):
    kind: Literal["local", "bookkeeper"] = "local"
    path: Path = Field(Path("./data/ledgers"), description="embedded managed-ledger store")
    topics: tuple[str, ...] = Field((), description="topic name patterns (fnmatch); empty = all")
    rollover_entries: int = Field(50_000, ge=1,
                                  validation_alias=alias("rollover_entries",
                                                          "managedLedgerMaxEntriesPerLedger"))
    rollover_bytes: Annotated[int, BYTES] = Field(64 * MiB, ge=1)
    rollover_minutes: float = Field(1.0, gt=0, validation_alias=alias(
        "rollover_minutes", "managedLedgerMaxLedgerRolloverTimeMinutes"))
    max_entry_bytes: Annotated[int, BYTES] = Field(
        5 * MiB, ge=1, description="larger entries are refused")
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
        SecretStr(""), validation_alias=alias("digest_password", "managedLedgerPassword"),
        description="ledger password when the metadata has none (a secret)")
    zone: str | None = Field(None, description="this host's zone: reads prefer bookies in it")
    zones: dict[str, str] = Field(default_factory=dict, description="bookie host:port → zone")
    read_timeout_s: float = Field(10.0, gt=0, description="per bookie read, then fail over")
    bookie_connect_timeout_s: float = Field(5.0, gt=0)
    bookie_quarantine_s: float = Field(10.0, ge=0,
                                       description="a failed bookie is asked last this long")
    reads_in_flight: int = Field(1024, ge=1, le=65536, description="entry reads per ledger")
    readahead_bytes: Annotated[int, BYTES] = Field(
        8 * MiB, ge=0, description="read ahead of the offloader")
    bookie_protocol: Literal["auto", "v3"] = Field(
        "auto", description='"auto": bulk reads over protocol v2 (a bookie that refuses it '
        'is read over v3), the tail of open ledgers over v3; "v3": everything over v3')
    batch_reads: bool = Field(True, description="one request per run of entries where a "
                              "bookie supports batched reads (BookKeeper 4.17+)")
    pulsar_policies: bool = Field(
        True, description="apply the offload policies Pulsar keeps per namespace "
        "(/admin/policies/<tenant>/<ns>: thresholds, deletion lag) and per topic (each "
        "namespace's __change_events topic), followed live; docs/sidecar.md")
    pulsar_configuration_zk: str | None = Field(
        None, description="Pulsar's configuration store (its configurationMetadataStoreUrl) "
        "when it is not pulsar_zk: where the namespace policies are read (same credentials)")

    @field_validator("pulsar_configuration_zk")
    @classmethod
    def _check_configuration_zk(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not v.startswith("zk://"):
            raise ValueError('must be "zk://host:port[,host:port...][/chroot]"')
        try:  # the same rules as [metadata] url's
            MetadataSettings(url=v)
        except ValidationError as exc:
            raise ValueError(str(exc.errors()[0]["msg"]).removeprefix("Value error, ")) from None
        return v


class ReadEndpointSettings(Section):
    url: str
    zone: str = ""

    @field_validator("url")
    @classmethod
    def _check_url(cls, v: str) -> str:
        return http_url(v)


class BlobstoreSettings(Section):
    driver: Literal["filesystem", "aws-s3"] = Field("filesystem", validation_alias=alias(
        "driver", "managedLedgerOffloadDriver"))
    path: Path = Path("./data/tier")
    bucket: str = Field("offload", min_length=1, validation_alias=alias(
        "bucket", "s3ManagedLedgerOffloadBucket", "managedLedgerOffloadBucket"))
    endpoint: str | None = Field(None, description="S3-compatible endpoint (path-style)",
                                 validation_alias=alias(
                                     "endpoint", "s3ManagedLedgerOffloadServiceEndpoint",
                                     "managedLedgerOffloadServiceEndpoint"))
    region: str = Field("us-east-1", validation_alias=alias(
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
    min_transfer_rate_bytes_per_s: Annotated[float, BYTES_PER_S] = Field(
        1048576.0, gt=0, description="an operation that moves N bytes gets N / this more "
        "seconds on top of request_timeout_s (large blocks over slow links)")
    max_attempts: int = Field(8, ge=1)
    min_part_size_bytes: Annotated[int, BYTES] = Field(
        S3_MIN_PART_SIZE, ge=0,
        description="aws-s3 driver: the store's smallest multipart part but the last (S3: 5 MiB, "
        "EntityTooSmall below); part_size_bytes is checked against it. "
        "Lower only for a store that takes smaller parts (Ceph's rgw_multipart_min_part_size, "
        "a test server)")
    part_size_bytes: Annotated[int, BYTES] = Field(
        DEFAULT_PART_SIZE, ge=1,
        description="multipart part size: a data object's parts are runs of whole blocks, each "
        "part at least this long but the last (blocks are sized by their content, never padded "
        "to it); also the size of a reader's ranged GETs. On aws-s3 at least "
        "min_part_size_bytes. A part is held whole in the offload buffer until it is sent: "
        "keep [offload] buffer_max_bytes several parts per topic uploading at once")
    read_endpoints: tuple[ReadEndpointSettings, ...] = Field(
        (), description="replicated read endpoints [{url, zone}], tried local zone first")
    local_zone: str | None = None
    health_window_s: float = Field(30.0, gt=0, description="error-rate window of the circuit")
    health_high: float = Field(0.5, gt=0, le=1, description="pause uploads above this error rate")
    health_low: float = Field(0.1, ge=0, lt=1, description="resume below this error rate")
    health_pause_timeout_s: float = Field(60.0, gt=0, description="an operation waits at most "
                                          "this long for a paused store")
    conditional_writes: Literal["auto", "on", "off"] = Field(
        "auto", description="the store as a second fence: index and data objects written "
        "create-only (S3 If-None-Match: *, the filesystem's link(2)) where a probe at start-up "
        "finds the store refuses an overwrite; \"on\": refuse to start without it; \"off\": "
        "no probe, writes overwrite (docs/s3.md)")

    @field_validator("endpoint")
    @classmethod
    def _check_endpoint(cls, v: str | None) -> str | None:
        return None if v is None else http_url(v)

    @field_validator("driver", mode="before")
    @classmethod
    def _pulsar_driver_names(cls, v: object) -> object:
        # Pulsar's broker.conf also says "S3" for any S3-compatible store
        return "aws-s3" if isinstance(v, str) and v.lower() == "s3" else v

    @model_validator(mode="after")
    def _check_credentials(self) -> BlobstoreSettings:
        problems = []  # every one, a line each
        if (self.access_key_id is None) != (self.secret_access_key is None):
            problems.append("set both access_key_id and secret_access_key, or neither "
                            "(neither: the standard AWS credential chain)")
        if self.session_token is not None and self.access_key_id is None:
            problems.append("session_token needs access_key_id and secret_access_key")
        if self.sse_kms_key_id is not None and self.sse != "aws:kms":
            problems.append('sse_kms_key_id needs sse = "aws:kms"')
        if problems:
            raise ValueError("\n".join(problems))
        return self


class MetricsSettings(Section):
    enabled: bool = True
    bind: str = "127.0.0.1:9105"
    topic_level: bool | Literal["auto"] = Field(
        "auto", validation_alias=alias("topic_level", "exposeTopicLevelMetricsInPrometheus"),
        description="true: counters and gauges per topic (labels namespace and topic, 14 "
        "series a topic); false: every series per namespace, no topic label; \"auto\": true "
        "while the process serves fewer than 1,000 topics (docs/metrics.md, \"Topic-level "
        "series\")")
    bind_retry_s: float = Field(
        60.0, ge=0, description="while the bind port is in use (the previous daemon still "
        "exiting, another exporter), retry for this long, then exit 75, which systemd "
        "restarts (docs/operations.md)")
    control_token: SecretStr | None = Field(
        None, description="bearer token for POST /offload-now from other hosts (a secret); "
        "unset: only loopback clients may call it")

    @field_validator("bind")
    @classmethod
    def _check_bind(cls, v: str) -> str:
        try:
            HostPort.parse(v, allow_zero=True)
        except ValueError:
            raise ValueError('must be "host:port", e.g. "127.0.0.1:9105"') from None
        return v


class RetentionSettings(Section):
    """Topic retention, source trimming and the orphan sweep (docs/retention.md)."""

    max_age_minutes: float = Field(-1.0, validation_alias=alias(
        "max_age_minutes", "defaultRetentionTimeInMinutes"),
        description="delete offloaded ledgers closed longer ago than this; negative = off")
    max_size_mbytes: Annotated[float, MIBS] = Field(-1.0, validation_alias=alias(
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


PartitionChoice = Literal["day(publish_time)", "hour(publish_time)", "day(event_time)",
                         "hour(event_time)", "none"]


class LakehouseSettings(Section):
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
    max_commits_per_s: float = Field(10.0, ge=0, description="the follower's table commits "
                                     "per second, across all tables (0: unbounded); tables "
                                     "waiting longest commit first, the others wait (their "
                                     "lag shows it) and batch more segments per commit")
    commit_max_bytes: Annotated[int, BYTES] = Field(
        32 * MiB, ge=1, description="payload bytes per table commit "
                                  "(larger backlogs commit in several snapshots)")
    compact_interval_s: float = Field(300.0, gt=0, description="how often small files are "
                                      "compacted and old snapshots expired")
    compact_min_files: int = Field(8, ge=2, description="compact a day partition once it has "
                                   "this many small files")
    compact_small_file_bytes: Annotated[int, BYTES] = Field(
        16 * MiB, ge=1, description="data files below this "
                                          "size are small")
    snapshot_max_age_minutes: float = Field(60.0, gt=0, description="expire snapshots older "
                                            "than this (the current one is always kept)")
    reader_grace_minutes: float = Field(30.0, ge=0, description="a replaced snapshot stays "
                                        "readable, and a file no snapshot references stays in "
                                        "the warehouse, this long (longer than the longest "
                                        "query and the longest projection commit)")
    delete_with_retention: bool = Field(False, description="delete a topic's rows of ledgers "
                                        "that retention deleted from the tier; off: the table "
                                        "keeps them")
    partition: PartitionChoice = Field("day(publish_time)", description="how tables are "
                                       "partitioned: day(...) or hour(...) of publish_time or "
                                       "event_time, or none")
    partitions: dict[str, PartitionChoice] = Field(default_factory=dict, description="topic "
                                                   "→ its partition choice (overrides "
                                                   "partition)")
    json_fields: dict[str, dict[str, Literal["string", "long", "double", "boolean"]]] = Field(
        default_factory=dict, description="topic → {field: type}: top-level fields of JSON "
        "payloads as columns")
    transaction_timeout_s: float = Field(180.0, gt=0, description="read-committed: a "
                                         "transaction with no commit or abort marker this long "
                                         "(in publish time of the log) after its first message "
                                         "is treated as aborted; until then the table holds "
                                         "back everything from its first message on")
    keep_hidden: bool = Field(False, description="also write what read-committed hides "
                              "(markers, aborted and timed-out transactions' messages) as rows "
                              "flagged in the hidden column, for audit; queries then filter "
                              "hidden IS NULL")

    @field_validator("json_fields", "partitions")
    @classmethod
    def _check_json_topics(cls, v: dict[str, Any]) -> dict[str, Any]:
        topic_keys(v)
        return v

    @model_validator(mode="after")
    def _check_rest_catalog(self) -> LakehouseSettings:
        # the same checks every lakehouse command makes (lakehouse/tables.py), at load time
        if self.catalog == "rest":
            if not self.catalog_uri:
                raise ValueError('catalog = "rest" needs catalog_uri (the catalog\'s URL)')
            try:
                http_url(self.catalog_uri)
            except ValueError as exc:
                raise ValueError(f"catalog_uri {exc}") from None
        return self


class DaemonSettings(Section):
    pid_file: Path = Path("./data/offloadd.pid")
    shutdown_deadline_s: float = Field(30.0, gt=0)
    stop_close_budget_s: float | None = Field(None, gt=0)
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


class CompactSettings(Section):
    """Merging small segments in the tier (`offloadd compact`; docs/retention.md)."""

    enabled: bool = Field(False, description="run the merger in the daemon too, at most "
                          "max_merges_per_pass merges per topic every interval_s, under the "
                          "upload throttle (off by default: `offloadd compact` merges on demand)")
    target_mbytes: Annotated[float, MIBS] = Field(
        64.0, gt=0, description="a merged segment's data object stays "
                                 "within this; segments this size or larger are never merged")
    interval_s: float = Field(600.0, gt=0, description="period of the daemon's merge pass")
    max_merges_per_pass: int = Field(4, ge=1, description="merges per topic per daemon pass")
