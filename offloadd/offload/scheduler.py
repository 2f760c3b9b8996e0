"""The scheduler: which topics run, one topic task each, started, revoked, reaped, stopped.

One discovery pass (:meth:`Scheduler.step`), run by the daemon every discovery interval::

    revoke ─▶ the ownership hook names running topics to give up: HANDOFF (close and commit the
              │ open segment, then stop) or LOST (cancel at once, commit nothing)
    discover ─▶ every topic of the source that is wanted and not running: acquire it (a fence),
              │ continue its persisted offload status, start its task
    reap ─▶ tasks that ended: forget their metrics, write "stopped", release the topic

The scheduler owns the tasks and nothing else: the stores, the buffer and the throttle come in
:class:`~offloadd.offload.topic.OffloadEnv`; the policies and its own settings in one
:class:`~offloadd.offload.policy.PolicySource`; the topic filter and the probes are
callables of the daemon (which reads the configuration).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from offloadd import logs
from offloadd.commit.fence import Fence
from offloadd.commit.ownership import Ownership, Revoke, process_owner_id
from offloadd.errors import OffloaddError
from offloadd.metadata import cas, offload_status
from offloadd.model import TopicName
from offloadd.offload.policy import PolicySource, SchedulerSettings
from offloadd.offload.recorder import StatusRecorder, close_many
from offloadd.offload.topic import OffloadEnv, TopicOffloader, TopicProbe

__all__ = ["Running", "Scheduler", "SchedulerSettings"]

log = logging.getLogger(__name__)

# open segments closing at once during a stop (a commit batch's worth)
STOP_CLOSES_AT_ONCE = 256
# at most this many closes under way at the close budget's end are abandoned (cleaned up);
# the other unfinished topics are left as a crash leaves them
LEAVE_OVER = 64


@dataclass(slots=True)
class Running:
    task: asyncio.Task[None]
    offloader: TopicOffloader
    recorder: StatusRecorder | None = None
    lost: bool = False  # ownership ended under it: the status record is the successor's


STARTS_AT_ONCE = 64  # topics acquired and started concurrently by a discovery pass
# topics acquired before their namespaces' status records are listed (once per namespace for
# these): bigger, fewer listings; smaller, an earlier first start
LISTED_AT_ONCE = 1024


class Scheduler:
    def __init__(self, env: OffloadEnv, *, ownership: Ownership,
                 wanted: Callable[[TopicName], bool],
                 policies: PolicySource,
                 probe: Callable[[TopicName], TopicProbe | None],
                 on_gone: Callable[[TopicName], None] = lambda topic: None,
                 prepare: Callable[[TopicName], Awaitable[None]] | None = None) -> None:
        self.env = env
        # awaited before a topic starts: what its policy needs read first (Pulsar's policy)
        self._prepare = prepare
        self.ownership = ownership
        self._wanted = wanted
        self._policies = policies
        self._probe = probe
        self._on_gone = on_gone
        self.topics: dict[TopicName, Running] = {}
        self.wake = asyncio.Event()  # set when a revocation between passes wants a pass soon
        self._bg: set[asyncio.Future[None]] = set()  # status writes and releases under way
        self.stopping = False  # set by the daemon's stop: a pass under way starts no more topics
        # +1 whenever a topic starts or is reaped: a loop over the topics (the daemon's lag
        # loop) recomputes what it derives from them only when this moved
        self.version = 0
        # the topics whose task ended, told by the task itself: a pass reaps these, rather
        # than looking at every task (10,000 an idle second)
        self._ended: set[TopicName] = set()
        # the last pass's listing, and the wanted topics it did not start (owned elsewhere,
        # or their start failed): while the listing and the running set stay the same, a pass
        # tries only those again instead of filtering every listed topic
        self._listing: tuple[TopicName, ...] | None = None
        self._listing_version = -1
        self._unstarted: list[TopicName] = []
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

    def rescan(self) -> None:
        """Filter the whole listing again at the next pass (the wanted topics changed)."""
        self._listing = None

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
        listing = tuple(await self.env.source.list_topics())
        if listing == self._listing and self.version == self._listing_version:
            new = [t for t in self._unstarted if t not in self.topics]
        else:
            new = [topic for topic in listing
                   if topic not in self.topics and self._wanted(topic)]
        failed: list[BaseException] = []
        for i in range(0, len(new), LISTED_AT_ONCE):
            if self.stopping:
                break
            failed += await self._start_some(new[i:i + LISTED_AT_ONCE])
        self._unstarted = [t for t in new if t not in self.topics]
        self._listing, self._listing_version = listing, self.version
        if failed:
            raise failed[0]

    async def _start_some(self, topics: list[TopicName]) -> list[BaseException]:
        """Acquire ``topics``, then list their namespaces' status records once, then start
        them; the failures. The listing comes after the acquisitions so that what a previous
        owner recorded before letting a topic go is in it; only the topics it shows a record
        for read theirs (a start-up read one per topic, nearly all absent)."""
        limit = asyncio.Semaphore(STARTS_AT_ONCE)

        async def acquire(topic: TopicName) -> Fence | None:
            async with limit:
                return None if self.stopping else await self.ownership.acquire(topic)

        got = await asyncio.gather(*map(acquire, topics), return_exceptions=True)
        failed = [r for r in got if isinstance(r, BaseException)]
        held = [(t, f) for t, f in zip(topics, got, strict=True)
                if f is not None and not isinstance(f, BaseException)]
        if self.stopping:  # a stop came meanwhile: give them back rather than start them
            for t, _ in held:
                self._background(self.ownership.release(t))
            return failed
        try:
            absent = await offload_status.absent(self.env.metadata,
                                                 (t.managed_ledger for t, _ in held))
        except OffloaddError as exc:  # each topic reads its own record, as before
            log.debug("status records not listed (%s): reading them one by one", exc)
            absent = set()

        async def start(topic: TopicName, fence: Fence) -> None:
            async with limit:
                await self._start(topic, fence, topic.managed_ledger in absent)

        failed += [r for r in await asyncio.gather(*(start(t, f) for t, f in held),
                                                   return_exceptions=True)
                   if isinstance(r, BaseException)]
        return failed

    async def _start(self, topic: TopicName, fence: Fence, no_record: bool) -> None:
        recorder = await self._recorder(topic, fence, no_record)
        if self._prepare is not None:
            await self._prepare(topic)
        off = TopicOffloader(topic, self.env, self._policies.policy_fn(topic), fence,
                             self._probe(topic), status=recorder)
        # every line the task logs carries its topic as a field (offloadd.logs)
        task = asyncio.create_task(off.run(), name=f"offload {topic}",
                                   context=logs.context_with(topic=str(topic)))
        task.add_done_callback(lambda _: self._ended.add(topic))
        self.topics[topic] = Running(task, off, recorder)
        self.version += 1
        log.info("offloading topic %s", topic)

    async def _recorder(self, topic: TopicName, fence: Fence,
                        no_record: bool) -> StatusRecorder:
        """The topic's persisted offload status, continued from what its last owner wrote
        (``no_record``: a listing showed none)."""
        ml = topic.managed_ledger
        known = cas.Known()  # the record as read: the recorder's first write needs no read
        previous: offload_status.OffloadStatus | None = None
        if no_record:
            known.set(None)
        else:
            try:
                previous = await offload_status.read(self.env.metadata, ml, known)
            except OffloaddError as exc:  # unreadable: start afresh rather than not at all
                log.warning("topic %s: previous offload status unreadable (%s)", topic, exc)
        owner = self.ownership.owner_id or process_owner_id()
        commits = self.env.commits
        recorder = StatusRecorder(self.env.metadata, ml, fence, owner,
                                  interval_s=self._policies.scheduler_settings().status_interval_s,
                                  initial=previous,
                                  multi=commits.multi if commits is not None else None,
                                  known=known)
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
        ended, self._ended = self._ended, set()
        for topic in ended:
            r = self.topics.get(topic)
            if r is not None and r.task.done():
                del self.topics[topic]
                self.version += 1
                exc = r.task.exception() if not r.task.cancelled() else None
                if exc is not None:
                    log.error("topic %s task ended: %r", topic, exc)
                self._on_gone(topic)
                self._let_go(r)
                self._background(self.ownership.release(topic))

    # ---- stopping ------------------------------------------------------------------------
    async def shutdown(self) -> None:
        """Stop every task within the shutdown deadline, the whole stop included.

        The rule (docs/operations.md, "Stopping"): for ``stop_close_budget_s`` (default half
        the deadline) open segments close and commit, ``STOP_CLOSES_AT_ONCE`` at a time, each
        topic waiting for its turn before it even reads its ledgers. At the budget's end, of
        the closes under way at most ``LEAVE_OVER`` are abandoned (upload aborted, objects
        deleted: a few requests each); every other unfinished topic is left exactly as a
        crash leaves it: nothing of its open segment recorded (or, ASSIGNED, redone by
        recovery), its incomplete upload offloadd gc's. The next start commits the rest;
        nothing is lost or written twice. The rest of the deadline writes the status records
        and gives ownership back. 10,000 open segments cannot all close within 30 s; they
        must not make the stop outlast the supervisor's patience."""
        settings = self._policies.scheduler_settings()
        deadline = settings.shutdown_deadline_s
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline

        def left(floor: float = 0.5) -> float:  # of the deadline, but never nothing at all
            return max(end - loop.time(), floor)

        self.env.stop_closes = asyncio.Semaphore(STOP_CLOSES_AT_ONCE)
        for r in self.topics.values():
            r.offloader.request_stop()
        tasks = [r.task for r in self.topics.values()]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=settings.stop_close_budget())
            # the stop's phases, each a line: where a slow stop spent its time
            log.info("stop: %d of %d topic task(s) ended within the close budget",
                     len(tasks) - len(pending), len(tasks))
            abandoning = 0
            for r in self.topics.values():
                if r.task in pending:
                    # a task still waiting for its turn has begun nothing of its close
                    abandon = r.offloader.in_turn and abandoning < LEAVE_OVER
                    abandoning += abandon
                    r.offloader.leave_open = not abandon
                    r.task.cancel()
            if pending:
                log.warning("stop: close budget (%.0fs of the %.0fs shutdown deadline) spent: "
                            "abandoning %d close(s) under way, leaving %d open segment(s) as "
                            "a crash leaves them; the next start commits them (offloadd gc "
                            "sweeps left uploads)", settings.stop_close_budget(), deadline,
                            abandoning, len(pending) - abandoning)
                # abandoning aborts uploads; a hung store must not hold the exit hostage
                # (a third of what is left stays for the status records and releases)
                _, stuck = await asyncio.wait(pending, timeout=left() * 2 / 3)
                if stuck:
                    log.warning("%d topic task(s) still abandoning; exiting anyway (offloadd "
                                "gc sweeps what they leave)", len(stuck))
        # every topic's last record ("stopped") in a few batched requests, not a write each
        recorders = [r.recorder for r in self.topics.values() if r.recorder is not None]
        self._background(close_many(recorders, self.env.metadata, stopped=[
            r.recorder for r in self.topics.values() if r.recorder is not None and not r.lost]))
        if self._bg:  # status records are written before ownership is given up
            _, unwritten = await asyncio.wait(list(self._bg), timeout=left() / 2)
            if unwritten:
                log.info("stop: status records of %d topic(s): %d write(s) unfinished, going "
                         "on", len(recorders), len(unwritten))
            else:
                log.info("stop: status records of %d topic(s) written", len(recorders))
        releasing = asyncio.ensure_future(self.ownership.release_many(list(self.topics)))
        _, late = await asyncio.wait({releasing}, timeout=left())
        if late:  # the owner nodes are ephemeral: they go when the store's session closes
            releasing.cancel()
            log.warning("ownership not all given back before the shutdown deadline; the "
                        "rest goes when the metadata session closes")
        else:
            log.info("stop: ownership of %d topic(s) given back", len(self.topics))
        self.topics.clear()
