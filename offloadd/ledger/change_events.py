"""Pulsar's topic policies, followed in each namespace's ``__change_events`` system topic.

The broker writes a topic's policies as messages of that topic
(:mod:`offloadd.metadata.topic_policies`); this module reads them through any
:class:`~offloadd.ledger.base.LedgerSource` — the BookKeeper source in sidecar mode (a read-only
one of its own: it never mirrors the system topic into offloadd's catalog), the embedded store
otherwise — and keeps the latest event of each key, as compaction does.

:meth:`ChangeEvents.prepare` starts one follower per namespace (as the namespace's first topic
starts) and waits, a bounded while, until it has read the topic to its end, so the topic's first
roll decision already sees its policy. The follower then waits for new entries
(:meth:`~offloadd.ledger.base.LedgerSource.wait_for_entries`: a long poll on BookKeeper, the
change journal on the embedded store) and applies them; ``on_change(ns)`` tells the daemon. On
BookKeeper it also looks every ``PEEK_S`` for the entry past the last-add-confirmed, which
readers see only after the broker's next add (``peek``:
:mod:`offloadd.ledger.bookkeeper.change_tail`). A
namespace without the topic (no topic policy ever set there) is looked at again every
``absent_poll_s``. :meth:`ChangeEvents.get` is what the daemon asks on every roll decision (no
I/O).

Each message's value is decoded with the writer's Avro schema, the version its
``schema_version`` names in the schema registry (``/schemas/<tenant>/<ns>/__change_events``:
:class:`RegistrySchemas`). A message that does not decode is logged at WARNING naming its
position and skipped (the key's previous event stays in force); a read that fails (bookies,
ZooKeeper) is retried from the same position. Nothing here stops the daemon.

Not read: a compacted ledger. Pulsar compacts ``__change_events``; once its ``__compaction``
cursor lets the broker trim the ledgers before it, events only in the compacted ledger are not
seen (docs/sidecar.md, "Topic policies").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from offloadd.errors import FormatError, NotFound, OffloaddError
from offloadd.format.message import decode_entry
from offloadd.format.schema_storage import (
    SchemaEntry,
    SchemaInfo,
    SchemaLocator,
    version_from_bytes,
)
from offloadd.ledger.base import LedgerSource
from offloadd.metadata.base import Versioned
from offloadd.metadata.schemas import locator_path
from offloadd.metadata.topic_policies import (
    PULSAR_EVENT_SCHEMA,
    TopicLevel,
    TopicPolicyEvent,
    TopicPolicyTable,
    change_events_topic,
    decode_event,
)
from offloadd.model import FRAME_OVERHEAD, EntryRun, TopicName

log = logging.getLogger(__name__)

__all__ = ["ChangeEvents", "NamespaceEvents", "Peek", "RegistrySchemas", "read_table"]

READ_BYTES = 1 << 20  # entries per read of the system topic (its messages are small)
PREPARE_WAIT_S = 10.0  # how long a topic's start waits for its namespace's first read
RETRY_S = 5.0  # a failed read of the system topic is tried again this often
ABSENT_POLL_S = 10.0  # a namespace without __change_events: looked at again this often
WAIT_S = 30.0  # one wait for new entries (a long poll, woken by news before)
PEEK_S = 10.0  # with a peek: how often the entry past the LAC is looked for

# (the topic whose schema it is, ledger id, entry id) -> the entry's bytes
EntryReader = Callable[[TopicName, int, int], Awaitable[bytes]]
# (topic, ledger id, entry id) -> that entry of the open ledger if durable, not yet readable
Peek = Callable[[TopicName, int, int], Awaitable[bytes | None]]


class RegistrySchemas:
    """The Avro schemas of the ``__change_events`` topics, from Pulsar's schema registry:
    ``get`` reads a node of the (local) metadata store, ``read_entry(topic, ledger, entry)``
    a ``SchemaEntry``. Versions never change: each is read once."""

    def __init__(self, get: Callable[[str], Awaitable[Versioned]],
                 read_entry: EntryReader) -> None:
        self._get = get
        self._read_entry = read_entry
        self._cache: dict[tuple[TopicName, int], Any] = {}

    async def avro(self, topic: TopicName, version: bytes | None) -> Any:
        """The parsed Avro schema of ``topic``'s version ``version`` (the message's
        ``schema_version`` bytes; None: the built-in one). ``NotFound``, ``FormatError``."""
        if version is None:
            return PULSAR_EVENT_SCHEMA
        n = version_from_bytes(version)
        got = self._cache.get((topic, n))
        if got is not None:
            return got
        path = locator_path(topic)
        locator = SchemaLocator.decode((await self._get(path)).data)
        e = locator.find(n)
        if e is None:
            raise NotFound(f"schema version {n} of {topic} is not in {path}")
        info = SchemaInfo.decode(SchemaEntry.decode(
            await self._read_entry(topic, e.ledger_id, e.entry_id)).schema_data)
        try:
            got = json.loads(info.schema)
        except ValueError as exc:
            raise FormatError(path, 0, f"version {n}: not an Avro schema: {exc}") from None
        self._cache[(topic, n)] = got
        return got


def entry_payloads(run: EntryRun) -> list[tuple[int, memoryview]]:
    """(entry id, payload) of each entry of ``run``."""
    o = run.offsets
    return [(run.first_entry_id + i, run.data[o[i] + FRAME_OVERHEAD:o[i + 1]])
            for i in range(run.count)]


@dataclass
class NamespaceEvents:
    """One namespace's ``__change_events``, read up to ``position`` (ledger, next entry)."""

    ns: str
    source: LedgerSource
    schemas: RegistrySchemas
    table: TopicPolicyTable = field(default_factory=TopicPolicyTable)
    position: tuple[int, int] | None = None
    listed: frozenset[int] = frozenset()  # the ledgers the last read found
    exists: bool = False
    error: str | None = None  # the last read's problem, None once a read succeeds

    @property
    def topic(self) -> TopicName:
        return change_events_topic(self.ns)

    async def catch_up(self) -> set[str]:
        """Read every entry past :attr:`position` up to the topic's end as of now; returns
        the topics whose level changed. ``NotFound``: no such topic (yet)."""
        changed: set[str] = set()
        topic = self.topic
        progressed = True
        while progressed:
            progressed = False
            descs = await self.source.ledgers(topic)
            self.exists = True
            self.listed = frozenset(d.ledger_id for d in descs)
            for d in descs:
                at = self.position
                if at is not None and d.ledger_id < at[0]:
                    continue  # read already (ledger ids only grow within a managed ledger)
                start = at[1] if at is not None and d.ledger_id == at[0] else 0
                if d.last_entry_id < start:
                    if at is None or d.ledger_id > at[0]:
                        self.position = (d.ledger_id, start)
                    continue
                run = await self.source.read(topic, d.ledger_id, start, d.last_entry_id,
                                             READ_BYTES)
                changed |= self.table.apply(await self._events(run))
                self.position = (d.ledger_id, run.last_entry_id + 1)
                progressed = True
                break  # ask for the ledgers again: the rest of this one, or the next
        return changed

    async def _events(self, run: EntryRun) -> list[TopicPolicyEvent]:
        out: list[TopicPolicyEvent] = []
        for entry_id, payload in entry_payloads(run):
            out += await self.decode(run.ledger_id, entry_id, payload)
        return out

    async def decode(self, ledger_id: int, entry_id: int,
                     payload: bytes | memoryview) -> list[TopicPolicyEvent]:
        """The topic policy events of one entry; [] (logged, naming it) if it does not
        decode."""
        where = f"{self.topic} {ledger_id}:{entry_id}"
        out: list[TopicPolicyEvent] = []
        try:
            entry = decode_entry(payload, where)
            if entry.marker_type is not None or entry.encrypted or entry.chunk is not None:
                return []  # no topic policy (the broker writes them plain and whole)
            schema = await self.schemas.avro(self.topic, entry.schema_version)
            for m in entry.messages:
                ev = decode_event(m.key, m.payload, schema, where)
                if ev is not None:
                    out.append(ev)
        except (FormatError, NotFound) as exc:
            log.warning("Pulsar topic policy message %s skipped: %s", where, exc)
            return []
        return out

    async def peek(self, peek: Peek | None) -> set[str] | None:
        """Apply the entry just past :attr:`position` if ``peek`` finds it durable though not
        readable yet (:mod:`offloadd.ledger.bookkeeper.change_tail`); the topics changed, None
        when there is none."""
        at = self.position
        if peek is None or at is None or at[0] not in self.listed:
            return None
        payload = await peek(self.topic, at[0], at[1])
        if payload is None:
            return None
        changed = self.table.apply(await self.decode(at[0], at[1], payload))
        self.position = (at[0], at[1] + 1)
        return changed

    @property
    def wait_position(self) -> tuple[int, int]:
        at = self.position
        return (at[0], at[1] - 1) if at is not None else (-1, -1)


