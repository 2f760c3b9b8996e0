"""What one topic's task and its two modes share: collaborators, position, commits, reports.

:class:`OffloadEnv` is what every topic task of a process shares (the stores, the buffer, the
throttle, clocks); :class:`TopicContext` is one topic's: its readers and uploads, where it
stands (next position, last commit), the segment in progress and its state, and the two commit
steps every segment goes through — both fenced compare-and-sets of the catalog
(:func:`offloadd.commit.edits.apply`), each after its state transition
(:mod:`offloadd.model.segment_state`).
"""

from __future__ import annotations

import asyncio
import enum
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field

from offloadd._proto import mldataformats_pb2 as pb
from offloadd.blobstore.base import BlobStore
from offloadd.commit import edits
from offloadd.commit.batch import CommitBatcher
from offloadd.commit.fence import Fence
from offloadd.ledger.base import LedgerSource
from offloadd.metadata import cas, managed_ledger
from offloadd.metadata.base import MetadataStore
from offloadd.model import LedgerDesc, Position, TopicName, catalog
from offloadd.model.keys import managed_ledger_path
from offloadd.model.segment_state import SegmentState, Tracked
from offloadd.offload.attempt import SegmentAttempt, Uploads
from offloadd.offload.buffer import OffloadBuffer
from offloadd.offload.parts import DEFAULT_PART_SIZE
from offloadd.offload.probes import StatusSink, TopicProbe
from offloadd.offload.roller import RollPolicy
from offloadd.offload.runs import RunReader
from offloadd.offload.threshold import Thresholds
from offloadd.retry import Backoff

__all__ = ["OffloadEnv", "OffloadMode", "TopicContext", "TopicPolicy"]

DEFAULT_RETRY = Backoff(0.5, 30.0)  # [offload] retry_base_s, retry_max_s
THRESHOLD_LOOK_S = 1.0  # how often a topic with offload thresholds looks (threshold.py marks)


class OffloadMode(enum.Enum):
    """How a topic's data reaches the tier: streaming segments that roll by size or age
    (PIP-76), or each ledger whole once it closes (PIP-17)."""

    STREAMING = "streaming"
    LEDGER = "ledger"


@dataclass(frozen=True)
class TopicPolicy:
    roll: RollPolicy
    mode: OffloadMode = OffloadMode.STREAMING
    # what stays only in the source for now (threshold.py)
    thresholds: Thresholds = field(default_factory=Thresholds)


@dataclass
class OffloadEnv:
    """The collaborators every topic task shares (injected; no globals)."""

    source: LedgerSource
    metadata: MetadataStore
    blobstore: BlobStore
    buffer: OffloadBuffer
    acquire: Callable[[int, str], Awaitable[object]] | None = None  # throttle
    clock: Callable[[], float] = time.monotonic
    wall_ms: Callable[[], int] = lambda: int(time.time() * 1000)
    blocks_in_flight: int = 4
    part_size: int = DEFAULT_PART_SIZE  # [blobstore] part_size_bytes
    retry: Backoff = DEFAULT_RETRY  # a failing topic's retries (and its recovery's)
    # how long a topic waits for news before it looks anyway; a source that wakes its waiters
    # when their topic changes (the embedded store's journal) makes this a rare safety look
    idle_poll_s: float = 1.0
    # every topic's commits and status writes go through it: many topics' in one request
    # (offloadd.commit.batch); None: each on its own
    commits: CommitBatcher | None = None
    # told when a topic's committed position may have moved (a commit, a recovery): the
    # daemon's lag loop measures again only the topics something happened to
    on_progress: Callable[[TopicName], None] | None = None
    # at a stop, how many open segments close at once (set by the scheduler's shutdown):
    # thousands closing together share the CPU so evenly that none is done by the deadline;
    # a few at a time commit what the deadline allows, and the rest are left untouched
    stop_closes: asyncio.Semaphore | None = None


