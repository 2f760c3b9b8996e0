"""One backfill task: upload one planned segment's positions as a streaming object pair.

Runs inside a Spark task (a plain function of a picklable :class:`SegmentSpec`; no Spark import)
or in-process in tests. It opens its own blob store from the settings the driver shipped, reads
the ranges from the embedded ledger store in block-sized runs, and uploads through the
pipeline's own pieces, exactly as the streaming daemon does::

    source.read (one pread per block) ─▶ StreamingObjectBuilder.add_run ─▶ stamp_parts
      ─▶ SegmentUpload (multipart, ``in_flight`` parts at a time) ─▶ complete data object
      ─▶ put index (last: on the tier, the index marks a whole pair)

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from offloadd.blobstore.base import BlobStore
from offloadd.config import Settings
from offloadd.errors import ConfigError
from offloadd.format.checksum import stamp_parts
from offloadd.format.streaming import StreamingObjectBuilder
from offloadd.ledger.base import LedgerSource
from offloadd.model import TopicName
from offloadd.model.catalog import LedgerRange
from offloadd.model.keys import streaming_data_key, streaming_index_key
from offloadd.model.objects import index_metadata, object_metadata
from offloadd.offload.buffer import OffloadBuffer
from offloadd.offload.roller import RollPolicy
from offloadd.offload.upload import SegmentUpload


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
    key_prefix: str = ""

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
            key_prefix=spec.key_prefix)
    finally:
        await blobstore.close()
        await source.close()


async def upload_ranges(source: LedgerSource, blobstore: BlobStore, topic: TopicName,
                        uid: uuid.UUID, ranges: Sequence[LedgerRange],
                        ledger_ts: Mapping[int, int], *, max_block_size: int,
                        min_block_size: int, in_flight: int,
                        key_prefix: str = "") -> SegmentResult:
    """Write ``<uuid>`` and ``<uuid>-index`` for exactly ``ranges`` (in log order)."""
    if not ranges:
        raise ValueError(f"segment {uid} has no entries")
    t0 = time.monotonic()
    budget = RollPolicy(max_bytes=1 << 62, max_age_s=float("inf"),
                        max_block_size=max_block_size, min_block_size=min_block_size).block_budget
    buffer = OffloadBuffer((in_flight + 1) * budget)
    ml = topic.managed_ledger
    data_key = streaming_data_key(uid, key_prefix)
    upload = SegmentUpload(blobstore, data_key, object_metadata(ml, "data"), in_flight=in_flight)
    builder = StreamingObjectBuilder(max_block_size=max_block_size, min_block_size=min_block_size)
    await upload.start()
    entries = frame_bytes = payload_bytes = 0
    try:
        for r in ranges:
            nxt = r.first
            while nxt <= r.last:
                await buffer.reserve(budget)
                # A recycled array: fresh pages per block would cost page faults on every read.
                lease = buffer.lease(budget)
                try:
                    run = await source.read(topic, r.ledger_id, nxt, r.last, max_bytes=budget,
                                            into=lease)
                except BaseException:
                    buffer.release(budget)
                    buffer.give_back(lease)
                    raise
                size = len(run.data)
                if size < budget:
                    buffer.release(budget - size)
                else:
                    buffer.grow(size - budget)
                try:
                    parts = stamp_parts(builder.add_run(run))
                except BaseException:
                    buffer.release(size)
                    buffer.give_back(lease)
                    raise
                upload.submit(parts, _releaser(buffer, size, lease))
                entries += run.count
                frame_bytes += size
                payload_bytes += run.payload_bytes
                nxt = run.last_entry_id + 1
        await upload.complete()
        index = builder.finish(ledger_ts)
        await blobstore.put(streaming_index_key(uid, key_prefix), [index],
                            index_metadata(ml, data_length=upload.length, index=index))
    except BaseException:
        # Abort only this attempt's upload; delete nothing: a retry of this task (or a zombie
        # of it) writes the same uuid, and the driver deletes a failed uuid's objects itself
        # before moving the segment to a fresh one.
        await upload.abort()
        raise
    return SegmentResult(str(uid), upload.length, entries, frame_bytes,
                         payload_bytes, time.monotonic() - t0)


def _releaser(buffer: OffloadBuffer, n: int, lease: bytearray) -> Callable[[], None]:
    def release() -> None:
        buffer.release(n)
        buffer.give_back(lease)

    return release
