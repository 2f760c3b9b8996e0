"""Configuration: one TOML file plus ``OFFLOADD_...`` environment overrides (DESIGN §9).

Precedence, highest first: environment (``OFFLOADD_OFFLOAD__FLOW_PERMITS_PER_SECOND=...``, nested
keys joined by ``__``), the TOML file, defaults. Offload policy fields resolve per field
topic → namespace → broker (``[topics."persistent://t/ns/x"]``, ``[namespaces."t/ns"]``,
``[offload]``), like Pulsar's offload policies. Keys are snake_case; Pulsar's camelCase names are
accepted as aliases where one exists. Unknown keys are errors (a typo must not be ignored).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

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
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from offloadd.errors import ConfigError
from offloadd.model import TopicName

MiB = 1024 * 1024


def _alias(*names: str) -> Any:
    return AliasChoices(*names)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


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
    verify_crc: bool = Field(False, description="check each entry's CRC32C when offloading")


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
    read_timeout_s: float = Field(60.0, gt=0)
    max_attempts: int = Field(8, ge=1)

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


class OffloadSettings(OffloadPolicy):
    flow_permits_per_second: float = Field(0.0, ge=0, validation_alias=_alias(
        "flow_permits_per_second", "managedLedgerOffloadBrokerFlowPermitsPerSecond"),
        description="broker-wide upload bytes/s; 0 = unlimited")
    burst_bytes: int | None = Field(None, ge=1, description="default: one second of permits")
    buffer_max_bytes: int = Field(256 * MiB, ge=MiB, description="offload buffer cap")
    blocks_in_flight: int = Field(4, ge=1, le=64)
    read_prefetch_blocks: int = Field(4, ge=0, le=64)
    retry_base_s: float = Field(0.5, gt=0)
    retry_max_s: float = Field(30.0, gt=0)


class MetricsSettings(_Section):
    enabled: bool = True
    bind: str = "127.0.0.1:9105"

    @field_validator("bind")
    @classmethod
    def _check_bind(cls, v: str) -> str:
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ValueError('must be "host:port", e.g. "127.0.0.1:9105"')
        return v


class DaemonSettings(_Section):
    pid_file: Path = Path("./data/offloadd.pid")
    shutdown_deadline_s: float = Field(30.0, gt=0)
    owner_id: str | None = Field(None, description="default: hostname-pid")
    log_format: Literal["auto", "json", "text"] = "auto"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    offload_now_topics: tuple[str, ...] = Field(
        (), description="topic patterns (fnmatch) SIGUSR1 closes when `offloadd offload-now` "
        "names none; empty = all topics")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="OFFLOADD_", env_nested_delimiter="__",
                                      extra="forbid", frozen=True, populate_by_name=True)

    metadata: MetadataSettings = Field(default_factory=MetadataSettings)
    source: SourceSettings = Field(default_factory=SourceSettings)
    blobstore: BlobstoreSettings = Field(default_factory=BlobstoreSettings)
    offload: OffloadSettings = Field(default_factory=OffloadSettings)
    namespaces: dict[str, PolicyOverride] = Field(default_factory=dict)
    topics: dict[str, PolicyOverride] = Field(default_factory=dict)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    daemon: DaemonSettings = Field(default_factory=DaemonSettings)

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
        return v

    @model_validator(mode="after")
    def _check_levels(self) -> Settings:
        # every level's effective policy must be usable, not only each value on its own
        levels: list[tuple[str, list[PolicyOverride]]] = [("offload", [])]
        levels += [(f"namespaces.{ns}", [o]) for ns, o in self.namespaces.items()]
        for name, o in self.topics.items():
            ns = self.namespaces.get(TopicName.parse(name).ns)
            levels.append((f"topics.{name}", [ns, o] if ns is not None else [o]))
        for where, overrides in levels:
            p = self._merge(overrides)
            if p.min_block_size_bytes is not None and (
                    p.min_block_size_bytes > p.max_block_size_bytes):
                raise ValueError(
                    f"[{where}] min_block_size_bytes ({p.min_block_size_bytes}) must not exceed "
                    f"max_block_size_bytes ({p.max_block_size_bytes})")
        if self.offload.retry_base_s > self.offload.retry_max_s:
            raise ValueError(f"[offload] retry_base_s ({self.offload.retry_base_s}) must not "
                             f"exceed retry_max_s ({self.offload.retry_max_s})")
        return self

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
    """Read the TOML file (if any) and the environment; ``ConfigError`` names key and file."""
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
    for key, value in overrides.items():
        section, _, field = key.partition("__")
        data.setdefault(section, {})[field] = value
    try:
        return Settings(**data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; see docs/config.md)"
        raise ConfigError(f"{where}: [{loc}] {msg}") from None
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def reference_markdown() -> str:
    """The configuration reference, generated from the model (docs/config.md)."""
    lines = ["# Configuration reference", "",
             "Generated by `offloadd config reference` from `offloadd/config.py`; do not edit.",
             "", "One TOML file plus `OFFLOADD_<SECTION>__<KEY>` environment overrides "
             "(environment wins). Offload policy fields may be set per namespace "
             '(`[namespaces."tenant/ns"]`) and per topic (`[topics."persistent://t/ns/x"]`); '
             "the most specific level wins, field by field.", ""]
    sections: list[tuple[str, type[BaseModel]]] = [
        ("metadata", MetadataSettings), ("source", SourceSettings),
        ("blobstore", BlobstoreSettings), ("offload", OffloadSettings),
        ("metrics", MetricsSettings), ("daemon", DaemonSettings)]
    for name, model in sections:
        lines += [f"## [{name}]", "", "| key | alias | default | description |",
                  "|---|---|---|---|"]
        for key, f in model.model_fields.items():
            alias = ""
            va = f.validation_alias
            if isinstance(va, AliasChoices):
                alias = ", ".join(str(c) for c in va.choices if c != key)
            default = "" if f.is_required() else repr(f.get_default(call_default_factory=True))
            if isinstance(default, str) and "Secret" in default:
                default = "(unset)"
            lines.append(f"| `{key}` | {alias} | `{default}` | {f.description or ''} |")
        lines.append("")
    return "\n".join(lines)
