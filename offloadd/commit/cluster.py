"""Cluster ownership: several daemons share the topics of one metadata store, each topic offloaded
by exactly one of them at a time. Implements the scheduler's
:class:`~offloadd.commit.ownership.Ownership` hook.

Nodes (the owner and topic-state nodes are :mod:`offloadd.commit.epochs`'s)::

    /offloadd/members/<owner id>   ephemeral   {"owner", "host", "pid", "nonce", "since_ms"} JSON
    /offloadd/owners/<ml name>     ephemeral   owner id: who offloads the topic now
    /offloadd/topics/<ml name>     persistent  {"epoch", "owner"}: the topic's fencing epoch

Who *should* own a topic: rendezvous (highest-random-weight) hashing of the topic name over the
live members. Every daemon computes the same answer from the same member list without talking to
the others, and a member joining or leaving moves only the topics it gains or loses. Who *does*
own it: whoever holds the ephemeral owner node. The two differ only during transitions, and then
a topic waits (nobody acquires a topic another session holds) instead of being offloaded twice:

- join: the newcomer registers its member node; at their next pass the others see it, stop the
  topics it should own gracefully (the open segment is closed and committed: ``Revoke.HANDOFF``),
  release them, and the newcomer acquires them at the next epoch;
- leave (SIGTERM): the leaver's tasks end, its topics are released, its member node goes with its
  session; the survivors' shares grow;
- death (kill -9, partition, a stall past the session timeout): the session expires, and its
  member and owner nodes vanish together; the survivors acquire its topics at higher epochs and
  each new owner's recovery redoes the dead owner's ASSIGNED segment over the same positions.

Fencing. An acquisition hands the topic task an :class:`EpochFence`: its guard op is
``CheckOp(topic state, epoch - 1)``, so a commit of a stale owner fails as a whole however late it
arrives (see epochs.py). Nothing here relies on timing for safety; sessions only decide how
fast a dead owner's topics move.

Sessions (ZooKeeper). While the connection is suspended nothing is acquired and running topics
carry on (their commits are fenced should the session turn out lost). When the session is lost,
every topic held in it is reported ``Revoke.LOST`` at once (the daemon cancels those tasks: they
commit nothing and delete only their own attempt's objects); with the new session the daemon
registers again and acquires its share at new epochs. Stores without sessions (embedded, memory)
end a session only when the process ends or closes the store.

Owner ids must be unique among live daemons (default ``hostname-pid``). A member node already held
by another session under our id (a previous run whose session has not expired yet, or a second
daemon configured with the same ``[daemon] owner_id``) keeps this daemon out until it is gone.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from offloadd.commit import epochs
from offloadd.commit.fence import EpochFence, Fence
from offloadd.commit.ownership import Ownership, Revoke, hostname
from offloadd.errors import ConfigError, Conflict, FormatError, NotFound, OffloaddError, Retriable
from offloadd.metadata.base import MetadataStore, Sessions
from offloadd.model import TopicName
from offloadd.model.keys import OFFLOADD_ROOT

log = logging.getLogger(__name__)

MEMBERS = f"{OFFLOADD_ROOT}/members"
CHECKS_PER_PASS = 32  # running topics whose ownership one pass checks, in turn (_due)

__all__ = [
    "MEMBERS",
    "ClusterOwnership",
    "EpochFence",
    "Member",
    "check_owner_id",
    "member_path",
    "read_members",
    "rendezvous_owner",
]


def member_path(owner_id: str) -> str:
    return f"{MEMBERS}/{owner_id}"


def check_owner_id(owner_id: str) -> str:
    """An owner id is one znode name; ``ConfigError`` otherwise."""
    if (not owner_id or "/" in owner_id or owner_id in (".", "..")
            or any(ord(c) < 0x20 for c in owner_id)):
        raise ConfigError(f"[daemon] owner_id {owner_id!r} must be a non-empty name without '/' "
                          "or control characters")
    return owner_id


def _weight(member: str, topic: str) -> int:
    # A stable hash (Python's hash() is salted per process): every daemon must agree.
    digest = hashlib.blake2b(f"{member}\0{topic}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rendezvous_owner(topic: TopicName, members: Iterable[str]) -> str | None:
    """The member that should own ``topic``: the highest weight, ties broken by name."""
    best: tuple[int, str] | None = None
    for m in members:
        key = (_weight(m, str(topic)), m)
        if best is None or key > best:
            best = key
    return best[1] if best is not None else None


@dataclass(frozen=True)
class Member:
    owner: str
    host: str | None = None
    pid: int | None = None
    since_ms: int | None = None


async def read_members(store: MetadataStore) -> list[Member]:
    """The live members, by owner id (unreadable details are left out, not fatal)."""
    try:
        names = await store.children(MEMBERS)
    except NotFound:
        return []
    out = []
    for name in names:
        try:
            doc = json.loads((await store.get(member_path(name))).data)
        except NotFound:
            continue  # left meanwhile
        except ValueError:
            doc = {}
        if not isinstance(doc, dict):
            doc = {}
        host, pid, since = doc.get("host"), doc.get("pid"), doc.get("since_ms")
        out.append(Member(name, host if isinstance(host, str) else None,
                          pid if isinstance(pid, int) else None,
                          since if isinstance(since, int) else None))
    return out


@dataclass(frozen=True)
class _Held:
    epoch: int
    generation: int  # the session generation it was acquired in


class ClusterOwnership(Ownership):
    """Membership, partitioning and fenced acquisition for one daemon (see the module doc)."""

    owner_id: str

    def __init__(self, store: MetadataStore, owner_id: str, *, sessions: Sessions | None = None,
                 wall_ms: Callable[[], int] = lambda: int(time.time() * 1000)) -> None:
        """``sessions``: the store's sessions when it has them (ZooKeeper; usually the store
        itself): without, the store's session ends only with the process."""
        self.store = store
        self.owner_id = check_owner_id(owner_id)
        self.members: tuple[str, ...] = ()  # live members, ourselves included once registered
        self._checked_members: tuple[str, ...] | None = None  # members at the last full check
        self._cursor = 0  # where the next pass's epoch checks start (_due)
        self._wall_ms = wall_ms
        self._nonce = uuid.uuid4().hex
        self._sessions = sessions
        # +1 whenever the session we acted in ends: holdings of an older generation are void.
        self._generation = 0
        self._live_sid: int | None = None
        self._session_seen = self._sessions is None
        self._registered: int | None = None  # the generation our member node belongs to
        self._held: dict[TopicName, _Held] = {}
        # +1 on every change to _held or _generation; ``revoked`` looks for running topics
        # not held only when it moved (an idle pass over 10,000 topics: nothing to look at)
        self._held_changes = 0
        self._all_held_at = -1  # _held_changes when every running topic was last held
        self._unreleased: set[TopicName] = set()  # owner nodes whose release failed
        self._locks: dict[TopicName, asyncio.Lock] = {}
        self._revoke: Callable[[Mapping[TopicName, Revoke]], None] = lambda verdicts: None
        self._warned_holder: str | None = None
        self._remove_listener = (self._sessions.add_session_listener(self._on_session)
                                 if self._sessions is not None else None)

    # ---- the Ownership hook ------------------------------------------------------------------
    def bind(self, revoke: Callable[[Mapping[TopicName, Revoke]], None]) -> None:
        self._revoke = revoke

    async def acquire(self, topic: TopicName) -> Fence | None:
        if not self._connected() or self._registered != self._generation:
            return None
        if self.owner_for(topic) != self.owner_id:
            return None
        ml = topic.managed_ledger
        generation = self._generation
        async with self._lock(topic):
            try:
                if topic in self._held or topic in self._unreleased:
                    # a holding without a task (or a failed release): start from a clean slate
                    self._held.pop(topic, None)
                    self._held_changes += 1
                    if not await self._release_node(topic):
                        return None
                epoch = await epochs.try_acquire(self.store, ml, self.owner_id)
                if epoch is None and await epochs.current_owner(self.store, ml) == \
                        self.owner_id:
                    # Our own node from an acquisition whose answer was lost (a Retriable
                    # create that did land): nobody worked under it; drop it and take a new
                    # epoch.
                    await epochs.release(self.store, ml, self.owner_id)
                    epoch = await epochs.try_acquire(self.store, ml, self.owner_id)
            except Retriable as exc:
                log.info("topic %s: not acquired now: %s", topic, exc)
                return None
            except OffloaddError as exc:
                log.error("topic %s: cannot acquire: %s", topic, exc)
                return None
            if epoch is None:
                return None
            self._held[topic] = _Held(epoch, generation)
            self._held_changes += 1
        log.info("topic %s: acquired at epoch %d", topic, epoch)
        return EpochFence(self.store, ml, epoch)

    async def release(self, topic: TopicName) -> None:
        """Give the topic up (its task has ended); never raises."""
        async with self._lock(topic):
            held = self._held.pop(topic, None)
            self._held_changes += 1
            if held is None or held.generation != self._generation:
                return  # an owner node of an ended session went with it
            if await self._release_node(topic):
                log.info("topic %s: released (epoch %d)", topic, held.epoch)

    async def release_many(self, topics: Collection[TopicName]) -> None:
        """Give up many topics whose tasks have ended (a stop: all of them) in few requests
        (:func:`offloadd.commit.epochs.release_many`); never raises. A topic whose lock is
        taken (an acquisition or a release under way) goes through :meth:`release`."""
        batch: list[TopicName] = []
        single: list[TopicName] = []
        for topic in topics:
            lock = self._locks.get(topic)
            (single if lock is not None and lock.locked() else batch).append(topic)
        mine: list[TopicName] = []
        for topic in batch:
            held = self._held.pop(topic, None)
            if held is not None and held.generation == self._generation:
                mine.append(topic)
        if mine:
            try:
                failed = await epochs.release_many(
                    self.store, [t.managed_ledger for t in mine], self.owner_id)
            except OffloaddError as exc:  # not expected: release_many reports per topic
                failed = {t.managed_ledger: exc for t in mine}
            errors = 0
            for topic in mine:
                error = failed.get(topic.managed_ledger)
                if error is None:
                    self._unreleased.discard(topic)
                else:
                    errors += 1
                    self._unreleased.add(topic)
                    log.debug("topic %s: release failed: %s", topic, error)
            if errors:
                log.warning("%d of %d topic(s) not released (%s); their owner nodes go with "
                            "the session, or are retried at the next pass", errors, len(mine),
                            next(e for e in failed.values() if e is not None))
            log.info("released %d topic(s)", len(mine) - errors)
        for topic in single:
            await self.release(topic)

    async def revoked(self, running: Collection[TopicName]) -> dict[TopicName, Revoke]:
        """Refresh membership, then say which running topics to give up and how."""
        connected = self._connected()
        out: dict[TopicName, Revoke] = {}
        # a topic starts only once acquired (held in this generation): one not held can
        # only follow a change to the holdings or a new generation
        if self._all_held_at != self._held_changes:
            for topic in running:
                held = self._held.get(topic)
                if held is None or held.generation != self._generation:
                    out[topic] = Revoke.LOST
            if not out:
                self._all_held_at = self._held_changes
        if not connected:
            return out
        try:
            await self._refresh()
        except OffloaddError as exc:
            log.warning("cluster membership not refreshed: %s", exc)
            return out
        for topic in self._due([t for t in running if t not in out] if out else list(running)):
            if (verdict := await self._check(topic)) is not None:
                out[topic] = verdict
        return out

    def _due(self, topics: list[TopicName]) -> list[TopicName]:
        """The topics to check this pass: all of them while there are few, or when the
        members changed (a newcomer's share must be handed over now); otherwise the next
        ``CHECKS_PER_PASS`` in turn, so an idle daemon with 10,000 topics does not read 10,000
        epochs a second. Commits are fenced whatever this finds; it only notices early."""
        if len(topics) <= CHECKS_PER_PASS:
            return topics
        if self.members != self._checked_members:
            self._checked_members = self.members
            handoff = [t for t in topics if self.owner_for(t) != self.owner_id]
            if handoff:
                return handoff
        start = self._cursor % len(topics)
        due = (topics[start:] + topics[:start])[:CHECKS_PER_PASS]
        self._cursor = start + CHECKS_PER_PASS
        return due

    # ---- introspection -----------------------------------------------------------------------
    def owner_for(self, topic: TopicName) -> str | None:
        """The member that should own ``topic`` by the last membership seen."""
        return rendezvous_owner(topic, self.members)

    def held(self) -> dict[TopicName, int]:
        """Topics held in the current session, with their epochs."""
        return {t: h.epoch for t, h in self._held.items() if h.generation == self._generation}

    async def close(self) -> None:
        """Leave the cluster now (the member node would otherwise go with the session)."""
        if self._remove_listener is not None:
            self._remove_listener()
            self._remove_listener = None
        if self._registered == self._generation:
            self._registered = None
            try:
                node = await self.store.get(member_path(self.owner_id))
                if self._nonce_of(node.data) == self._nonce:
                    await self.store.delete(member_path(self.owner_id), node.version)
            except OffloaddError as exc:
                log.debug("member node not removed (it goes with the session): %s", exc)

    # ---- sessions ----------------------------------------------------------------------------
    def _connected(self) -> bool:
        """Follow the store's session; True while one is connected."""
        s = self._sessions
        if s is None:
            return True
        state = s.session_state.value
        if state == "lost":
            self._end_session()
            return False
        if state != "connected":
            return False
        sid = s.session_id
        if not self._session_seen:
            self._session_seen, self._live_sid = True, sid
        elif sid != self._live_sid:
            self._end_session()  # a new session without us having seen the loss
            self._session_seen, self._live_sid = True, sid
        return True

    def _end_session(self) -> None:
        if not self._session_seen:
            return
        lost = sorted(str(t) for t in self.held())
        self._generation += 1
        self._held_changes += 1
        self._session_seen, self._live_sid = False, None
        self._registered = None
        self._unreleased.clear()  # those owner nodes went with the session
        if lost:
            log.warning("metadata session lost: %d topic(s) are no longer ours and stop without "
                        "committing (%s)", len(lost), ", ".join(lost))
        else:
            log.warning("metadata session lost: rejoining the cluster with a new session")

    def _on_session(self, state: Any) -> None:
        value = state.value
        if value == "suspended":
            log.warning("metadata connection suspended: acquiring nothing until it is back")
            return
        lost: list[TopicName] = []
        if value == "lost":
            lost = list(self.held())
            self._end_session()
        else:
            self._connected()
        # Synchronously, from the session event itself: kazoo delivers the loss before it fails
        # the requests the session leaves pending, so the tasks are cancelled before they see
        # those failures (and would begin retrying from a stale view).
        self._revoke(dict.fromkeys(lost, Revoke.LOST))

    # ---- membership --------------------------------------------------------------------------
    async def _refresh(self) -> None:
        try:
            names = await self.store.children(MEMBERS)
        except NotFound:
            names = []
        if self._registered != self._generation or self.owner_id not in names:
            self._registered = None
            if await self._register():
                names = sorted({*names, self.owner_id})
        if self._registered != self._generation:
            names = [n for n in names if n != self.owner_id]  # that node is not ours
        members = tuple(names)
        if members != self.members:
            log.info("cluster members: %s", ", ".join(members) or "(none)")
            self.members = members
        for topic in list(self._unreleased):
            if topic not in self._held:
                await self._release_node(topic)

    async def _register(self) -> bool:
        path = member_path(self.owner_id)
        doc = {"owner": self.owner_id, "host": hostname(), "pid": os.getpid(),
               "nonce": self._nonce, "since_ms": self._wall_ms()}
        generation = self._generation
        try:
            await self.store.create(path, json.dumps(doc, sort_keys=True).encode(),
                                    ephemeral=True)
        except Conflict:
            try:
                node = await self.store.get(path)
            except NotFound:
                return False  # it just went: try again at the next pass
            if self._nonce_of(node.data) != self._nonce:
                holder = node.data.decode(errors="replace")
                if holder != self._warned_holder:
                    self._warned_holder = holder
                    log.error("member id %r is held by another live session (%s): a previous "
                              "run whose session has not expired yet, or another daemon with the "
                              "same [daemon] owner_id; offloading nothing until it is gone",
                              self.owner_id, holder)
                return False
            # ours: a create whose answer was lost
        if generation != self._generation:
            return False  # the session ended meanwhile: that node went with it
        self._registered = generation
        self._warned_holder = None
        log.info("joined the cluster as %s", self.owner_id)
        return True

    @staticmethod
    def _nonce_of(data: bytes) -> str | None:
        try:
            doc = json.loads(data)
        except ValueError:
            return None
        nonce = doc.get("nonce") if isinstance(doc, dict) else None
        return nonce if isinstance(nonce, str) else None

    # ---- per topic ---------------------------------------------------------------------------
    async def _check(self, topic: TopicName) -> Revoke | None:
        held = self._held.get(topic)
        if held is None or held.generation != self._generation:
            return Revoke.LOST  # the session ended while this pass was reading
        if self.owner_for(topic) != self.owner_id:
            return Revoke.HANDOFF
        try:
            state = await epochs.read_state(self.store, topic.managed_ledger)
        except Retriable:
            return None  # the commit's fence decides; look again at the next pass
        except FormatError as exc:
            log.error("topic %s: cannot read its ownership state: %s", topic, exc)
            return None
        if state is None or state.epoch != held.epoch:
            log.warning("topic %s: epoch moved from %d to %s (owner %s): another daemon holds it",
                        topic, held.epoch, state.epoch if state else None,
                        state.owner if state else None)
            return Revoke.LOST
        return None

    async def _release_node(self, topic: TopicName) -> bool:
        try:
            await epochs.release(self.store, topic.managed_ledger, self.owner_id)
        except OffloaddError as exc:
            self._unreleased.add(topic)
            log.warning("topic %s: release failed (%s); retrying at the next pass", topic, exc)
            return False
        self._unreleased.discard(topic)
        return True

    def _lock(self, topic: TopicName) -> asyncio.Lock:
        lock = self._locks.get(topic)
        if lock is None:
            lock = self._locks[topic] = asyncio.Lock()
        return lock
