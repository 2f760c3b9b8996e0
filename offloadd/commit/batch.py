"""The commit batcher: many topics' fenced compare-and-set writes in one store request.

Each topic task commits on its own (:func:`offloadd.commit.edits.apply`: read, edit, write the
new bytes with the fence's check, under compare-and-set). With thousands of topics closing
segments at once, one request (and on the embedded store one fsync) per write is what limits
the rate. The batcher takes the *write* of each compare-and-set — the ops one ``multi`` would
carry — and sends the writes that arrive together as one request through the store's
:class:`~offloadd.metadata.base.BatchedMulti` capability::

    topic A: multi([check epoch A, set ML A @v7]) ─┐
    topic B: multi([check epoch B, set ML B @v3]) ─┼─▶ queue ─▶ multi_batch([[A...], [B...], ...])
    topic C: multi([check epoch C, set ML C @v9]) ─┘     (one SQLite transaction / ZooKeeper multi)

Each write stays what it was: all of its ops or none, fenced and compare-and-set. A write the
store refuses (its version moved, its fence's check failed) gets its own ``Conflict`` /
``NotFound`` back and goes round its compare-and-set loop again; the others of the batch land.
An error of the request itself (the store unreachable) fails every write of the batch, as it
would have failed each on its own.

When the batches go: the first write to arrive starts a flush after ``window_s`` (a few ms, so
the topics woken by one event queue up together); while one batch is in the store, what arrives
waits and goes as the next batch, so under load the batches grow by themselves. A batch is
capped (``max_groups`` writes, ``max_bytes``: ZooKeeper refuses a request over its
``jute.maxbuffer``, 1 MiB by default). A store without the capability gets each write on its
own, as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from offloadd.metadata.base import BatchedMulti, CreateOp, MetadataStore, Op, SetOp

__all__ = ["CommitBatcher"]

log = logging.getLogger(__name__)

WINDOW_S = 0.002
MAX_GROUPS = 256
# Well under ZooKeeper's default jute.maxbuffer (1 MiB) for one request, paths and framing
# included; a single write larger than this still goes, alone.
MAX_BYTES = 512 * 1024

Results = list[int | str | None]


@dataclass(eq=False)
class _Write:
    ops: Sequence[Op]
    future: asyncio.Future[Results]
    size: int


def _size(ops: Sequence[Op]) -> int:
    return sum(len(op.path) + 16 + (len(op.data) if isinstance(op, CreateOp | SetOp) else 0)
               for op in ops)


class CommitBatcher:
    """Sends the ``multi`` writes handed to :meth:`multi` in batches (see the module doc)."""

    def __init__(self, store: MetadataStore, *, window_s: float = WINDOW_S,
                 max_groups: int = MAX_GROUPS, max_bytes: int = MAX_BYTES) -> None:
        self.store = store
        self._batched = store if isinstance(store, BatchedMulti) else None
        self.window_s = window_s
        self.max_groups = max_groups
        self.max_bytes = max_bytes
        self._queue: deque[_Write] = deque()
        self._flusher: asyncio.Task[None] | None = None
        self._closed = False
        self.batches = 0  # requests sent through the capability
        self.writes = 0  # writes they carried

    @property
    def batching(self) -> bool:
        """Whether the store takes batches (else every write goes on its own)."""
        return self._batched is not None

    async def multi(self, ops: Sequence[Op]) -> Results:
        """What ``store.multi(ops)`` returns (or raises), with ``ops`` sent in a batch."""
        if self._batched is None or self._closed or not ops:
            return await self.store.multi(ops)
        loop = asyncio.get_running_loop()
        write = _Write(ops, loop.create_future(), _size(ops))
        self._queue.append(write)
        if self._flusher is None:
            self._flusher = loop.create_task(self._flush(), name="commit batcher")
        # A caller cancelled here leaves its write to the batch: a cancelled write may or may
        # not land, as with a request already sent on its own.
        return await write.future

    async def close(self, timeout_s: float | None = None) -> None:
        """Send what is queued (waiting at most ``timeout_s``: a hung store must not hold a
        stop up; what is then still in flight may or may not land, like any write whose answer
        never came); later writes go on their own."""
        self._closed = True
        if self._flusher is not None:
            await asyncio.wait({self._flusher}, timeout=timeout_s)

    async def _flush(self) -> None:
        assert self._batched is not None
        batch: list[_Write] = []
        try:
            await asyncio.sleep(self.window_s)
            while self._queue:
                batch = self._take()
                if not batch:
                    continue
                self.batches += 1
                self.writes += len(batch)
                try:
                    results = await self._batched.multi_batch([w.ops for w in batch])
                except Exception as exc:  # the request itself failed: so did each write
                    for w in batch:
                        if not w.future.done():
                            w.future.set_exception(exc)
                    continue
                for w, result in zip(batch, results, strict=True):
                    if w.future.done():
                        continue
                    if isinstance(result, BaseException):
                        w.future.set_exception(result)
                    else:
                        w.future.set_result(result)
                batch = []
        except asyncio.CancelledError:
            for w in [*batch, *self._queue]:
                w.future.cancel()
            self._queue.clear()
            raise
        finally:
            self._flusher = None

    def _take(self) -> list[_Write]:
        """The next batch: queued writes, oldest first, within the caps (at least one)."""
        batch: list[_Write] = []
        size = 0
        while self._queue and len(batch) < self.max_groups:
            w = self._queue[0]
            if w.future.done():  # its caller was cancelled before it was sent: drop it
                self._queue.popleft()
                continue
            if batch and size + w.size > self.max_bytes:
                break
            batch.append(self._queue.popleft())
            size += w.size
        return batch