class Wake:
    """What cuts a topic's wait short (a trigger, a stop, a reload). Unlike ``asyncio.Event``
    it costs nothing while nobody waits (no waiter deque), and the wait it cuts short runs in
    the topic's own task (:meth:`cut_short`), not in tasks of its own: an idle topic's wait is
    one of ten thousand, and every task, future and timer it holds is memory (issue 22)."""

    __slots__ = ("_cut", "_fut", "_set", "_task")

    def __init__(self) -> None:
        self._set = False
        self._fut: asyncio.Future[None] | None = None
        self._task: asyncio.Task[object] | None = None  # the task in cut_short, if any
        self._cut = False  # set() cancelled it

    def set(self) -> None:
        self._set = True
        fut = self._fut
        if fut is not None and not fut.done():
            fut.set_result(None)
        task = self._task
        if task is not None and not self._cut:
            # asyncio.timeout's way: cancel the waiting task, and cut_short takes that one
            # cancellation back (uncancel) while passing on any other
            self._cut = True
            task.cancel()

    def clear(self) -> None:
        self._set = False
        self._fut = None

    def is_set(self) -> bool:
        return self._set

    def future(self) -> asyncio.Future[None]:
        """Done at the next :meth:`set` (at once if set); for one wait."""
        fut = self._fut = asyncio.get_running_loop().create_future()
        if self._set:
            fut.set_result(None)
        return fut

    async def cut_short(self, wait: Coroutine[object, object, None]) -> None:
        """Await ``wait`` in the calling task until it returns or :meth:`set` is called (then
        ``wait`` is cancelled). Another cancellation of the task passes through."""
        if self._set or self._task is not None:
            wait.close()
            if self._set:
                return
            raise RuntimeError("Wake.cut_short: one waiter at a time")
        task = asyncio.current_task()
        assert task is not None
        self._task, self._cut = task, False
        try:
            await wait
        except asyncio.CancelledError:
            if self._cut and task.uncancel() == 0:
                return  # ours: the wait was cut short
            raise
        finally:
            self._task = None
        if self._cut:  # the wait swallowed our cancellation: take it back all the same
            task.uncancel()


MIN_WAIT_S = 0.05


async def _sleep(timeout: float) -> None:
    await asyncio.sleep(timeout)


