"""The :class:`~offloadd.ledger.base.LedgerSource` over a Pulsar + BookKeeper cluster (sidecar).

What it reads, and from where::

    Pulsar's ZooKeeper (read-only)                         bookies (v2 bulk, v3 tail)
      /managed-ledgers/<t>/<ns>/persistent/<x>  topics,      entries, digest-checked,
          ledger lists (data watch per topic)                many reads in flight,
      <ledgers_root>/LAYOUT, /<hierarchical path>            replica choice + failover,
          ensembles, state, last entry (watch while open)    LAC reads and long polls

    offloadd's metadata store (its own chroot)
      /managed-ledgers/<t>/<ns>/persistent/<x>  the mirror: Pulsar's ledger list + our segments

Topics are the managed ledgers whose names match ``[source] topics`` (fnmatch; empty = all).
Ledgers are Pulsar's list in order; a ledger whose BookKeeper node is gone is left out. A closed
ledger is readable up to its metadata's ``lastEntryId`` with ``length`` payload bytes. An open one
(``OPEN`` or ``IN_RECOVERY``) is readable up to the last-add-confirmed this source has learnt —
first by asking the bookies of its current ensemble for their last entry, then from every entry
header and ``maxLAC`` it reads, and from long-polling reads while the offloader waits — and only
once it knows that entry's cumulative length (read from its header), so ``LedgerDesc.size`` is
exact. Nothing past the LAC is handed out.

Reads are pipelined per ledger: up to ``reads_in_flight`` entries are in flight in chunks, and
after a read returns the stream keeps up to ``readahead_bytes`` of the following readable entries
coming, so the next read of the offloader finds them ready. Entries are framed for the pipeline
with one ``bytes.join``.

The mirror (see :mod:`offloadd.ledger.bookkeeper.layout`) is brought up to date whenever the
topics are listed or a topic's ledgers are asked for and Pulsar's list has changed since (the
topic's data watch tells). Each mirror edit is derived from one read of Pulsar's znode (data,
version, mzxid; the newest so far, mostly the watch's; re-derived if the watch delivers a newer
one while the ledgers' metadata is looked up), and written by compare-and-set on offloadd's
store (:mod:`.mirror`) only if the mirror does not already follow a newer read
(:func:`~offloadd.ledger.bookkeeper.layout.mirror_edit`): a slow caller holding an old list can
never make the mirror forget ledgers Pulsar still has. No bookie is asked anything on the way.
It never touches an ``offloadContext``. Entries Pulsar deleted before offloadd held them are
logged as data lost to retention, counted in the metrics and recorded in the mirror node.

``read_only=True`` (``offloadd status``, ``verify``, ``gc``: every command but the daemon) makes a
source that never writes offloadd's store at all: it lists and reads what Pulsar and the bookies
have, and leaves the mirror to the daemon.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import crc32c

from offloadd.aio import first_of
from offloadd.errors import ConfigError, Fatal, FormatError, NotFound, OffloaddError, Retriable
from offloadd.ledger.base import ReadArray
from offloadd.ledger.bookkeeper import tail
from offloadd.ledger.bookkeeper.client import BookieClient
from offloadd.ledger.bookkeeper.layout import (
    LedgerMetadata,
    PulsarLedger,
    PulsarList,
    check_layout,
    decode_ledger_metadata,
    ledger_path,
)
from offloadd.ledger.bookkeeper.ledgers import KnownLedger
from offloadd.ledger.bookkeeper.metrics import BookKeeperMetrics
from offloadd.ledger.bookkeeper.mirror import apply_list, existing_mirrors
from offloadd.ledger.bookkeeper.names import ManagedLedgerNames
from offloadd.ledger.bookkeeper.options import BookKeeperOptions, options_from_settings
from offloadd.ledger.bookkeeper.shared import single_flight
from offloadd.ledger.bookkeeper.stream import ReadStream, frame_run
from offloadd.ledger.bookkeeper.topics import Listers, unread_entries
from offloadd.ledger.bookkeeper.topics import WatchedTopic as _Topic
from offloadd.ledger.bookkeeper.zk import PulsarZooKeeper
from offloadd.metadata import managed_ledger
from offloadd.metadata.base import MetadataStore, Versioned
from offloadd.model import EntryRun, LedgerDesc, LedgerState, TopicName
from offloadd.model.keys import managed_ledger_path
from offloadd.model.system_topics import is_system_topic

log = logging.getLogger(__name__)

__all__ = ["BookKeeperLedgerSource", "BookKeeperOptions"]

_CRC_BATCH = 1024
_MIRROR_ATTEMPTS = 5  # fresh reads of Pulsar's list per mirror update while it keeps moving
_METADATA_READS = 32  # ledger metadata reads in flight when a topic is first seen
_TOPICS_AT_ONCE = 64  # topics first seen (watched and mirrored) concurrently by list_topics
# How long a topic task waits for news before it looks anyway: watches (lists, ledger closes)
# and long polls (open ledgers) wake it, so this is only a safety net (ChangeFeed.idle_poll_s).
IDLE_LOOK_S = 300.0


# ---- the source ---------------------------------------------------------------------------------


class BookKeeperLedgerSource:
    """Offload source over an existing Pulsar cluster. Connects on first use."""

    def __init__(self, options: BookKeeperOptions, metadata: MetadataStore, *,
                 metrics: BookKeeperMetrics | None = None,
                 wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
                 clock: Callable[[], float] = time.monotonic,
                 read_only: bool = False) -> None:
        self.options = options
        self.read_only = read_only
        self.password = options.password
        self.metrics = metrics or BookKeeperMetrics()
        self._md = metadata
        self._wall_ms = wall_ms
        self._clock = clock
        self.client = BookieClient(options.client, self.metrics, probe=not read_only)
        self._zk: PulsarZooKeeper | None = None
        self._open_lock = asyncio.Lock()
        self._topics: dict[TopicName, _Topic] = {}
        self._topic_futs: dict[TopicName, asyncio.Future[_Topic]] = {}
        self._ledgers: dict[int, KnownLedger] = {}
        # who lists which ledger, kept as each list changes: a ledger nobody lists is
        # forgotten then; one loaded while nobody lists it, at the next look (_prune)
        self._listers = Listers()
        self._names: ManagedLedgerNames | None = None
        # the wanted topics of the names last listed (the same tuple while nothing changed)
        self._wanted_of: tuple[tuple[str, ...], list[TopicName]] | None = None
        self._ledger_futs: dict[int, asyncio.Future[KnownLedger | None]] = {}
        # (last entry, bytes) of ledgers seen closed in BookKeeper whose close the mirror has
        # not recorded yet: the end of a loss should Pulsar delete one first
        self._ends: dict[int, tuple[int, int]] = {}
        self._closed = False
        self.idle_poll_s = IDLE_LOOK_S
        # whether the mirror node of a topic not mirrored yet exists (existing_mirrors)
        self._mirror_hint: dict[TopicName, bool] = {}

    @classmethod
    def from_settings(cls, settings: Any, metadata: MetadataStore, *,
                      read_only: bool = False) -> BookKeeperLedgerSource:
        """Build from :class:`offloadd.config.Settings` (``[source] kind = "bookkeeper"``);
        ``read_only`` for every command but the daemon (the source never writes then)."""
        return cls(options_from_settings(settings), metadata, read_only=read_only)

    # ---- opening -------------------------------------------------------------------------
    @property
    def zk(self) -> PulsarZooKeeper:
        if self._zk is None:
            raise Fatal("the BookKeeper source is not connected")
        return self._zk

    async def pulsar_zk(self) -> PulsarZooKeeper:
        """The read-only session to Pulsar's metadata store, connected on first use (also
        read for Pulsar's namespace policies: :mod:`offloadd.ledger.bookkeeper.policies`)."""
        return await self._open()

    async def _open(self) -> PulsarZooKeeper:
        if self._zk is not None:
            return self._zk
        if self._closed:
            raise Fatal("the BookKeeper source is closed")
        async with self._open_lock:
            if self._zk is None:
                o = self.options
                zk = await PulsarZooKeeper.open(o.pulsar_zk,
                                                session_timeout_s=o.session_timeout_s,
                                                connect_timeout_s=o.connect_timeout_s,
                                                auth=o.zk_auth)
                try:
                    await self._check_layout(zk)
                except BaseException:
                    await zk.close()
                    raise
                self._zk = zk
                log.info("reading Pulsar's metadata from %s (ledgers under %s), read-only", zk,
                         o.ledgers_root)
        return self._zk

    async def _check_layout(self, zk: PulsarZooKeeper) -> None:
        root = self.options.ledgers_root.rstrip("/")
        try:
            node = await zk.get(f"{root}/LAYOUT")
        except NotFound:
            raise Fatal(f"no BookKeeper layout at {root}/LAYOUT in {self.options.pulsar_zk}: "
                        "check [source] pulsar_zk (its chroot) and ledgers_root") from None
        try:
            check_layout(node.data, f"{root}/LAYOUT")
        except FormatError as exc:
            raise Fatal(str(exc)) from None

    def saw_closed(self, meta: LedgerMetadata) -> None:
        """A ledger's metadata read closed: its end, for the mirror (see ``_ends``)."""
        if not self.read_only:
            self._ends[meta.ledger_id] = (meta.last_entry_id, meta.length)

    def generation(self, topic: TopicName) -> tuple[int, int] | None:
        """:class:`~offloadd.ledger.base.ChangeFeed`: while it stays the same, :meth:`ledgers`
        describes the same ledgers (see :meth:`WatchedTopic.stamp_with`); None for a topic
        not watched (yet)."""
        t = self._topics.get(topic)
        return (0, t.stamp_with(self._ledgers)) if t is not None else None

    def follow(self) -> Callable[[], set[TopicName] | None]:
        """:class:`~offloadd.ledger.base.ChangeFeed`: a drain returning the watched topics
        whose stamp moved since its previous call (every one at the first call). No I/O: one
        comparison of in-memory stamps per watched topic."""
        seen: dict[TopicName, tuple[int, int] | None] = {}

        def drain() -> set[TopicName] | None:
            changed: set[TopicName] = set()
            for topic in list(self._topics):
                now = self.generation(topic)
                if seen.get(topic, ()) != now:
                    seen[topic] = now
                    changed.add(topic)
            for gone in seen.keys() - self._topics.keys():
                del seen[gone]
            return changed

        return drain

    def wanted(self, topic: TopicName) -> bool:
        if is_system_topic(topic):  # never offloaded, so never mirrored
            return False
        pats = self.options.topics
        return not pats or any(fnmatch.fnmatchcase(str(topic), p) for p in pats)

    # ---- topics --------------------------------------------------------------------------
    async def list_topics(self) -> list[TopicName]:
        """Pulsar's persistent topics matching the patterns; each one's mirror is created or
        brought up to date before it is returned, so the offloader finds it (read-only: the
        mirror is left as it is). The names come from children watches, each topic's list
        from its data watch: a pass over topics already seen reads nothing from ZooKeeper."""
        zk = await self._open()
        if self._names is None:
            self._names = ManagedLedgerNames(zk.watch_children)
        names = await self._names.names()
        if self._wanted_of is None or self._wanted_of[0] is not names:
            # parsing and matching thousands of names each pass would cost more than the rest
            self._wanted_of = (names, sorted(t for t in map(self._wanted_topic, names)
                                             if t is not None))
        wanted = self._wanted_of[1]
        new: list[TopicName] = []
        for topic in wanted:
            t = self._topics.get(topic)
            if t is None or t.info is None or not (self.read_only or t.mirror_current):
                new.append(topic)  # first seen, gone, or its list moved: look at it
        if not new:
            return list(wanted)
        if not self.read_only:
            first = [topic for topic in new if topic not in self._topics]
            self._mirror_hint.update(await existing_mirrors(self._md, first))
        limit = asyncio.Semaphore(_TOPICS_AT_ONCE)

        async def look(topic: TopicName) -> TopicName | None:
            async with limit:
                try:
                    t = await self._topic(topic)
                    await self._sync(t)
                except NotFound:
                    return None  # deleted since it was listed
                except (FormatError, Fatal) as exc:
                    log.error("topic %s: skipped: %s", topic, exc)
                    return None
                return topic

        looked = await asyncio.gather(*map(look, new))
        skipped = {topic for topic, got in zip(new, looked, strict=True) if got is None}
        return [topic for topic in wanted if topic not in skipped]

    def _wanted_topic(self, name: str) -> TopicName | None:
        try:
            topic = TopicName.from_managed_ledger(name)
        except ConfigError:
            log.warning("ignoring Pulsar managed ledger %s: not a topic name", name)
            return None
        return topic if self.wanted(topic) else None

    async def _topic(self, topic: TopicName) -> _Topic:
        t = self._topics.get(topic)
        if t is not None:
            if t.info is None:
                raise NotFound(f"topic {topic} does not exist in Pulsar (no "
                               f"{managed_ledger_path(topic.managed_ledger)})")
            return t
        t = await single_flight(self._topic_futs, topic, lambda: self._watch_topic(topic))
        if t.info is None:
            raise NotFound(f"topic {topic} does not exist in Pulsar (no "
                           f"{managed_ledger_path(topic.managed_ledger)})")
        return t

    async def _watch_topic(self, topic: TopicName) -> _Topic:
        zk = await self._open()
        t = _Topic(topic)
        path = managed_ledger_path(topic.managed_ledger)

        def on_change(node: Versioned | None) -> None:
            if node is None:
                self._set_list(t, None)
                t.version, t.node = -1, None
                # deleted in Pulsar: its lag series goes with it (else it stays at its last
                # value for the process's life, one stale series per deleted topic)
                t.read_pos = None
                self.metrics.forget_topic(str(topic))
            elif node.mzxid < t.mzxid:
                return  # an older read than the one we hold (lists only move forward)
            else:
                try:
                    self._set_list(t, managed_ledger.decode(node.data, f"Pulsar's {path}"))
                    t.version, t.mzxid, t.node = node.version, node.mzxid, node
                except FormatError as exc:
                    log.error("topic %s: %s; keeping the last good ledger list", topic, exc)
            t.wake()

        t.watch = await zk.watch_data(path, on_change)
        self._topics[topic] = t
        return t

    def _set_list(self, t: _Topic, info: managed_ledger.ManagedLedgerInfo | None) -> None:
        """The topic's ledger list is now ``info``: the index of who lists what follows, and a
        ledger nobody lists any more is forgotten (its watch cancelled)."""
        before = t.ids
        t.set_info(info)
        for lid in self._listers.relist(t.topic, before, t.ids):
            led = self._ledgers.pop(lid, None)
            if led is not None:
                led.close()

    # ---- ledgers -------------------------------------------------------------------------
    async def _ledger(self, ledger_id: int) -> KnownLedger | None:
        """The ledger's state, loading its metadata (and watching it while open); None if
        BookKeeper has no such ledger."""
        led = self._ledgers.get(ledger_id)
        if led is not None and not led.deleted:
            return led
        if led is not None:
            return None
        return await single_flight(self._ledger_futs, ledger_id,
                                   lambda: self._load_ledger(ledger_id))

    async def _load_ledger(self, ledger_id: int) -> KnownLedger | None:
        zk = await self._open()
        path = ledger_path(ledger_id, self.options.ledgers_root)
        try:
            node = await zk.get(path)
        except NotFound:
            return None
        meta = decode_ledger_metadata(node.data, ledger_id, path)
        led = KnownLedger(meta, node.version, password=self.password,
                          root=self.options.ledgers_root,
                          read_node=lambda p: self.zk.get(p), on_closed=self.saw_closed)
        self._ledgers[ledger_id] = led
        self._listers.loaded(ledger_id)  # read after Pulsar dropped it? see _prune
        if not meta.closed:
            def on_change(n: Versioned | None) -> None:
                if n is None:
                    led.deleted = True
                    led.wake()
                    self._wake_topics(ledger_id)
                    return
                if n.version <= led.version and led.watch is not None:
                    return
                try:
                    m = decode_ledger_metadata(n.data, ledger_id, path)
                except FormatError as exc:
                    log.error("ledger %d: %s", ledger_id, exc)
                    return
                was_closed = led.meta.closed
                led.update(m, n.version)
                if m.closed and not was_closed:
                    self._wake_topics(ledger_id)
                    if led.watch is not None:
                        led.watch.cancel()  # closed ledgers never change again
                        led.watch = None

            try:
                led.watch = await zk.watch_data(path, on_change)
            except BaseException:
                # Not kept without its watch (a session lost between the read and the arming):
                # nothing would tell it the ledger closed, and its last entry, which only the
                # close confirms, would never be read. The next look loads it again.
                if self._ledgers.get(ledger_id) is led:
                    del self._ledgers[ledger_id]
                raise
        return led

    def _wake_topics(self, ledger_id: int) -> None:
        for name in self._listers.of(ledger_id):
            t = self._topics.get(name)
            if t is not None:
                t.wake()

    def _desc(self, led: KnownLedger, ts: int) -> LedgerDesc:
        ctime = led.meta.ctime_ms or ts
        last, size = led.known
        state = LedgerState.CLOSED if led.meta.closed else LedgerState.OPEN
        return LedgerDesc(led.ledger_id, state, last, size, ctime)

    async def ledgers(self, topic: TopicName) -> list[LedgerDesc]:
        await self._open()
        t = await self._topic(topic)
        settled = t.settled
        if settled is not None and settled[0] is t.info and all(
                (led := self._ledgers.get(lid)) is not None and not led.deleted
                for lid in settled[2]):
            descs, closed = list(settled[1]), settled[2]
        else:
            descs = await self._descs(t)
            closed = frozenset(d.ledger_id for d in descs if d.state is LedgerState.CLOSED)
        if not self.read_only:
            # from a fresh read, so at least as new as ``descs``: every ledger handed out is
            # in the mirror (unless Pulsar deleted it meanwhile) before a segment names it.
            # BookKeeper closes a ledger before Pulsar records it: a close is news too.
            await self._sync(t, force=not closed <= t.mirrored_closed)
        if t.read_pos is not None:
            self.metrics.set_lac_lag(str(t.topic), unread_entries(t.read_pos, descs))
        return descs

    async def _descs(self, t: _Topic) -> list[LedgerDesc]:
        info = t.info
        if info is None:
            raise NotFound(f"topic {t.topic} does not exist in Pulsar")
        await self._load_all([li.ledgerId for li in info.ledgerInfo])
        out: list[LedgerDesc] = []
        for li in info.ledgerInfo:
            led = await self._ledger(li.ledgerId)
            if led is None:
                continue  # Pulsar is deleting it (its BookKeeper node is gone already)
            if not led.meta.closed:
                try:
                    await tail.learn_lac(self.client, led)
                except Retriable as exc:
                    # the ledgers before it can still be offloaded meanwhile
                    log.warning("topic %s: %s; its open ledger stays unread for now",
                                t.topic, exc)
                await tail.advance(self.client, led)
            out.append(self._desc(led, li.timestamp if li.HasField("timestamp") else 0))
        self._prune()
        if t.info is info and len(out) == len(info.ledgerInfo) \
                and all(d.state is LedgerState.CLOSED for d in out):
            t.settled = (info, tuple(out), frozenset(d.ledger_id for d in out))
        return out

    async def _load_all(self, ledger_ids: Sequence[int]) -> None:
        missing = [lid for lid in ledger_ids if lid not in self._ledgers]
        if len(missing) > 1:  # first sight of a long topic: fetch the metadata concurrently
            limit = asyncio.Semaphore(_METADATA_READS)

            async def load(lid: int) -> None:
                async with limit:
                    await self._ledger(lid)

            await asyncio.gather(*map(load, missing))

    async def _sync(self, t: _Topic, *, force: bool = False) -> None:
        """Bring the mirror up to date if Pulsar's list moved since the mirror was last brought
        up to date (or ``force``). The topic's data watch tells every move, after a session
        loss too (it is re-read then): no periodic re-read is needed."""
        if self.read_only or (not force and t.mirror_current):
            return
        async with t.mirror_lock:
            if not force and t.mirror_current:
                return
            await self._mirror(t)

    async def _read_list(self, t: _Topic) -> tuple[Versioned, managed_ledger.ManagedLedgerInfo]:
        """A fresh read of Pulsar's znode. If it is newer than what the watch delivered so far
        it becomes the topic's list at once (before any await), so that nothing prunes the
        ledgers it adds while they are looked up."""
        path = managed_ledger_path(t.topic.managed_ledger)
        node = await self.zk.get(path)
        info = managed_ledger.decode(node.data, f"Pulsar's {path}")
        if node.mzxid > t.mzxid:
            self._set_list(t, info)
            t.version, t.mzxid, t.node = node.version, node.mzxid, node
            t.wake()
        return node, info

    async def _pulsar_list(self, t: _Topic) -> tuple[PulsarList,
                                                      managed_ledger.ManagedLedgerInfo] | None:
        """Pulsar's ledger list from the newest read of its znode (mostly the watch's), stamped
        with that read; derived again if the watch delivers a newer one while the ledgers'
        metadata is looked up. None if it kept moving. No fresh read confirms it: the mirror
        refuses edits from reads older than the one it follows, and an old list lacks only
        ledgers Pulsar deleted (docs/sidecar.md, "The mirror's rule")."""
        if t.node is not None and t.info is not None:
            node, info = t.node, t.info
        else:
            node, info = await self._read_list(t)
        for _ in range(_MIRROR_ATTEMPTS):
            await self._load_all([li.ledgerId for li in info.ledgerInfo])
            ledgers: list[PulsarLedger] = []
            for li in info.ledgerInfo:
                led = await self._ledger(li.ledgerId)  # loaded above: no await in the common case
                if led is None:
                    continue  # its BookKeeper node is gone: Pulsar is deleting it
                ts = li.timestamp if li.HasField("timestamp") else 0
                ctime = led.meta.ctime_ms or ts
                if led.meta.closed:
                    ledgers.append(PulsarLedger(led.ledger_id, True, led.meta.last_entry_id + 1,
                                                led.meta.length, ctime))
                else:
                    ledgers.append(PulsarLedger(led.ledger_id, False, 0, 0, ctime))
            newer = t.node
            if newer is None or t.info is None:
                raise NotFound(f"topic {t.topic}: Pulsar deleted it")
            if newer.mzxid <= node.mzxid:
                return PulsarList(tuple(ledgers), node.version, node.mzxid), info
            node, info = newer, t.info
        return None

    async def _mirror(self, t: _Topic) -> None:
        """One mirror update (under ``t.mirror_lock``): see :meth:`_pulsar_list` and
        :func:`~offloadd.ledger.bookkeeper.layout.mirror_edit`."""
        if self.read_only:  # never reached; a last line of defence for the rule
            raise Fatal("a read-only BookKeeper source never writes offloadd's catalog")
        try:
            derived = await self._pulsar_list(t)
        except NotFound:
            return  # the topic is gone from Pulsar: its mirror stays as the last list left it
        if derived is None:
            log.info("topic %s: Pulsar's ledger list kept changing while it was read; the "
                     "mirror follows on the next pass", t.topic)
            return
        listed, info = derived
        # a topic's first write in this process: is the node there? (a hint: list_topics
        # lists the namespaces of many new topics; unknown counts as absent, as for a topic
        # Pulsar just created)
        absent = t.mirrored_mzxid is None and not self._mirror_hint.pop(t.topic, False)
        await apply_list(self._md, t.topic, listed, info, now_ms=self._wall_ms(),
                         ends=self._ends, metrics=self.metrics, absent=absent)
        t.mirrored_mzxid = max(listed.mzxid, t.mirrored_mzxid or -1)
        t.mirrored_closed = frozenset(p.ledger_id for p in listed.ledgers if p.closed)

    def _prune(self) -> None:
        """Forget the ledgers loaded while no watched topic listed them, unless one does now
        (those a list stops naming are forgotten as it changes: :meth:`_set_list`)."""
        for lid in self._listers.take_unlisted():
            led = self._ledgers.pop(lid, None)
            if led is not None:
                led.close()

    # ---- reading -------------------------------------------------------------------------
    async def read(self, topic: TopicName, ledger_id: int, first_entry_id: int,
                   last_entry_id: int, max_bytes: int | None = None, *,
                   into: ReadArray | None = None) -> EntryRun:
        """Frames land in ``into`` when it holds them (the offloader recycles these buffers),
        else in a new buffer."""
        if not 0 <= first_entry_id <= last_entry_id:
            raise ValueError(f"bad entry range {first_entry_id}..{last_entry_id}")
        await self._open()
        led = await self._ledger(ledger_id)
        if led is None:
            raise NotFound(f"{topic}: ledger {ledger_id} does not exist in BookKeeper")
        if last_entry_id > led.readable_last:
            raise NotFound(f"{topic}: entries {first_entry_id}..{last_entry_id} of ledger "
                           f"{ledger_id} are not all readable (readable up to "
                           f"{led.readable_last})")
        if led.stream is None:
            led.stream = ReadStream(self.client, led, self.options.reads_in_flight,
                                    self.options.readahead_bytes)
        payloads = await led.stream.take(first_entry_id, last_entry_id, max_bytes)
        t = self._topics.get(topic)
        if t is not None:
            t.read_pos = (ledger_id, first_entry_id + len(payloads) - 1)
        return frame_run(ledger_id, first_entry_id, payloads, into)

    async def read_crcs(self, ledger_id: int, first_entry_id: int,
                        last_entry_id: int) -> list[int]:
        """CRC32C of each payload of ``first..last`` read from the bookies (for ``verify``)."""
        await self._open()
        led = self._ledgers.get(ledger_id)
        if led is None or led.deleted:
            led = await self._load_ledger(ledger_id)
        if led is None:
            raise NotFound(f"ledger {ledger_id} does not exist in BookKeeper")
        if last_entry_id > led.readable_last:
            raise NotFound(f"entries {first_entry_id}..{last_entry_id} of ledger {ledger_id} "
                           f"are not all readable")
        out: list[int] = []
        for lo in range(first_entry_id, last_entry_id + 1, _CRC_BATCH):
            got = await self.client.read_entries(led, lo, min(lo + _CRC_BATCH - 1,
                                                              last_entry_id))
            out.extend(map(crc32c.crc32c, got.payloads))
        return out

    async def wait_for_entries(self, topic: TopicName, ledger_id: int,
                               last_known_entry_id: int, timeout: float) -> None:
        """Return once ``ledger_id`` is readable past ``last_known_entry_id``, the topic has a
        newer ledger or the ledger closed, or ``timeout`` passed. An open ledger is
        long-polled at a bookie of the next entry's write set."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout, 0.0)
        try:
            t = await self._topic(topic)
            led = await self._ledger(ledger_id)
        except OffloaddError:
            await asyncio.sleep(min(timeout, 0.5))
            return
        if led is None or led.readable_last > last_known_entry_id:
            return
        ids = t.ledger_ids()
        if led.meta.closed and ledger_id in ids and ids.index(ledger_id) + 1 < len(ids):
            return  # the next ledger is there already
        waits: list[Awaitable[object]] = [t.changed.wait(), led.changed.wait()]
        if not led.meta.closed:
            waits.append(tail.follow(self.client, led, deadline, self.options.long_poll_max_s))
        await first_of(*waits, timeout=max(deadline - loop.time(), 0.0))

    def status(self) -> dict[str, Any]:
        """How this source reads each bookie it has read from so far (``offloadd status``)."""
        return {"kind": "bookkeeper", "bookies": self.client.status()}

    async def close(self) -> None:
        self._closed = True
        if self._names is not None:
            self._names.close()
        for t in self._topics.values():
            if t.watch is not None:
                t.watch.cancel()
        for led in self._ledgers.values():
            led.close(streams=True)
        self._ledgers.clear()
        self._listers.clear()
        self._topics.clear()
        await self.client.close()
        if self._zk is not None:
            zk, self._zk = self._zk, None
            await zk.close()
