"""The whole configuration (:class:`Settings`), its levels and the checks across keys.

A configuration that would load but could only fail is refused at load time (the checks are
listed in ``docs/config.md``, "Checks across keys").
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from offloadd.config.cost import CostSettings
from offloadd.config.fields import key_text, topic_keys
from offloadd.config.policy import OffloadPolicy, OffloadSettings, PolicyOverride
from offloadd.config.sections import (
    BlobstoreSettings,
    CompactSettings,
    DaemonSettings,
    LakehouseSettings,
    MetadataSettings,
    MetricsSettings,
    RetentionSettings,
    SourceSettings,
)
from offloadd.model import TopicName
from offloadd.model.sizes import MiB

# gc must not take a live upload for an abandoned one: orphan_grace_s must be at least this many
# times the longest an upload can legitimately stay open (see Settings._orphan_grace_problems)
ORPHAN_GRACE_FACTOR = 2


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
    cost: CostSettings = Field(default_factory=CostSettings)
    compact: CompactSettings = Field(default_factory=CompactSettings)

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
        topic_keys(v)
        return v

    @field_validator("namespaces")
    @classmethod
    def _check_namespaces(cls, v: dict[str, PolicyOverride]) -> dict[str, PolicyOverride]:
        problems = []  # every bad key, a line each
        for name in v:
            if name.count("/") != 1 or not all(name.split("/")):
                problems.append(f'namespace key {name!r} must be "tenant/namespace"')
            elif {".", ".."} & set(name.split("/")):
                problems.append(f"namespace key {name!r}: '.' and '..' cannot be a tenant or "
                                "namespace name")
        if problems:
            raise ValueError("\n".join(problems))
        return v

    @model_validator(mode="after")
    def _check_levels(self) -> Settings:
        # every level's effective policy must be usable, not only each value on its own; every
        # problem is reported (one a line), not the first
        problems: list[str] = []
        levels: list[tuple[str, list[PolicyOverride]]] = [("offload", [])]
        levels += [(f"namespaces.{key_text(ns)}", [o]) for ns, o in self.namespaces.items()]
        for name, o in self.topics.items():
            ns = self.namespaces.get(TopicName.parse(name).ns)
            levels.append((f"topics.{key_text(name)}", [ns, o] if ns is not None else [o]))
        for where, overrides in levels:
            p = self._merge(overrides)
            if p.min_block_size_bytes is not None and (
                    p.min_block_size_bytes > p.max_block_size_bytes):
                problems.append(
                    f"[{where}] min_block_size_bytes ({p.min_block_size_bytes}) must not exceed "
                    f"max_block_size_bytes ({p.max_block_size_bytes})")
        problems += self._part_size_problems()
        if self.offload.retry_base_s > self.offload.retry_max_s:
            problems.append(f"[offload] retry_base_s ({self.offload.retry_base_s}) must not "
                            f"exceed retry_max_s ({self.offload.retry_max_s})")
        problems += self._orphan_grace_problems([(w, self._merge(o)) for w, o in levels])
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def _part_size_problems(self) -> list[str]:
        """S3 refuses a multipart part under its minimum but the last (EntityTooSmall): a part
        size below it fails every segment, forever. Blocks are not parts (several small blocks
        travel in one part, offload/parts.py), so block sizes are free."""
        if self.blobstore.driver != "aws-s3":
            return []
        floor = self.blobstore.min_part_size_bytes
        if self.blobstore.part_size_bytes >= floor:
            return []
        return [f"[blobstore] part_size_bytes ({self.blobstore.part_size_bytes}) is below the "
                f"store's smallest multipart part ({floor} bytes, [blobstore] "
                "min_part_size_bytes): S3 refuses every part but the last under it "
                f"(EntityTooSmall); set part_size_bytes to at least {floor}"]

    def _orphan_grace_problems(self, levels: list[tuple[str, OffloadPolicy]]) -> list[str]:
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
        if self.retention.orphan_grace_s >= need:
            return []
        return [f"[retention] orphan_grace_s ({self.retention.orphan_grace_s:g}) must be at "
                f"least {need:.0f}: a segment's upload may stay open {longest:.0f} s "
                f"({worst}), and gc must not take the daemon's live uploads for abandoned "
                f"ones (the grace is {ORPHAN_GRACE_FACTOR}x that; docs/config.md)"]

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
        # blocks are sized by their content by default: parts, not blocks, meet S3's minimum
        if policy.min_block_size_bytes is not None:
            return policy.min_block_size_bytes
        return 0
