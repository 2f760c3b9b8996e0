"""One attempt at one segment's object pair: open, feed runs, seal, or abort.

The commit protocol on the tier is this module's, in one place because a crash between any two
of its steps must leave nothing a reader takes for data: a fresh uuid per attempt, the data
object uploaded part by part as runs are fed (blocks grouped into parts of at least
``part_size`` bytes, ``offload/parts.py``; ``blocks_in_flight`` parts at a time, each through
the throttle), then the index written **last**: an index on the tier is what marks a whole pair.
The streaming mode, the ledger-based mode and the backfill task all write their objects
through :class:`SegmentAttempt`::

    open_streaming / open_ledger ─▶ feed(run) ... ─▶ seal()  = complete data, put index
                                                └──▶ abort() = cancel parts, discard upload

Recording the attempt in the catalog (ASSIGNED, OFFLOADED) is not done here: the caller commits
around it (:mod:`offloadd.commit.edits`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from offloadd.blobstore.base import BlobStore
from offloadd.errors import Conflict, Fenced, OffloaddError
from offloadd.format.checksum import RECORD_KEY, RECORD_VALUE, stamp_blocks
from offloadd.format.layout import Block
from offloadd.format.ledger import LedgerObjectBuilder, build_ledger_metadata
from offloadd.format.streaming import StreamingObjectBuilder
from offloadd.model import EntryRun, LedgerDesc, Position
from offloadd.model.catalog import LedgerRange, TierUsage
from offloadd.model.ids import random_uuid
from offloadd.model.keys import (
    ledger_data_key,
    ledger_index_key,
    segment_keys,
    streaming_data_key,
    streaming_index_key,
)
from offloadd.model.objects import index_metadata, object_metadata
from offloadd.offload.parts import DEFAULT_PART_SIZE, PartAssembler, UploadPart
from offloadd.offload.runs import Run
from offloadd.offload.upload import Acquire, SegmentUpload

__all__ = ["SegmentAttempt", "Uploads", "attempt_keys", "delete_attempt", "open_ledger",
           "open_streaming"]


@dataclass(frozen=True, slots=True)
class Uploads:
    """How one topic's data objects are uploaded: where, how many parts at once and how large,
    through which throttle, reporting each part to whom."""

    store: BlobStore
    ml_name: str
    in_flight: int
    acquire: Acquire | None = None
    on_part_done: Callable[[int, float], None] | None = None
    part_size: int = DEFAULT_PART_SIZE

    async def start(self, key: str) -> SegmentUpload:
        upload = SegmentUpload(self.store, key, object_metadata(self.ml_name, "data"),
                               in_flight=self.in_flight, acquire=self.acquire,
                               on_part_done=self.on_part_done)
        return upload  # the multipart upload is created with the first part (upload.py)


@dataclass(eq=False)
class _Hold:
    """A run whose bytes back blocks not yet landed: released when the last one has."""

    run: Run
    blocks: int


@dataclass(eq=False)
class SegmentAttempt:
    """An attempt in progress: its uuid, its upload, what it holds so far."""

    uid: uuid.UUID
    upload: SegmentUpload
    uploads: Uploads
    index_key: str
    add: Callable[[EntryRun], Sequence[Block]]  # the format's builder: a run -> its blocks
    finish: Callable[[SegmentAttempt], bytes]  # the index bytes, once every part landed
    opened_at: float
    redo_of: uuid.UUID | None = None  # the ASSIGNED record this attempt replaces
    ranges: list[LedgerRange] = field(default_factory=list)
    frame_bytes: int = 0
    payload_bytes: int = 0
    ledger_ts: dict[int, int] = field(default_factory=dict)  # ledger -> LedgerInfo timestamp
    close_target: Position | None = None  # where a decided roll closes the segment
    parts: PartAssembler | None = None  # default: one of ``uploads.part_size``
    index_length: int = 0  # the index object's length, once sealed
    _holds: dict[int, _Hold] = field(default_factory=dict)  # block ordinal -> its run's hold

    def __post_init__(self) -> None:
        if self.parts is None:
            self.parts = PartAssembler(self.uploads.part_size)

    @property
    def end(self) -> Position | None:
        if not self.ranges:
            return None
        return Position(self.ranges[-1].ledger_id, self.ranges[-1].last)

    @property
    def entries(self) -> int:
        return sum(r.count for r in self.ranges)

    @property
    def length(self) -> int:
        """Bytes of data object submitted so far (its full length once sealed)."""
        return self.upload.length

    async def wait_for_room(self) -> None:
        """Until fewer parts are pending than may be in flight (read no further ahead)."""
        await self.upload.wait_for_room()

    def feed(self, run: Run, ledger_ts: int = 0) -> int:
        """Lay ``run`` into blocks and submit the parts they fill; the run's buffer bytes are
        released once every block of it landed (at once if building them fails). The runs of
        blocks left waiting for a part to fill are parked (:meth:`OffloadBuffer.park`), the
        others unparked. How many parts were submitted."""
        assert self.parts is not None
        try:
            blocks = stamp_blocks(self.add(run.entries), run.entries.sums)
            parts = self.parts.add(blocks)
        except BaseException:
            run.release()
            raise
        if blocks:
            hold = _Hold(run, len(blocks))
            for b in blocks:
                self._holds[b.number] = hold
        else:
            run.release()
        waiting = {id(self._holds[b.number]) for b in self.parts.pending}
        for h in {id(h): h for h in self._holds.values()}.values():
            if id(h) in waiting:
                h.run.park()
            else:
                h.run.unpark()
        e = run.entries
        if self.ranges and self.ranges[-1].ledger_id == e.ledger_id:
            last = self.ranges[-1]
            self.ranges[-1] = LedgerRange(last.ledger_id, last.first, e.last_entry_id)
        else:
            self.ranges.append(LedgerRange(e.ledger_id, e.first_entry_id, e.last_entry_id))
        self.frame_bytes += len(e.data)
        self.payload_bytes += e.payload_bytes
        self.ledger_ts.setdefault(e.ledger_id, ledger_ts)
        self.upload.submit(parts, self._landed)
        return len(parts)

    def _landed(self, part: UploadPart) -> None:
        """``part`` is done (landed, failed or cancelled): its blocks hold their runs no more."""
        self._let_go(part.blocks)

    def _let_go(self, blocks: Iterable[Block]) -> None:
        for b in blocks:
            hold = self._holds.pop(b.number, None)
            if hold is None:
                continue
            hold.blocks -= 1
            if hold.blocks == 0:
                hold.run.release()

    async def seal(self) -> None:
        """Submit the last part, wait for every part, complete the data object, then write the
        index (last).

        ``Fenced`` when the store refuses to overwrite an existing data or index object (its
        create-only writes, the second fence: blobstore/base.py): another writer got there
        first, so this attempt has lost and must stop, not retry; nothing is deleted here."""
        assert self.parts is not None
        last = self.parts.finish()
        try:
            await self.upload.finish(last, self._landed)
            index = self.finish(self)
            meta = index_metadata(self.uploads.ml_name, data_length=self.upload.length,
                                  index=index)
            await self.uploads.store.put(self.index_key, [index], meta)
        except Conflict as exc:
            raise Fenced(f"segment {self.uid}: {exc}; another writer holds these keys, this "
                         "attempt stops") from exc
        self.index_length = len(index)

    @property
    def usage(self) -> TierUsage:
        """What the sealed pair costs in the tier: two objects, their bytes, and the PUT-class
        requests that wrote them (create, the parts, complete, or the one PUT of a data object
        that is all one part; then the index's PUT; retries are counted by the driver, not
        here)."""
        return TierUsage(2, self.upload.length + self.index_length, self.payload_bytes,
                         self.upload.requests + 1)

    async def abort(self) -> None:
        """Cancel the parts in flight and discard the upload (best effort); the runs behind
        blocks that never left are released."""
        try:
            await self.upload.abort()
        finally:
            assert self.parts is not None
            self._let_go(self.parts.pending)


async def open_streaming(uploads: Uploads, *, max_block_size: int, min_block_size: int = 0,
                         uid: uuid.UUID | None = None, redo_of: uuid.UUID | None = None,
                         opened_at: float | None = None) -> SegmentAttempt:
    """A streaming (PIP-76) pair ``<uuid>`` + ``<uuid>-index``, runs of any ledgers in order."""
    uid = uid or random_uuid()
    upload = await uploads.start(streaming_data_key(uid))
    builder = StreamingObjectBuilder(max_block_size=max_block_size,
                                     min_block_size=min_block_size)
    return SegmentAttempt(uid, upload, uploads, streaming_index_key(uid), builder.add_run,
                          # every block is stamped (feed): the index records it
                          lambda att: builder.finish(att.ledger_ts, checksummed=True),
                          time.monotonic() if opened_at is None else opened_at, redo_of)


async def open_ledger(uploads: Uploads, desc: LedgerDesc, uid: uuid.UUID, *,
                      max_block_size: int, opened_at: float) -> SegmentAttempt:
    """A ledger-based (PIP-17) pair for the whole closed ledger ``desc``: its runs from entry 0
    in order, the last block exact."""
    upload = await uploads.start(ledger_data_key(uid, desc.ledger_id))
    builder = LedgerObjectBuilder(ledger_id=desc.ledger_id, max_block_size=max_block_size)

    def add(run: EntryRun) -> Sequence[Block]:
        return builder.add_run(run, last=run.last_entry_id == desc.last_entry_id)

    def finish(att: SegmentAttempt) -> bytes:
        return builder.finish(build_ledger_metadata(
            last_entry_id=desc.last_entry_id, length=desc.size, ctime_ms=desc.ctime_ms,
            custom_metadata={"application": b"pulsar", "component": b"managed-ledger",
                             "pulsar/managed-ledger": uploads.ml_name.encode(),
                             # every block is stamped (feed): the index records it
                             RECORD_KEY: RECORD_VALUE}))

    return SegmentAttempt(uid, upload, uploads, ledger_index_key(uid, desc.ledger_id), add,
                          finish, opened_at)


def attempt_keys(uid: uuid.UUID, ledger_ids: Iterable[int] = ()) -> list[str]:
    """Every object an attempt under ``uid`` may have written (streaming, and ledger-based for
    ``ledger_ids``), each index before its data: a pair half deleted then looks abandoned,
    never committed with its data missing."""
    return segment_keys(uid) + segment_keys(uid, ledger_ids)


async def delete_attempt(store: BlobStore, uid: uuid.UUID, ledger_ids: Iterable[int] = (),
                         on_error: Callable[[str, OffloaddError], None] | None = None) -> None:
    """Delete what an attempt wrote (absent objects are fine). A failure raises, unless
    ``on_error(key, exc)`` takes it and the rest are still tried."""
    for key in attempt_keys(uid, ledger_ids):
        try:
            await store.delete(key)
        except OffloaddError as exc:
            if on_error is None:
                raise
            on_error(key, exc)
