"""Keeps a topic's offload status record (:mod:`offloadd.metadata.offload_status`) up to date.

The topic task reports what happens (:meth:`StatusRecorder.succeeded`, :meth:`~.failed`,
:meth:`~.stopped`); the recorder folds it into one :class:`OffloadStatus` and writes it from a
task of its own, so a slow or unreachable metadata store never holds the offload up:

* a change of ``state`` (``ok`` → ``failing``, ``failing`` → ``ok``, → ``stopped``) is written at
  once;
* anything else (another commit, another failed attempt) at most once per ``interval_s``, the
  latest state winning — a busy topic costs one write per interval, not one per segment;
* a write that fails is retried at the next interval; ``Fenced`` (another owner holds the
  topic) ends the recorder: the successor writes from then on.

:meth:`close` writes what is pending (bounded by ``close_timeout_s``) and stops the task;
:func:`close_many` does it for thousands at a stop, their records in a few batched requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence

from offloadd.commit.fence import Fence
from offloadd.errors import Fenced, OffloaddError
from offloadd.metadata import cas, offload_status
from offloadd.metadata.base import BatchedMulti, MetadataStore, Op, SetOp, Versioned
from offloadd.metadata.offload_status import OffloadStatus
from offloadd.model import Position
from offloadd.model.keys import offload_status_path

__all__ = ["StatusRecorder", "close_many"]

log = logging.getLogger(__name__)


class StatusRecorder:
    # one per topic: 10,000 of them (issue 22), no instance dict
    __slots__ = ("_clock", "_close_timeout", "_dirty", "_fence", "_fenced", "_interval", "_kick",
                 "_known", "_ml", "_multi", "_started", "_store", "_task", "_urgent", "_wall_ms",
                 "_written", "_written_at", "status", "writes")

    def __init__(self, store: MetadataStore, ml_name: str, fence: Fence, owner: str, *,
                 interval_s: float = 30.0, close_timeout_s: float = 5.0,
                 wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
                 clock: Callable[[], float] = time.monotonic,
                 initial: OffloadStatus | None = None,
                 multi: cas.Multi | None = None, known: cas.Known | None = None) -> None:
        self._store = store
        self._ml = ml_name
        self._fence = fence
        self._interval = interval_s
        self._close_timeout = close_timeout_s
        self._wall_ms = wall_ms
        self._clock = clock
        self._multi = multi  # a commit batcher's: the write goes with other topics'
        # the record as last read (by whoever read ``initial``) or written: a write reads it
        # first only when that copy turns out out of date
        self._known = known if known is not None else cas.Known()
        base = initial or OffloadStatus()
        # A new owner keeps what is known of the past (the last success, a failing streak: as
        # far as anyone knows the topic is still failing until an attempt says otherwise).
        state = base.state if base.state != "stopped" else \
            ("failing" if base.failed_attempts else "ok")
        self.status = dataclasses.replace(base, owner=owner, state=state, updated_ms=0)
        self._written: OffloadStatus | None = None
        self._written_at = float("-inf")
        self._urgent = True  # the first record of an owner goes out at once
        # Something to write. The writing task runs only while there is (issue 22: an idle
        # topic holds no task, event or timer here); a change during its interval wait
        # completes ``_kick`` to cut the wait short.
        self._dirty = True
        self._kick: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._started = False  # between start() and close()
        self._fenced = False
        self.writes = 0

    # -- what happened -------------------------------------------------------------------------
    def succeeded(self, position: Position, segment: str, when_ms: int | None = None) -> None:
        now = when_ms if when_ms is not None else self._wall_ms()
        self._update(state="ok", failed_attempts=0, failing_since_ms=None,
                     last_success_ms=now, last_success_position=str(position),
                     last_segment=segment)

    def failed(self, error: str, attempts: int, when_ms: int | None = None) -> None:
        now = when_ms if when_ms is not None else self._wall_ms()
        since = self.status.failing_since_ms if self.status.state == "failing" else None
        self._update(state="failing", failed_attempts=attempts,
                     failing_since_ms=since if since is not None else now,
                     last_error=error, last_error_ms=now)

    def cleared(self) -> None:
        """What failed works again without a commit (recovery, say): not failing any more."""
        self._update(state="ok", failed_attempts=0, failing_since_ms=None)

    def stopped(self) -> None:
        self._update(state="stopped")

    def read_requests(self, requests: int, nbytes: int, when_ms: int | None = None) -> None:
        """GET-class requests (and bytes) made reading the topic back (written with the next
        periodic write: not a state change)."""
        if requests <= 0:
            return
        s = self.status
        since = s.get_since_ms if s.get_since_ms is not None else (
            when_ms if when_ms is not None else self._wall_ms())
        self._update(get_requests=s.get_requests + requests, get_bytes=s.get_bytes + nbytes,
                     get_since_ms=since)

    def _update(self, **changes: object) -> None:
        old = self.status
        new = dataclasses.replace(old, **changes)  # type: ignore[arg-type]
        if new == old:
            return
        if new.state != old.state:
            self._urgent = True
        self.status = new
        self._mark_dirty()

    # -- writing ------------------------------------------------------------------------------
    def start(self) -> None:
        self._started = True
        self._run_if_dirty()

    def _mark_dirty(self) -> None:
        self._dirty = True
        kick = self._kick
        if kick is not None and not kick.done():
            kick.set_result(None)
        self._run_if_dirty()

    def _run_if_dirty(self) -> None:
        if self._task is None and self._started and self._dirty and not self._fenced:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"status {self._ml}")

    async def _run(self) -> None:
        # (asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation that
        # races with the inner wait finishing, and close() would wait for ever)
        me = asyncio.current_task()
        try:
            while self._dirty and not self._fenced:
                while not self._urgent:  # not a state change: at most one write per interval
                    wait = self._written_at + self._interval - self._clock()
                    if wait <= 0:
                        break
                    self._dirty = False
                    kick = self._kick = asyncio.get_running_loop().create_future()
                    try:
                        async with asyncio.timeout(wait):
                            await kick  # a change cuts the wait short
                    except TimeoutError:
                        break
                    finally:
                        self._kick = None
                self._dirty = False
                await self._write_once()
        finally:
            if self._task is me:  # nothing left to write: the next change starts another
                self._task = None

    async def _write_once(self) -> bool:
        snapshot = self.status
        if snapshot == self._written:
            self._urgent = False
            return True
        self._urgent = False
        snapshot = dataclasses.replace(snapshot, updated_ms=self._wall_ms())
        try:
            await offload_status.write(self._store, self._ml, snapshot,
                                       list(self._fence.guard_ops()), self._fence.verify,
                                       multi=self._multi, known=self._known)
        except Fenced:
            log.info("topic %s: another owner keeps its status now", self._ml)
            self._fenced = True
            return False
        except OffloaddError as exc:
            log.warning("topic %s: offload status not recorded (%s); retrying in %.0fs",
                        self._ml, exc, self._interval)
            self._retry_later()
            return False
        self._wrote(snapshot)
        return True

    def _wrote(self, snapshot: OffloadStatus) -> None:
        written = self._written = dataclasses.replace(snapshot, updated_ms=0)
        now = dataclasses.replace(self.status, updated_ms=0)
        self.status = written if now == written else now  # one object kept, not two equal
        self._written_at = self._clock()
        self.writes += 1

    @property
    def pending(self) -> bool:
        """Whether something is not written yet (and may still be: not fenced)."""
        return not self._fenced and self.status != self._written

    def _retry_later(self) -> None:
        self._written_at = self._clock()  # the next try one interval from now
        self._urgent = False
        self._mark_dirty()

    async def close(self) -> None:
        """Write what is pending (at most ``close_timeout_s``), then stop."""
        task, self._task = self._task, None
        self._started = False
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if not self.pending:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._close_timeout):
                await self._write_once()


CLOSE_CHUNK = 256  # records per request in close_many (the commit batcher's batch)


async def close_many(recorders: Sequence[StatusRecorder], store: MetadataStore, *,
                     stopped: Sequence[StatusRecorder] = ()) -> None:
    """:meth:`StatusRecorder.close` for many at once (a stop of thousands of topics): their
    tasks are stopped together, then ``stopped`` are told :meth:`~StatusRecorder.stopped`
    (after, so that their own tasks do not each start that urgent write first), and the
    pending records whose node the recorder knows go as
    ``multi_batch`` requests of ``CLOSE_CHUNK`` records — each still its own fenced
    compare-and-set (guard ops + a set at the known version), but with no task, timeout or
    compare-and-set loop per topic. A record refused there (a stale node, a newer owner) or
    not sent (the store takes no batches, the node is unknown, the request failed) goes
    through :meth:`~StatusRecorder.close` as before."""
    tasks = []
    for r in recorders:
        task, r._task = r._task, None
        r._started = False  # (so that the changes below start no writing task of its own)
        if task is not None:
            task.cancel()
            tasks.append(task)
    for r in stopped:
        r.stopped()
    await asyncio.gather(*tasks, return_exceptions=True)
    batched = store if isinstance(store, BatchedMulti) else None
    rest: list[StatusRecorder] = []
    known: list[tuple[StatusRecorder, Versioned]] = []
    for r in recorders:
        if not r.pending:
            continue
        node = r._known.node if r._known.valid else None
        r._known.forget()  # (unknown again unless this write lands)
        if batched is None or node is None:
            rest.append(r)
        else:
            known.append((r, node))
    assert batched is not None or not known
    for i in range(0, len(known), CLOSE_CHUNK):
        chunk = known[i:i + CLOSE_CHUNK]
        snaps = [dataclasses.replace(r.status, updated_ms=r._wall_ms()) for r, _ in chunk]
        datas = [snap.encode() for snap in snaps]
        groups: list[list[Op]] = [
            [*r._fence.guard_ops(), SetOp(offload_status_path(r._ml), data, node.version)]
            for (r, node), data in zip(chunk, datas, strict=True)]
        try:
            assert batched is not None
            results = await batched.multi_batch(groups)
        except OffloaddError as exc:
            log.debug("status records: a batch of %d not written (%s); one by one", len(chunk),
                      exc)
            rest.extend(r for r, _ in chunk)
            continue
        for (r, node), snap, data, res in zip(chunk, snaps, datas, results, strict=True):
            if isinstance(res, BaseException):
                rest.append(r)
            else:
                r._known.set(Versioned(data, node.version + 1))
                r._wrote(snap)
    await asyncio.gather(*(r.close() for r in rest))