async def read_table(source: LedgerSource, schemas: RegistrySchemas, ns: str,
                     peek: Peek | None = None) -> NamespaceEvents:
    """One read of ``ns``'s ``__change_events`` to its end (``offloadd status``); a namespace
    without the topic has an empty table."""
    events = NamespaceEvents(ns, source, schemas)
    with contextlib.suppress(NotFound):
        await events.catch_up()
        while await events.peek(peek) is not None:
            pass
    return events


class ChangeEvents:
    """The followed namespaces' topic policies (see the module docstring)."""

    def __init__(self, source: LedgerSource, schemas: RegistrySchemas,
                 on_change: Callable[[str], None] | None = None, *,
                 close_source: bool = False, peek: Peek | None = None) -> None:
        self.source = source
        self.schemas = schemas
        self.peek = peek
        self.on_change = on_change
        self._close_source = close_source
        self._namespaces: dict[str, NamespaceEvents] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._first: dict[str, asyncio.Event] = {}
        self._levels: dict[TopicName, TopicLevel | None] = {}
        self._closed = False

    def get(self, topic: TopicName) -> TopicLevel | None:
        """``topic``'s Pulsar topic-level offload policy as last read (None: none)."""
        try:
            return self._levels[topic]
        except KeyError:
            pass
        events = self._namespaces.get(topic.ns)
        level = events.table.lookup(topic) if events is not None else None
        self._levels[topic] = level
        return level

    def namespace(self, ns: str) -> NamespaceEvents | None:
        return self._namespaces.get(ns)

    async def prepare(self, ns: str) -> None:
        """Follow ``ns``'s ``__change_events`` (once per namespace) and wait up to
        ``PREPARE_WAIT_S`` for its first read to the end. Never raises."""
        if self._closed:
            return
        if ns not in self._tasks:
            self._namespaces[ns] = NamespaceEvents(ns, self.source, self.schemas)
            self._first[ns] = asyncio.Event()
            self._tasks[ns] = asyncio.create_task(self._follow(ns),
                                                  name=f"topic policies of {ns}")
        try:
            async with asyncio.timeout(PREPARE_WAIT_S):
                await self._first[ns].wait()
        except TimeoutError:
            log.warning("namespace %s: Pulsar's topic policies (%s) not read within %.0fs; "
                        "the namespace's levels apply meanwhile", ns, change_events_topic(ns),
                        PREPARE_WAIT_S)

    async def _follow(self, ns: str) -> None:
        events = self._namespaces[ns]
        first = self._first[ns]
        while not self._closed:
            try:
                changed = await events.catch_up()
            except NotFound:
                events.exists = False
                first.set()
                await asyncio.sleep(ABSENT_POLL_S)
                continue
            except OffloaddError as exc:
                if events.error is None:
                    log.warning("namespace %s: Pulsar's topic policies (%s) not read: %s; "
                                "trying again every %.0fs", ns, events.topic, exc, RETRY_S)
                events.error = str(exc)
                first.set()
                await asyncio.sleep(RETRY_S)
                continue
            events.error = None
            if changed:
                self._changed(ns, changed, initial=not first.is_set())
            elif not first.is_set():
                self._forget(ns)
            first.set()
            peeked = await events.peek(self.peek)
            if peeked is not None:
                if peeked:
                    self._changed(ns, peeked, initial=False)
                continue  # there may be more
            ledger_id, last = events.wait_position
            if ledger_id not in events.listed:
                # no ledger yet, or Pulsar deleted the one read last: none to wait on
                await asyncio.sleep(ABSENT_POLL_S)
                continue
            try:
                # a new entry past the LAC wakes no long poll: peek again this often
                await self.source.wait_for_entries(events.topic, ledger_id, last,
                                                   PEEK_S if self.peek else WAIT_S)
            except OffloaddError:
                await asyncio.sleep(RETRY_S)

    def _forget(self, ns: str) -> None:
        for t in [t for t in self._levels if t.ns == ns]:
            del self._levels[t]

    def _changed(self, ns: str, topics: set[str], *, initial: bool) -> None:
        self._forget(ns)
        for name in sorted(topics):
            try:
                level = self.get(TopicName.parse(name))
            except OffloaddError:
                continue
            what = level.policy.describe() if level is not None else "none"
            log.info("topic %s: Pulsar's topic-level offload policy %s: %s", name,
                     "is" if initial else "changed", f"{what} ({level.scope})"
                     if level is not None else what)
        if self.on_change is not None:  # topics that started before the first read, too
            self.on_change(ns)

    async def close(self) -> None:
        self._closed = True
        tasks = list(self._tasks.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        if self._close_source:
            await self.source.close()

    async def stop(self) -> None:  # as the runtime stops its extras
        await self.close()
