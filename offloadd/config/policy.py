"""The offload policy: ``[offload]``, and the per-namespace and per-topic levels over it.

Each field resolves on its own, topic over namespace over broker (``[topics."..."]`` over
``[namespaces."t/ns"]`` over ``[offload]``), like Pulsar's offload policies
(:meth:`offloadd.config.Settings.policy_for`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from offloadd.config.fields import BYTES, BYTES_PER_S, MIBS, Section, alias
from offloadd.model.sizes import MiB

# Pulsar's names for the byte threshold: the offload policy's, broker.conf's older one, and
# the one issue reports used (accepted so such a file loads)
THRESHOLD_BYTES = ("threshold_bytes", "managedLedgerOffloadThresholdInBytes",
                   "managedLedgerOffloadAutoTriggerSizeThresholdBytes",
                   "managedLedgerOffloadMaxThresholdInBytes")


class OffloadPolicy(Section):
    """Per-topic fields; every level may set any of them."""

    mode: Literal["streaming", "ledger"] = Field(
        "streaming", description="streaming segments (PIP-76) or whole ledgers (PIP-17)")
    max_size_per_segment_mbytes: Annotated[float, MIBS] = Field(64.0, gt=0, validation_alias=alias(
        "max_size_per_segment_mbytes", "maxSizePerOffloadSegmentMbytes"))
    max_segment_rollover_time_minutes: float = Field(10.0, gt=0, validation_alias=alias(
        "max_segment_rollover_time_minutes", "maxOffloadSegmentRolloverTimeMinutes"))
    max_block_size_bytes: Annotated[int, BYTES] = Field(64 * MiB, ge=1024, validation_alias=alias(
        "max_block_size_bytes", "managedLedgerOffloadMaxBlockSizeInBytes",
        "s3ManagedLedgerOffloadMaxBlockSizeInBytes"))
    min_block_size_bytes: Annotated[int | None, BYTES] = Field(
        None, ge=0, description="pad blocks to this (default: none, blocks are sized by their "
        "content; multipart parts group blocks, [blobstore] part_size_bytes)")
    deletion_lag_ms: int = Field(14_400_000, ge=0, validation_alias=alias(
        "deletion_lag_ms", "managedLedgerOffloadDeletionLagInMillis"))
    threshold_bytes: Annotated[int, BYTES] = Field(
        -1, ge=-1, validation_alias=alias(*THRESHOLD_BYTES))
    threshold_seconds: float = Field(-1.0, ge=-1, validation_alias=alias(
        "threshold_seconds", "managedLedgerOffloadThresholdInSeconds"))


class PolicyOverride(Section):
    mode: Literal["streaming", "ledger"] | None = None
    max_size_per_segment_mbytes: Annotated[float | None, MIBS] = Field(
        None, gt=0, validation_alias=alias(
        "max_size_per_segment_mbytes", "maxSizePerOffloadSegmentMbytes"))
    max_segment_rollover_time_minutes: float | None = Field(None, gt=0, validation_alias=alias(
        "max_segment_rollover_time_minutes", "maxOffloadSegmentRolloverTimeMinutes"))
    max_block_size_bytes: Annotated[int | None, BYTES] = Field(
        None, ge=1024, validation_alias=alias(
        "max_block_size_bytes", "managedLedgerOffloadMaxBlockSizeInBytes",
        "s3ManagedLedgerOffloadMaxBlockSizeInBytes"))
    min_block_size_bytes: Annotated[int | None, BYTES] = Field(None, ge=0)
    deletion_lag_ms: int | None = Field(None, ge=0, validation_alias=alias(
        "deletion_lag_ms", "managedLedgerOffloadDeletionLagInMillis"))
    threshold_bytes: Annotated[int | None, BYTES] = Field(None, ge=-1, validation_alias=alias(
        *THRESHOLD_BYTES))
    threshold_seconds: float | None = Field(None, ge=-1, validation_alias=alias(
        "threshold_seconds", "managedLedgerOffloadThresholdInSeconds"))


class OffloadSettings(OffloadPolicy):
    flow_permits_per_second: Annotated[float, BYTES_PER_S] = Field(
        0.0, ge=0, validation_alias=alias(
        "flow_permits_per_second", "managedLedgerOffloadBrokerFlowPermitsPerSecond",
        "managedLedgerOffloadBrokerFlowPermits"),
        description="broker-wide upload bytes/s; 0 = unlimited")
    burst_bytes: Annotated[int | None, BYTES] = Field(
        None, ge=1, description="default: one second of permits")
    buffer_max_bytes: Annotated[int, BYTES] = Field(
        256 * MiB, ge=MiB, description="offload buffer cap")
    blocks_in_flight: int = Field(4, ge=1, le=64)
    read_prefetch_blocks: int = Field(8, ge=0, le=64, description="blocks fetched ahead of a "
                                      "reader (memory: this × block size)")
    read_buffer_bytes: Annotated[int | None, BYTES] = Field(
        None, ge=1, validation_alias=alias(
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
