"""One watcher per source for writers in other processes (:class:`ChangeWatcher`).

Every topic task of a daemon that tails the embedded store waits in
:meth:`LocalLedgerSource.wait_for_entries`. Rather than each of them looking at its topic's
files and metadata (the old 20 ms poll: two worker-thread calls per topic per tick), the
source runs one task that reads the store's change journal (:mod:`.journal`) every
``interval_s`` — one ``pread`` of 8 bytes while nothing is written — and wakes only the
waiters of the topics it names (all of them when the journal cannot say). An idle daemon thus
costs one tiny read per tick whatever its number of topics.

A wait's deadline is the watcher's too: it ends idle waits on its tick (late by at most one
``interval_s``) rather than each waiting topic holding a timer of its own — at 10,000 idle
topics that was 10,000 timer handles, timeout objects and the frames around them (issue 22).

It also counts, per topic, the changes it has seen (:meth:`generation`), and hands each
follower (:meth:`follow`) the topics that changed since it last asked: the daemon's lag loop
measures only those again, not every topic every interval (``offloadd/shell/daemon.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable
from pathlib import Path

from offloadd.ledger.local.journal import ANY, TOPICS_KEY, JournalReader, topic_key
from offloadd.model import TopicName

__all__ = ["ChangeWatcher", "Follower"]

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 0.05
REOPEN_EVERY = 20  # ticks between checks that the journal file is still the same one


class Follower:
    """The changes one consumer has not taken yet (from :meth:`ChangeWatcher.follow`)."""

    __slots__ = ("everything", "keys")

    def __init__(self) -> None:
        self.keys: set[int] = set()
        self.everything = False  # the journal could not say what changed


class ChangeWatcher:
    """Waiters keyed by topic, woken by the journal's records. Used from one event loop."""

    def __init__(self, store: Path, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self._reader = JournalReader(store)
        self._interval = interval_s
        # per journal key, the futures waiting for its next change (a list: one waiter a topic)
        self._waiters: dict[int, list[asyncio.Future[None]]] = {}
        # per tick (deadline / interval, rounded up), the futures whose wait ends then
        self._due: dict[int, list[asyncio.Future[None]]] = {}
        self._next_tick: int | None = None  # the first tick not yet expired
        self._counts: dict[int, int] = {}
        self._keys: dict[TopicName, int] = {}  # topic -> journal key (a hash: computed once)
        self._names: dict[int, list[TopicName]] = {}  # journal key -> the topics it stands for
        self._followers: list[Follower] = []
        self._epoch = 0  # +1 whenever the journal could not say what changed
        self._task: asyncio.Task[None] | None = None
        self._primed = False

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start watching (idempotent). The journal's present state is the baseline."""
        if self.running:
            return
        if not self._primed:
            self._primed = True
            self._look()
        self._task = asyncio.get_running_loop().create_task(self._run(),
                                                            name="ledger change watcher")

    def register(self, topic: TopicName, deadline: float) -> asyncio.Future[None]:
        """A future done at the topic's next recorded change, or at the first tick at or
        after ``deadline`` (event-loop time). Register *before* looking at the topic, so that
        a change between the look and the wait is not missed; and :meth:`unregister` it
        afterwards, with the same deadline."""
        self.start()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(self._key(topic), []).append(fut)
        self._due.setdefault(self._tick(deadline), []).append(fut)
        return fut

    def unregister(self, topic: TopicName, fut: asyncio.Future[None], deadline: float) -> None:
        key = self._key(topic)
        _drop(self._waiters, key, fut)
        _drop(self._due, self._tick(deadline), fut)

    def generation(self, topic: TopicName) -> tuple[int, int] | None:
        """Changes seen for the topic so far (with the epoch of changes to unknown topics);
        None while nothing watches (then nothing can be said)."""
        key = self._key(topic)  # (named from now on, to followers too)
        if not self.running:
            return None
        return self._epoch, self._counts.get(key, 0)

    def topics_generation(self) -> tuple[int, int] | None:
        """Like :meth:`generation`, for the list of topics (a writer created one)."""
        if not self.running:
            return None
        return self._epoch, self._counts.get(TOPICS_KEY, 0)

    def follow(self) -> Callable[[], set[TopicName] | None]:
        """A drain for one consumer: each call returns the topics whose changes the watcher
        has read since the previous call (among the topics it was asked about, by
        :meth:`generation` or :meth:`register`), or None when it cannot say (not watching,
        or the journal lost track): then anything may have changed."""
        follower = Follower()
        follower.everything = True  # the first call knows nothing yet
        self._followers.append(follower)

        def take() -> set[TopicName] | None:
            keys, follower.keys = follower.keys, set()
            if follower.everything or not self.running:
                follower.everything = False
                return None
            names = self._names
            return {t for k in keys for t in names.get(k, ())}

        return take

    @property
    def waiting(self) -> int:
        """Topics with a waiter (tests, status)."""
        return len(self._waiters)

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._reader.close()
        self._due.clear()  # (their waits are woken below)
        self._next_tick = None
        for follower in self._followers:
            follower.everything = True
        self._wake_all()

    # -- plumbing -----------------------------------------------------------------------------

    def _key(self, topic: TopicName) -> int:
        key = self._keys.get(topic)
        if key is None:
            key = self._keys[topic] = topic_key(topic)
            self._names.setdefault(key, []).append(topic)
        return key

    def _tick(self, deadline: float) -> int:
        tick = math.ceil(deadline / self._interval)
        first = self._next_tick
        return tick if first is None or tick >= first else first

    def _expire(self, now: float) -> None:
        """End the waits whose deadline has passed (their tick has come)."""
        last = math.floor(now / self._interval)
        due = self._due
        first = self._next_tick
        if first is None:
            first = min(due, default=last + 1)
        if first <= last and due:
            # after a long stall, only the ticks that have waits (not every one in between)
            ticks = range(first, last + 1) if last - first <= len(due) else \
                sorted(t for t in due if t <= last)
            for t in ticks:
                for fut in due.pop(t, ()):
                    if not fut.done():
                        fut.set_result(None)
        self._next_tick = last + 1

    async def _run(self) -> None:
        ticks = 0
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self._interval)
            ticks += 1
            self._expire(loop.time())
            if ticks % REOPEN_EVERY == 0 and self._reader.replaced():
                log.info("ledger change journal %s was replaced; following the new one",
                         self._reader.path)
            try:
                self._look()
            except OSError as exc:  # the tick above still ends the waits at their deadlines
                log.warning("reading the ledger change journal %s failed: %s",
                            self._reader.path, exc)
            except Exception:  # the tick must go on: it is every idle wait's deadline
                log.exception("reading the ledger change journal %s failed", self._reader.path)

    def _look(self) -> None:
        changed = self._reader.changes()
        if changed is ANY:
            self._epoch += 1
            for follower in self._followers:
                follower.everything = True
            self._wake_all()
            return
        assert isinstance(changed, set)
        if changed:
            for follower in self._followers:
                follower.keys |= changed
        for key in changed:
            self._counts[key] = self._counts.get(key, 0) + 1
            for fut in self._waiters.pop(key, ()):
                if not fut.done():
                    fut.set_result(None)

    def _wake_all(self) -> None:
        waiting, self._waiters = self._waiters, {}
        for futs in waiting.values():
            for fut in futs:
                if not fut.done():
                    fut.set_result(None)


def _drop(index: dict[int, list[asyncio.Future[None]]], key: int,
          fut: asyncio.Future[None]) -> None:
    """Remove ``fut`` from ``index[key]`` (gone already if it was woken), and an emptied key."""
    futs = index.get(key)
    if futs is None:
        return
    with contextlib.suppress(ValueError):
        futs.remove(fut)
    if not futs:
        del index[key]
