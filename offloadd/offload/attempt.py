"""One attempt at one segment's object pair: open, feed runs, seal, or abort.

The commit protocol on the tier (STYLE 7) is this module's: a fresh uuid per attempt, the data
object uploaded part by part as runs are fed (``blocks_in_flight`` parts at a time, each through
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
from offloadd.format.checksum import stamp_parts
from offloadd.format.layout import Part
from offloadd.format.ledger import LedgerObjectBuilder, build_ledger_metadata
from offloadd.format.streaming import StreamingObjectBuilder
from offloadd.model import EntryRun, LedgerDesc, Position
from offloadd.model.catalog import LedgerRange
from offloadd.model.keys import (
    ledger_data_key,
    ledger_index_key,
    streaming_data_key,
    streaming_index_key,
)
from offloadd.model.objects import index_metadata, object_metadata
from offloadd.offload.runs import Run
from offloadd.offload.upload import Acquire, SegmentUpload

__all__ = ["SegmentAttempt", "Uploads", "attempt_keys", "delete_attempt", "open_ledger",
           "open_streaming"]


@dataclass(frozen=True)
class Uploads:
    """How one topic's data objects are uploaded: where, how many parts at once, through which
    throttle, reporting each part to whom."""

    store: BlobStore
    ml_name: str
    in_flight: int
    acquire: Acquire | None = None
    on_part_done: Callable[[int, float], None] | None = None

    async def start(self, key: str) -> SegmentUpload:
        upload = SegmentUpload(self.store, key, object_metadata(self.ml_name, "data"),
                               in_flight=self.in_flight, acquire=self.acquire,
                               on_part_done=self.on_part_done)
        await upload.start()
        return upload


@dataclass(eq=False)
class SegmentAttempt:
    """An attempt in progress: its uuid, its upload, what it holds so far."""

    uid: uuid.UUID
    upload: SegmentUpload
    uploads: Uploads
    index_key: str
    add: Callable[[EntryRun], Sequence[Part]]  # the format's builder: a run -> its parts
    finish: Callable[[SegmentAttempt], bytes]  # the index bytes, once every part landed
    opened_at: float
    redo_of: uuid.UUID | None = None  # the ASSIGNED record this attempt replaces
    ranges: list[LedgerRange] = field(default_factory=list)
    frame_bytes: int = 0
    payload_bytes: int = 0
    ledger_ts: dict[int, int] = field(default_factory=dict)  # ledger -> LedgerInfo timestamp
    close_target: Position | None = None  # where a decided roll closes the segment

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
        """The data object's length so far (its full length once sealed)."""
        return self.upload.length

    async def wait_for_room(self) -> None:
        """Until fewer parts are pending than may be in flight (read no further ahead)."""
        await self.upload.wait_for_room()

    def feed(self, run: Run, ledger_ts: int = 0) -> int:
        """Lay ``run`` into blocks and submit its parts; their buffer bytes are released once
        they landed (at once if building them fails). How many parts."""
        try:
            parts = stamp_parts(self.add(run.entries))
        except BaseException:
            run.release()
            raise
        e = run.entries
        if self.ranges and self.ranges[-1].ledger_id == e.ledger_id:
            last = self.ranges[-1]
            self.ranges[-1] = LedgerRange(last.ledger_id, last.first, e.last_entry_id)
        else:
            self.ranges.append(LedgerRange(e.ledger_id, e.first_entry_id, e.last_entry_id))
        self.frame_bytes += len(e.data)
        self.payload_bytes += e.payload_bytes
        self.ledger_ts.setdefault(e.ledger_id, ledger_ts)
        self.upload.submit(parts, run.release)
        return len(parts)

    async def seal(self) -> None:
        """Wait for every part, complete the data object, then write the index (last).

        ``Fenced`` when the store refuses to overwrite an existing data or index object (its
        create-only writes, the second fence: blobstore/base.py): another writer got there
        first, so this attempt has lost and must stop, not retry; nothing is deleted here."""
        try:
            await self.upload.complete()
            index = self.finish(self)
            meta = index_metadata(self.uploads.ml_name, data_length=self.upload.length,
                                  index=index)
            await self.uploads.store.put(self.index_key, [index], meta)
        except Conflict as exc:
            raise Fenced(f"segment {self.uid}: {exc}; another writer holds these keys, this "
                         "attempt stops") from exc

    async def abort(self) -> None:
        """Cancel the parts in flight and discard the upload (best effort)."""
        await self.upload.abort()


async def open_streaming(uploads: Uploads, *, max_block_size: int, min_block_size: int = 0,
                         uid: uuid.UUID | None = None, redo_of: uuid.UUID | None = None,
                         opened_at: float | None = None) -> SegmentAttempt:
    """A streaming (PIP-76) pair ``<uuid>`` + ``<uuid>-index``, runs of any ledgers in order."""
    uid = uid or uuid.uuid4()
    upload = await uploads.start(streaming_data_key(uid))
    builder = StreamingObjectBuilder(max_block_size=max_block_size,
                                     min_block_size=min_block_size)
    return SegmentAttempt(uid, upload, uploads, streaming_index_key(uid), builder.add_run,
                          lambda att: builder.finish(att.ledger_ts),
                          time.monotonic() if opened_at is None else opened_at, redo_of)


async def open_ledger(uploads: Uploads, desc: LedgerDesc, uid: uuid.UUID, *,
                      max_block_size: int, opened_at: float) -> SegmentAttempt:
    """A ledger-based (PIP-17) pair for the whole closed ledger ``desc``: its runs from entry 0
    in order, the last block exact."""
    upload = await uploads.start(ledger_data_key(uid, desc.ledger_id))
    builder = LedgerObjectBuilder(ledger_id=desc.ledger_id, max_block_size=max_block_size)

    def add(run: EntryRun) -> Sequence[Part]:
        return builder.add_run(run, last=run.last_entry_id == desc.last_entry_id)

    def finish(att: SegmentAttempt) -> bytes:
        return builder.finish(build_ledger_metadata(
            last_entry_id=desc.last_entry_id, length=desc.size, ctime_ms=desc.ctime_ms,
            custom_metadata={"application": b"pulsar", "component": b"managed-ledger",
                             "pulsar/managed-ledger": uploads.ml_name.encode()}))

    return SegmentAttempt(uid, upload, uploads, ledger_index_key(uid, desc.ledger_id), add,
                          finish, opened_at)


def attempt_keys(uid: uuid.UUID, ledger_ids: Iterable[int] = ()) -> list[str]:
    """Every object an attempt under ``uid`` may have written (streaming, and ledger-based for
    ``ledger_ids``), each index before its data: a pair half deleted then looks abandoned,
    never committed with its data missing."""
    keys = [streaming_index_key(uid), streaming_data_key(uid)]
    for lid in ledger_ids:
        keys += [ledger_index_key(uid, lid), ledger_data_key(uid, lid)]
    return keys


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