class TopicContext:
    # one per topic: 10,000 of them (issue 22), no instance dict
    __slots__ = ("attempt", "catalog_node", "committed_segments", "env", "failed_attempts",
                 "fence", "last_commit_ms", "last_committed", "last_error", "policy", "position",
                 "probe", "reader", "segment", "status_sink", "topic", "uploads", "wake")

    def __init__(self, topic: TopicName, env: OffloadEnv, policy: Callable[[], TopicPolicy],
                 fence: Fence, probe: TopicProbe, status: StatusSink | None) -> None:
        self.topic = topic
        self.env = env
        self.policy = policy
        self.fence = fence
        self.probe = probe
        self.status_sink = status
        self.reader = RunReader(env.source, env.buffer, topic)
        self.uploads = Uploads(env.blobstore, topic.managed_ledger, env.blocks_in_flight,
                               acquire=self._acquire_fn(), on_part_done=self._part_done,
                               part_size=env.part_size)
        self.position: Position | None = None  # next position to offload
        self.last_committed: Position | None = None
        self.last_commit_ms: int | None = None  # wall time of the last commit, if known
        self.committed_segments = 0
        self.failed_attempts = 0
        self.last_error: str | None = None
        self.attempt: SegmentAttempt | None = None  # the open streaming attempt
        self.segment: Tracked | None = None  # the state of the segment in progress
        self.wake = Wake()  # a trigger or a stop request cuts a wait short
        # the catalog node as this task last read or wrote it: a commit edits it instead of
        # reading first (the owner is mostly its only writer; a stale copy costs a lost race)
        self.catalog_node = cas.Known()

    # ---- reading -------------------------------------------------------------------------
    async def ledgers(self) -> list[LedgerDesc]:
        return await self.env.source.ledgers(self.topic)

    async def load(self) -> pb.ManagedLedgerInfo:
        path = managed_ledger_path(self.topic.managed_ledger)
        try:
            node = await self.env.metadata.get(path)
        except BaseException:
            self.catalog_node.forget()
            raise
        info = managed_ledger.decode(node.data, path)
        self.catalog_node.set(node)
        return info

    def idle_poll_s(self, policy: TopicPolicy) -> float:
        """How long to wait for news: the source wakes us on changes, but entries held back by
        a threshold become offloadable with time alone, so those are looked at every second."""
        if policy.thresholds.active:
            return min(self.env.idle_poll_s, THRESHOLD_LOOK_S)
        return self.env.idle_poll_s

    async def wait(self, pos: Position | None, timeout: float,
                   known: LedgerDesc | None = None) -> None:
        """Until the topic may have moved past ``pos`` (past ``known``'s last entry when that is
        further: entries held back by a threshold are not news), a wake-up, or ``timeout``.
        The source's wait runs in this task (the source bounds it by ``timeout``), cut short by
        the wake."""
        self.wake.clear()
        if pos is None:
            await self.wake.cut_short(_sleep(max(timeout, MIN_WAIT_S)))
            return
        last = pos.entry_id - 1
        if known is not None and known.ledger_id == pos.ledger_id:
            last = max(last, known.last_entry_id)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await self.wake.cut_short(self.env.source.wait_for_entries(
            self.topic, pos.ledger_id, last, max(timeout, MIN_WAIT_S)))
        # never a wait of nothing: it runs in this task, and a source wait that returns at once
        # (a deadline passed while the entries are held back) would loop without ever letting
        # the event loop run
        if not self.wake.is_set() and loop.time() - t0 < MIN_WAIT_S:
            await self.wake.cut_short(_sleep(MIN_WAIT_S))

    # ---- the two commit steps ------------------------------------------------------------
    async def assign(self, edit: Callable[[pb.ManagedLedgerInfo], bool],
                     segment: Tracked) -> pb.ManagedLedgerInfo:
        """Record the segment's range (ASSIGNED, ``complete = false``); the stored catalog."""
        self.segment = segment
        return await segment.move(SegmentState.ASSIGNED, lambda: self.commit(edit))

    async def offloaded(self, edit: Callable[[pb.ManagedLedgerInfo], bool], segment: Tracked,
                        uid: uuid.UUID, end: Position, entries: int, nbytes: int, t0: float,
                        done_ms: int) -> pb.ManagedLedgerInfo:
        """Record the segment OFFLOADED (``complete = true``) and report the commit; the stored
        catalog."""
        info = await segment.move(SegmentState.OFFLOADED, lambda: self.commit(edit))
        self.last_committed = end
        self.progressed()
        self.committed_segments += 1
        self.failed_attempts = 0
        self.last_error = None
        self.last_commit_ms = done_ms
        self.probe.last_offloaded(*end)
        self.probe.last_commit_time(done_ms / 1000)
        if self.status_sink is not None:
            self.status_sink.succeeded(end, str(uid), done_ms)
        self.probe.segment_committed(entries, nbytes, self.env.clock() - t0)
        return info

    async def commit(self, edit: Callable[[pb.ManagedLedgerInfo], bool]
                     ) -> pb.ManagedLedgerInfo:
        """``edit`` committed (fenced compare-and-set, batched with other topics' commits when
        the env has a batcher); the catalog as stored."""
        return await edits.apply(self.env.metadata, self.topic.managed_ledger, edit, self.fence,
                                 on_write=self.probe.metadata_write, batcher=self.env.commits,
                                 known=self.catalog_node)

    def driver(self) -> pb.OffloadDriverMetadata:
        """What the catalog records of the blob store a segment is written to."""
        store = self.env.blobstore
        return catalog.driver_metadata(store.name, dict(store.driver_properties()))

    # ---- reporting -----------------------------------------------------------------------
    def progressed(self) -> None:
        """The committed position may have moved: say so to whoever follows it."""
        if self.env.on_progress is not None:
            self.env.on_progress(self.topic)

    def publish_states(self, segs: Sequence[catalog.Segment]) -> None:
        assigned = sum(1 for s in segs if not s.complete)
        offloaded = sum(1 for s in segs if s.complete)
        failed = 1 if self.segment is not None and self.segment.state is SegmentState.FAILED \
            else 0
        self.committed_segments = offloaded
        self.probe.segment_states(assigned - failed if assigned >= failed else 0, offloaded,
                                  failed)

    def _acquire_fn(self) -> Callable[[int], Awaitable[object]] | None:
        acquire = self.env.acquire
        if acquire is None:
            return None
        topic = str(self.topic)

        async def take(n: int) -> object:
            return await acquire(n, topic)

        return take

    def _part_done(self, nbytes: int, seconds: float) -> None:
        self.probe.offload_bytes(nbytes)
        self.probe.upload_latency(seconds)
