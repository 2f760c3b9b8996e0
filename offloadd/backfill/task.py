"""One backfill task: upload one planned segment's positions as a streaming object pair.

Runs inside a Spark task (a plain function of a picklable :class:`SegmentSpec`; no Spark import)
or in-process in tests. It opens its own blob store from the settings the driver shipped, reads
the ranges from the embedded ledger store in block-sized runs, and uploads them through the
pipeline's own pieces, exactly as the streaming daemon does::

    RunReader (one pread per block, into the buffer) ─▶ SegmentAttempt.feed (blocks, CRC32C,
      ``in_flight`` parts at a time) ─▶ seal: complete the data object, then put the index
      (last: on the tier, the index marks a whole pair)

Nothing is committed in metadata here: the driver marks the segment OFFLOADED once this returns.
Memory is bounded by an :class:`~offloadd.offload.buffer.OffloadBuffer` of ``in_flight + 1``
blocks, whose read arrays it recycles.

Failure: the multipart upload is aborted and the exception fails the Spark task. The task
deletes nothing: the objects of one uuid are a pure function of the spec (same ranges, same
block sizes: the same bytes), so a Spark retry of the task — or a zombie attempt still running
on a lost executor — can only write identical objects, and no late attempt can delete a pair
the driver has committed. Before the driver redoes a segment under a fresh uuid it deletes the
old uuid's objects itself; ``offloadd gc`` sweeps what a zombie writes after that.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from offloadd.blobstore.base import BlobStore
from offloadd.config import Settings
from offloadd.errors import ConfigError
from offloadd.ledger.base import LedgerSource
from offloadd.model import TopicName
from offloadd.model.catalog import LedgerRange
from offloadd.offload.attempt import Uploads, open_streaming
from offloadd.offload.buffer import OffloadBuffer
from offloadd.offload.parts import DEFAULT_PART_SIZE
from offloadd.offload.roller import RollPolicy
from offloadd.offload.runs import RunReader


@dataclass(frozen=True)
class SegmentSpec:
    """Everything a task needs, picklable: the driver builds one per attempt."""

    settings: Settings
    topic: str
    uid: str
    ranges: tuple[tuple[int, int, int], ...]  # (ledger id, first entry, last entry)
    ledger_ts: tuple[tuple[int, int], ...]  # (ledger id, LedgerInfo timestamp ms)
    max_block_size: int
    min_block_size: int
    in_flight: int

    @property
    def ledger_ranges(self) -> tuple[LedgerRange, ...]:
        return tuple(LedgerRange(*r) for r in self.ranges)


@dataclass(frozen=True)
class SegmentResult:
    uid: str
    data_length: int
    entries: int
    frame_bytes: int
    payload_bytes: int
    seconds: float
    stored_bytes: int = 0  # data and index objects
    put_requests: int = 0  # PUT-class requests that wrote them (retries not included)


def absolute_paths(settings: Settings) -> Settings:
    """The same settings with every local path absolute, so executors find the same files."""
    src = settings.source.model_copy(update={"path": settings.source.path.resolve()})
    bs = settings.blobstore.model_copy(update={"path": settings.blobstore.path.resolve()})
    md = settings.metadata
    if md.url.startswith("embedded:"):
        where = md.url[len("embedded:"):] or "./data/metadata"
        md = md.model_copy(update={"url": f"embedded:{Path(where).resolve()}"})
    return settings.model_copy(update={"source": src, "blobstore": bs, "metadata": md})


def upload_segment(spec: SegmentSpec) -> SegmentResult:
    """The Spark task body: a fresh event loop, the configured stores, one segment."""
    import uvloop

    return uvloop.run(_upload_from_settings(spec))


async def _upload_from_settings(spec: SegmentSpec) -> SegmentResult:
    from offloadd import wiring
    from offloadd.ledger.local import LocalLedgerSource
    from offloadd.metadata.memory import MemoryMetadataStore

    settings = spec.settings
    if settings.source.kind != "local":
        raise ConfigError(f'[source] kind = "{settings.source.kind}": backfill reads the '
                          'embedded ledger store only (kind = "local")')
    # Reads of the embedded store touch only the ledger files (see LocalLedgerSource); the
    # metadata store it is built with is never consulted, so a task opens no metadata session.
    source = LocalLedgerSource(settings.source.path, MemoryMetadataStore(),
                               verify_crc=settings.source.verify_crc)
    blobstore = await wiring.open_blobstore(settings)
    try:
        return await upload_ranges(
            source, blobstore, TopicName.parse(spec.topic), uuid.UUID(spec.uid),
            spec.ledger_ranges, dict(spec.ledger_ts), max_block_size=spec.max_block_size,
            min_block_size=spec.min_block_size, in_flight=spec.in_flight,
            part_size=settings.blobstore.part_size_bytes)
    finally:
        await blobstore.close()
        await source.close()


async def upload_ranges(source: LedgerSource, blobstore: BlobStore, topic: TopicName,
                        uid: uuid.UUID, ranges: Sequence[LedgerRange],
                        ledger_ts: Mapping[int, int], *, max_block_size: int,
                        min_block_size: int, in_flight: int,
                        part_size: int = DEFAULT_PART_SIZE) -> SegmentResult:
    """Write ``<uuid>`` and ``<uuid>-index`` for exactly ``ranges`` (in log order)."""
    if not ranges:
        raise ValueError(f"segment {uid} has no entries")
    t0 = time.monotonic()
    budget = RollPolicy(max_bytes=1 << 62, max_age_s=float("inf"),
                        max_block_size=max_block_size, min_block_size=min_block_size).block_budget
    reader = RunReader(source, OffloadBuffer((in_flight + 1) * budget), topic)
    att = await open_streaming(Uploads(blobstore, topic.managed_ledger, in_flight,
                                       part_size=part_size),
                               max_block_size=max_block_size, min_block_size=min_block_size,
                               uid=uid, opened_at=t0)
    try:
        for r in ranges:
            async for run in reader.runs(r, budget):
                att.feed(run, ledger_ts.get(r.ledger_id, 0))
        await att.seal()
    except BaseException:
        # Abort only this attempt's upload; delete nothing: a retry of this task (or a zombie
        # of it) writes the same uuid, and the driver deletes a failed uuid's objects itself
        # before moving the segment to a fresh one.
        await att.abort()
        raise
    usage = att.usage
    return SegmentResult(str(uid), att.length, att.entries, att.frame_bytes, att.payload_bytes,
                         time.monotonic() - t0, usage.stored_bytes, usage.put_requests)
