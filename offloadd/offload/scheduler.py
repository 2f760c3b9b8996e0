"""The scheduler: which topics run, one topic task each, started, revoked, reaped, stopped.

One discovery pass (:meth:`Scheduler.step`), run by the daemon every discovery interval::

    revoke ─▶ the ownership hook names running topics to give up: HANDOFF (close and commit the
              │ open segment, then stop) or LOST (cancel at once, commit nothing)
    discover ─▶ every topic of the source that is wanted and not running: acquire it (a fence),
              │ continue its persisted offload status, start its task
    reap ─▶ tasks that ended: forget their metrics, write "stopped", release the topic

The scheduler owns the tasks and nothing else: the stores, the buffer and the throttle come in
:class:`~offloadd.offload.topic.OffloadEnv`; policies, the topic filter and the probes are
callables of the daemon (which reads the configuration).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from offloadd import logs
from offloadd.commit.fence import Fence
from offloadd.commit.ownership import Ownership, Revoke
from offloadd.errors import OffloaddError
from offloadd.metadata import offload_status
from offloadd.model import TopicName
from offloadd.offload.recorder import StatusRecorder
from offloadd.offload.topic import OffloadEnv, TopicOffloader, TopicPolicy, TopicProbe

__all__ = ["Running", "Scheduler", "SchedulerSettings", "default_owner_id"]

log = logging.getLogger(__name__)

ABANDON_GRACE_S = 10.0
# more segments than this still open at a stop's closing time are left, not abandoned
LEAVE_OVER = 64


@dataclass(frozen=True)
class SchedulerSettings:
    """``[daemon]`` keys the scheduler reads when it needs them (a reload applies)."""

    shutdown_deadline_s: float = 30.0
    status_interval_s: float = 30.0


@dataclass
class Running:
    task: asyncio.Task[None]
    offloader: TopicOffloader
    recorder: StatusRecorder | None = None
    lost: bool = False  # ownership ended under it: the status record is the successor's


def default_owner_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


STARTS_AT_ONCE = 64  # topics acquired and started concurrently by a discovery pass


class Scheduler:
    def __init__(self, env: OffloadEnv, *, ownership: Ownership,
                 wanted: Callable[[TopicName], bool],
                 policy: Callable[[TopicName], Callable[[], TopicPolicy]],
                 probe: Callable[[TopicName], TopicProbe | None],
                 settings: Callable[[], SchedulerSettings],
                 on_gone: Callable[[TopicName], None] = lambda topic: None) -> None:
        self.env = env
        self.ownership = ownership
        self._wanted = wanted
        self._policy = policy
        self._probe = probe
        self._settings = settings
        self._on_gone = on_gone
        self.topics: dict[TopicName, Running] = {}
        self.wake = asyncio.Event()  # set when a revocation between passes wants a pass soon
        self._bg: set[asyncio.Future[None]] = set()  # status writes and releases under way
        self.stopping = False  # set by the daemon's stop: a pass under way starts no more topics
        ownership.bind(self._revoke_now)

    # ---- one pass ------------------------------------------------------------------------
    async def step(self) -> None:
        """Revoke, discover (a failure is logged: the next pass tries again), reap."""
        try:
            self._apply_revocations(await self.ownership.revoked(list(self.topics)))
            await self._discover()
        except OffloaddError as exc:
            log.error("topic discovery failed: %s", exc)
        self._reap()

    def trigger(self, topics: list[TopicName] | None = None) -> None:
        """Close the open segments of ``topics`` (all when None) now."""
        for name, r in self.topics.items():
            if topics is None or name in topics:
                r.offloader.trigger()

    def _revoke_now(self, verdicts: Mapping[TopicName, Revoke]) -> None:
        self._apply_revocations(verdicts)
        self.wake.set()

    def _apply_revocations(self, verdicts: Mapping[TopicName, Revoke]) -> None:
        """Stop the tasks of topics this process must give up (see :class:`Revoke`)."""
        for topic, how in verdicts.items():
            r = self.topics.get(topic)
            if r is None or r.task.done():
                continue
            if how is Revoke.LOST:
                r.lost = True
                if not r.task.cancelling():
                    log.warning("topic %s: ownership lost; stopping now, committing nothing",
                                topic)
                    r.task.cancel()
            elif r.offloader.running:
                log.info("topic %s: handing over to another daemon after closing the open "
                         "segment", topic)
                r.offloader.request_stop()

    async def _discover(self) -> None:
        """Start the new topics, ``STARTS_AT_ONCE`` at a time: each start waits for the
        metadata store (acquire, the last status record), and one after another thousands of
        topics took minutes to start, and held a stop request up as long. The first failure
        is raised once the others are started."""
        new = [topic for topic in await self.env.source.list_topics()
               if topic not in self.topics and self._wanted(topic)]
        limit = asyncio.Semaphore(STARTS_AT_ONCE)

        async def start(topic: TopicName) -> None:
            async with limit:
                if not self.stopping:
                    await self._start(topic)

        failed = [r for r in await asyncio.gather(*map(start, new), return_exceptions=True)
                  if isinstance(r, BaseException)]
        if failed:
            raise failed[0]

    async def _start(self, topic: TopicName) -> None:
        fence = await self.ownership.acquire(topic)
        if fence is None:
            return
        recorder = await self._recorder(topic, fence)
        off = TopicOffloader(topic, self.env, self._policy(topic), fence, self._probe(topic),
                             status=recorder)
        # every line the task logs carries its topic as a field (offloadd.logs)
        task = asyncio.create_task(off.run(), name=f"offload {topic}",
                                   context=logs.context_with(topic=str(topic)))
        self.topics[topic] = Running(task, off, recorder)
        log.info("offloading topic %s", topic)

    async def _recorder(self, topic: TopicName, fence: Fence) -> StatusRecorder:
        """The topic's persisted offload status, continued from what its last owner wrote."""
        ml = topic.managed_ledger
        try:
            previous = await offload_status.read(self.env.metadata, ml)
        except OffloaddError as exc:  # unreadable: start afresh rather than not at all
            log.warning("topic %s: previous offload status unreadable (%s)", topic, exc)
            previous = None
        owner = self.ownership.owner_id or default_owner_id()
        commits = self.env.commits
        recorder = StatusRecorder(self.env.metadata, ml, fence, owner,
                                  interval_s=self._settings().status_interval_s,
                                  initial=previous,
                                  multi=commits.multi if commits is not None else None)
        recorder.start()
        return recorder

    def _let_go(self, r: Running) -> None:
        """The topic's task ended: record that this owner stopped, in the background."""
        if r.recorder is None:
            return
        if not r.lost:
            r.recorder.stopped()
        self._background(r.recorder.close())

    def _background(self, work: Awaitable[None]) -> None:
        self._bg.add(t := asyncio.ensure_future(work))
        t.add_done_callback(self._bg.discard)

    def _reap(self) -> None:
        for topic, r in list(self.topics.items()):
            if r.task.done():
                del self.topics[topic]
                exc = r.task.exception() if not r.task.cancelled() else None
                if exc is not None:
                    log.error("topic %s task ended: %r", topic, exc)
                self._on_gone(topic)
                self._let_go(r)
                self._background(self.ownership.release(topic))

    # ---- stopping ------------------------------------------------------------------------
    async def shutdown(self) -> None:
        """Stop every task within the shutdown deadline, the whole stop included: open
        segments are closed and committed until ``deadline - reserve``; what is still in
        flight then is abandoned safely (a later run redoes it) in the reserve, where the
        status records are written and ownership given back too (``reserve`` = a third of the
        deadline, at most ``ABANDON_GRACE_S``). 10,000 open segments cannot all close within
        30 s; they must not make the stop outlast the supervisor's patience."""
        deadline = self._settings().shutdown_deadline_s
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline
        reserve = min(ABANDON_GRACE_S, deadline / 3)

        def left(floor: float = 0.5) -> float:  # of the reserve, but never nothing at all
            return max(end - loop.time(), floor)

        for r in self.topics.values():
            r.offloader.request_stop()
        tasks = [r.task for r in self.topics.values()]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=deadline - reserve)
            # Cleaning each one up (abort its upload, read the catalog, delete the objects)
            # is three or four store requests a topic: 10,000 of them outlast any deadline.
            # Above LEAVE_OVER they are left as a crash leaves them: nothing of theirs is
            # recorded (or, ASSIGNED, recovery redoes it), and offloadd gc sweeps the uploads.
            leave = len(pending) > LEAVE_OVER
            for r in self.topics.values():
                if r.task in pending:
                    r.offloader.leave_open = leave
                    r.task.cancel()
            if pending:
                log.warning("shutdown deadline (%.0fs) close to passing: %s %d in-flight "
                            "segment(s); they are redone on the next start", deadline,
                            "leaving (offloadd gc sweeps their uploads)" if leave
                            else "abandoning", len(pending))
                # abandoning aborts uploads; a hung store must not hold the exit hostage
                # (a third of what is left stays for the status records and releases)
                _, stuck = await asyncio.wait(pending, timeout=left() * 2 / 3)
                if stuck:
                    log.warning("%d topic task(s) still abandoning; exiting anyway (offloadd "
                                "gc sweeps what they leave)", len(stuck))
        for r in self.topics.values():
            self._let_go(r)
        if self._bg:  # status records are written before ownership is given up
            await asyncio.wait(list(self._bg), timeout=left() / 2)
        releasing = asyncio.ensure_future(self.ownership.release_many(list(self.topics)))
        _, late = await asyncio.wait({releasing}, timeout=left())
        if late:  # the owner nodes are ephemeral: they go when the store's session closes
            releasing.cancel()
            log.warning("ownership not all given back before the shutdown deadline; the "
                        "rest goes when the metadata session closes")
        self.topics.clear()
