"""A Pulsar cluster in miniature for the BookKeeper source tests: Pulsar-style metadata in a real
ZooKeeper and entries on fake bookies, written the way a broker and its BookKeeper client do.

``FakePulsar`` plays the broker: it creates topics (``/managed-ledgers/...``), opens ledgers
(``/ledgers/<hierarchical path>``, then appends the ledger to the topic's ``ManagedLedgerInfo``),
adds entries over protocol v3 to every bookie of each entry's write set (the body carries the LAC
the writer knew when it sent the entry), closes ledgers (metadata ``CLOSED`` with
``lastEntryId``/``length``, then ``entries``/``size`` in the managed ledger), changes ensembles
and deletes ledgers as Pulsar's retention does. Everything it wrote is kept in :attr:`written`
(minus what retention deleted) and :attr:`history` (everything, with each ledger's life).

Hostile, as a broker and its BookKeeper client are:

- ensembles of 3, write quorum 2, ack quorum 2, striped as BookKeeper stripes (entry ``e`` on
  ensemble positions ``(e + j) mod 3``, ``j < 2``); with ``rotate`` each new ledger starts its
  ensemble one bookie further along the pool, so every bookie holds every kind of stripe;
- an add a bookie does not acknowledge within ``add_timeout_s`` (frozen, dead) makes an
  *ensemble change* from the first unacknowledged entry: the bookie is replaced by one outside
  the ensemble and the entries from there on are sent again; the stale copies stay behind, and
  the bookie is left out of new ensembles for ``avoid_s``;
- entries past the LAC exist on bookies before they are readable: an entry carries the LAC the
  writer knew when it sent it, so the newest entry of a ledger is confirmed only by the next add
  or the close; :meth:`crash_and_recover` leaves one more entry on a single bookie of its write
  set and then closes the ledger before it, as BookKeeper's recovery does with an entry that has
  fewer than ack-quorum copies: a reader that reads past the LAC gets an entry that is not part
  of the ledger;
- :meth:`retain` deletes ledgers as Pulsar's retention does (managed-ledger list first, then the
  BookKeeper node, then the bookies' copies), concurrently with whoever reads them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from offloadd.errors import FormatError, NotFound
from offloadd.format.schema_storage import IndexEntry, SchemaEntry, SchemaInfo, SchemaLocator
from offloadd.ledger.bookkeeper import codec
from offloadd.ledger.bookkeeper.codec import DigestType, Status
from offloadd.ledger.bookkeeper.layout import (
    HIERARCHICAL_FACTORY,
    LedgerMetadata,
    LedgerStateBK,
    ledger_path,
)
from offloadd.metadata import managed_ledger
from offloadd.metadata.schemas import SCHEMAS_ROOT, topic_schema_id
from offloadd.metadata.zookeeper import ZooKeeperMetadataStore
from offloadd.model import Position, TopicName
from offloadd.model.keys import managed_ledger_path
from tests.fixtures.bookie_wire import (
    AddRequest,
    AddResponse,
    decode_any_response,
    encode_entry,
    encode_ledger_metadata,
    encode_request,
    master_key,
)
from tests.fixtures.fake_bookie import FakeBookie

SCHEMA_PASSWORD = b""  # BookkeeperSchemaStorage's ledgers have an empty password


class BookieWriter:
    """Adds over protocol v3, as a BookKeeper client writes them: one connection per bookie,
    many adds in flight, answers matched by txnId; an add unanswered within ``timeout_s`` (or
    on a connection that failed) is reported as not acknowledged."""

    def __init__(self, timeout_s: float, connect_timeout_s: float = 2.0) -> None:
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._conns: dict[str, tuple[asyncio.StreamWriter, asyncio.Task[None]]] = {}
        self._pending: dict[str, dict[int, asyncio.Future[object]]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._txn = 0

    async def _writer(self, bookie: str) -> asyncio.StreamWriter:
        async with self._locks.setdefault(bookie, asyncio.Lock()):  # one connection each
            conn = self._conns.get(bookie)
            if conn is not None and not conn[1].done():
                return conn[0]
            return await self._connect(bookie)

    async def _connect(self, bookie: str) -> asyncio.StreamWriter:
        host, _, port = bookie.rpartition(":")
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)),
                                                self.connect_timeout_s)
        pending = self._pending[bookie] = {}
        self._conns[bookie] = (writer, asyncio.ensure_future(self._read(reader, writer,
                                                                        pending)))
        return writer

    @staticmethod
    async def _read(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    pending: dict[int, asyncio.Future[object]]) -> None:
        try:
            while True:
                (n,) = codec.U32.unpack(await reader.readexactly(4))
                resp = decode_any_response(await reader.readexactly(n), "add answer")
                fut = pending.pop(resp.txn_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(resp)
        except (OSError, asyncio.IncompleteReadError, FormatError):
            pass
        finally:  # the adds in flight on a failed connection are not acknowledged
            writer.close()
            for fut in pending.values():
                if not fut.done():
                    fut.set_exception(ConnectionResetError("connection lost"))

    async def add(self, bookie: str, ledger_id: int, entry_id: int, key: bytes,
                  body: bytes) -> bool:
        self._txn += 1
        txn = self._txn
        fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        try:
            writer = await self._writer(bookie)
            self._pending[bookie][txn] = fut
            writer.write(encode_request(AddRequest(txn, ledger_id, entry_id, key, body)))
            resp = await asyncio.wait_for(fut, self.timeout_s)
        except (OSError, TimeoutError):
            return False
        finally:
            self._pending.get(bookie, {}).pop(txn, None)
        return isinstance(resp, AddResponse) and resp.status == Status.EOK

    async def close(self) -> None:
        for writer, task in self._conns.values():
            writer.close()
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        self._conns.clear()


@dataclass
class _Open:
    meta: LedgerMetadata
    version: int
    next_entry: int = 0
    length: int = 0
    lac: int = -1


@dataclass
class LedgerLife:
    """One ledger as the writer knows it: its acknowledged payloads and when it lived."""

    topic: TopicName
    ledger_id: int
    created: float
    payloads: list[bytes] = field(default_factory=list)
    closed: float | None = None
    deleted: float | None = None
    torn: bool = False  # closed by "recovery" with an unacknowledged entry on one bookie


@dataclass
class FakePulsar:
    zk: ZooKeeperMetadataStore  # at Pulsar's chroot
    bookies: list[FakeBookie]
    password: bytes = b""
    digest_type: DigestType = DigestType.CRC32C
    ensemble_size: int = 3
    write_quorum: int = 2
    ack_quorum: int = 2
    ledgers_root: str = "/ledgers"
    next_ledger_id: int = 1
    written: dict[TopicName, list[tuple[Position, bytes]]] = field(default_factory=dict)
    open: dict[TopicName, _Open] = field(default_factory=dict)
    add_timeout_s: float = 5.0
    avoid_s: float = 5.0
    rotate: bool = False
    history: dict[int, LedgerLife] = field(default_factory=dict)
    ensemble_changes: int = 0
    _avoid: dict[str, float] = field(default_factory=dict)
    _rotation: int = 0
    _locks: dict[TopicName, asyncio.Lock] = field(default_factory=dict)
    adder: BookieWriter | None = None

    def __post_init__(self) -> None:
        if self.adder is None:
            self.adder = BookieWriter(self.add_timeout_s)

    async def setup(self) -> None:
        await self.zk.create(f"{self.ledgers_root}/LAYOUT",
                             f"2\n{HIERARCHICAL_FACTORY}:1\n".encode())
        for b in self.bookies:
            await self.zk.create(f"{self.ledgers_root}/available/{b.address}", b"")

    async def close(self) -> None:
        assert self.adder is not None
        await self.adder.close()

    def lock(self, topic: TopicName) -> asyncio.Lock:
        """Held by each operation on a topic's ledgers: a broker serialises them per topic."""
        return self._locks.setdefault(topic, asyncio.Lock())

    def _usable(self, b: FakeBookie, now: float) -> bool:
        return b.running and self._avoid.get(b.address, 0.0) <= now

    def _choose_ensemble(self) -> list[str]:
        now = time.monotonic()
        pool = list(self.bookies)
        if self.rotate:
            k = self._rotation % len(pool)
            self._rotation += 1
            pool = pool[k:] + pool[:k]
        good = [b.address for b in pool if self._usable(b, now)]
        if len(good) < self.ensemble_size:  # as BookKeeper would: better a slow one than none
            good += [b.address for b in pool if b.address not in good]
        return good[:self.ensemble_size]

    @property
    def digest(self) -> codec.Digest:
        return codec.digest_for(self.digest_type, self.password)

    # ---- topics and ledgers --------------------------------------------------------------
    async def create_topic(self, topic: TopicName) -> None:
        await managed_ledger.update(self.zk, topic.managed_ledger, lambda info: True,
                                    create=True)
        self.written.setdefault(topic, [])

    async def open_ledger(self, topic: TopicName, ensemble: list[str] | None = None) -> int:
        if topic in self.open:
            raise AssertionError(f"{topic} has an open ledger")
        ledger_id = self.next_ledger_id
        self.next_ledger_id += 1
        members = ensemble or self._choose_ensemble()
        meta = LedgerMetadata(ledger_id, len(members), self.write_quorum, self.ack_quorum,
                              LedgerStateBK.OPEN, -1, 0, int(self.digest_type), self.password,
                              int(time.time() * 1000), ((0, tuple(members)),))
        path = ledger_path(ledger_id, self.ledgers_root)
        await self.zk.create(path, encode_ledger_metadata(meta))
        self.open[topic] = _Open(meta, 0)

        def add(info: managed_ledger.ManagedLedgerInfo) -> bool:
            info.ledgerInfo.add(ledgerId=ledger_id)
            return True

        await managed_ledger.update(self.zk, topic.managed_ledger, add, create=True)
        self.written.setdefault(topic, [])
        self.history[ledger_id] = LedgerLife(topic, ledger_id, time.monotonic())
        return ledger_id

    async def append(self, topic: TopicName, payloads: list[bytes]) -> Position:
        """Add a batch (opening a ledger if needed); all entries acked by ``ack_quorum`` of
        their write set, changing the ensemble when a bookie does not answer in time."""
        if topic not in self.open:
            await self.open_ledger(topic)
        led = self.open[topic]
        lac = led.lac  # what the writer knows confirmed when it sends the batch
        bodies: dict[int, bytes] = {}
        ids = []
        for p in payloads:
            e = led.next_entry
            led.next_entry += 1
            led.length += len(p)
            bodies[e] = encode_entry(self.digest, led.meta.ledger_id, e, lac, led.length,
                                           p)
            ids.append((e, p))
        acked: dict[int, set[str]] = {e: set() for e in bodies}
        for _ in range(2 * len(self.bookies) + 2):
            sends = [(e, b) for e in bodies for b in led.meta.bookies_for(e)
                     if b not in acked[e]]
            results = await asyncio.gather(*(self._add(b, led.meta.ledger_id, e, bodies[e])
                                             for e, b in sends))
            failed: set[str] = set()
            for (e, b), ok in zip(sends, results, strict=True):
                (acked[e].add if ok else failed.add)(b)
            short = [e for e in bodies if len(acked[e] & set(led.meta.bookies_for(e)))
                     < led.meta.ack_quorum]
            if not short:
                break
            now = time.monotonic()
            for b in failed:
                self._avoid[b] = now + self.avoid_s
            await self._change_ensemble_from(topic, min(short), failed)
        else:
            raise AssertionError(f"{topic}: entries {min(bodies)}..{max(bodies)} of ledger "
                                 f"{led.meta.ledger_id} could not be acknowledged")
        led.lac = led.next_entry - 1
        life = self.history[led.meta.ledger_id]
        for e, p in ids:
            self.written[topic].append((Position(led.meta.ledger_id, e), p))
            life.payloads.append(p)
        return Position(led.meta.ledger_id, led.next_entry - 1)

    async def _change_ensemble_from(self, topic: TopicName, first: int,
                                    failed: set[str]) -> None:
        """BookKeeper's ensemble change: entries from ``first`` on go to an ensemble in which
        the bookies that failed are replaced by others (if there are any)."""
        led = self.open[topic]
        current = led.meta.ensemble_for(first)
        now = time.monotonic()
        spares = [b.address for b in self.bookies if b.address not in current
                  and b.address not in failed and self._usable(b, now)]
        replace = {}
        for b in current:
            if b in failed and spares:
                replace[b] = spares.pop(0)
        if not replace:
            await asyncio.sleep(0.1)  # nobody to replace it with: try the same ones again
            return
        segs = [(f, ens) for f, ens in led.meta.segments if f < first]
        segs.append((first, tuple(replace.get(b, b) for b in current)))
        await self._set_segments(topic, tuple(segs))
        self.ensemble_changes += 1

    async def _add(self, bookie: str, ledger_id: int, entry_id: int, body: bytes) -> bool:
        assert self.adder is not None
        return await self.adder.add(bookie, ledger_id, entry_id, master_key(self.password),
                                    body)

    async def crash_and_recover(self, topic: TopicName, payload: bytes) -> int:
        """The broker dies while adding ``payload``: it reached one bookie of its write set
        only. Recovery finds fewer than ack-quorum copies and closes the ledger before it —
        the entry stays on that bookie, past the ledger's end. Returns the ledger id."""
        led = self.open[topic]
        e = led.next_entry
        body = encode_entry(self.digest, led.meta.ledger_id, e, led.lac,
                                  led.length + len(payload), payload)
        await self._add(led.meta.bookies_for(e)[0], led.meta.ledger_id, e, body)
        self.history[led.meta.ledger_id].torn = True
        return await self.close_ledger(topic)

    async def close_ledger(self, topic: TopicName) -> int:
        led = self.open.pop(topic)
        last = led.next_entry - 1
        meta = LedgerMetadata(led.meta.ledger_id, led.meta.ensemble_size,
                              led.meta.write_quorum, led.meta.ack_quorum, LedgerStateBK.CLOSED,
                              last, led.length, led.meta.digest_type, led.meta.password,
                              led.meta.ctime_ms, led.meta.segments)
        path = ledger_path(led.meta.ledger_id, self.ledgers_root)
        node = await self.zk.get(path)
        await self.zk.set(path, encode_ledger_metadata(meta), node.version)

        def close(info: managed_ledger.ManagedLedgerInfo) -> bool:
            for li in info.ledgerInfo:
                if li.ledgerId == led.meta.ledger_id:
                    li.entries, li.size = last + 1, led.length
                    li.timestamp = int(time.time() * 1000)
            return True

        await managed_ledger.update(self.zk, topic.managed_ledger, close)
        self.history[led.meta.ledger_id].closed = time.monotonic()
        return led.meta.ledger_id

    async def roll(self, topic: TopicName) -> int:
        if topic in self.open:
            await self.close_ledger(topic)
        return await self.open_ledger(topic)

    async def change_ensemble(self, topic: TopicName, replace: dict[str, str]) -> None:
        """From the next entry on, the open ledger writes to bookies replaced per ``replace``."""
        led = self.open[topic]
        old = led.meta.segments[-1][1]
        new = tuple(replace.get(b, b) for b in old)
        await self._set_segments(topic, (*led.meta.segments, (led.next_entry, new)))

    async def _set_segments(self, topic: TopicName,
                            segs: tuple[tuple[int, tuple[str, ...]], ...]) -> None:
        led = self.open[topic]
        m = led.meta
        led.meta = LedgerMetadata(m.ledger_id, m.ensemble_size, m.write_quorum, m.ack_quorum,
                                  m.state, m.last_entry_id, m.length, m.digest_type, m.password,
                                  m.ctime_ms, segs)
        path = ledger_path(m.ledger_id, self.ledgers_root)
        node = await self.zk.get(path)
        await self.zk.set(path, encode_ledger_metadata(led.meta), node.version)

    async def delete_ledger(self, topic: TopicName, ledger_id: int) -> None:
        """Retention: drop it from the managed ledger, then from BookKeeper and the bookies.
        Its life records the deletion from the moment it is decided (before anyone can see)."""
        if ledger_id in self.history:
            self.history[ledger_id].deleted = time.monotonic()

        def drop(info: managed_ledger.ManagedLedgerInfo) -> bool:
            keep = [li for li in info.ledgerInfo if li.ledgerId != ledger_id]
            copies = []
            for li in keep:
                c = managed_ledger.LedgerInfo()
                c.CopyFrom(li)
                copies.append(c)
            del info.ledgerInfo[:]
            info.ledgerInfo.extend(copies)
            return True

        await managed_ledger.update(self.zk, topic.managed_ledger, drop)
        await self.zk.delete(ledger_path(ledger_id, self.ledgers_root))
        for b in self.bookies:
            b.drop_ledger(ledger_id)
        self.written[topic] = [(p, d) for p, d in self.written[topic] if p.ledger_id != ledger_id]

    async def retain(self, topic: TopicName, *, max_age_s: float, keep: int = 1) -> list[int]:
        """Pulsar's time-based retention: delete the closed ledgers closed more than
        ``max_age_s`` ago, oldest first, keeping at least ``keep`` ledgers."""
        now = time.monotonic()
        out: list[int] = []
        lives = sorted((x for x in self.history.values()
                        if x.topic == topic and x.deleted is None), key=lambda x: x.ledger_id)
        for life in lives[:max(len(lives) - keep, 0)]:
            if life.closed is None or now - life.closed < max_age_s:
                break  # retention trims from the oldest end only
            await self.delete_ledger(topic, life.ledger_id)
            out.append(life.ledger_id)
        return out

    def ledgers_of(self, topic: TopicName) -> Sequence[LedgerLife]:
        return sorted((x for x in self.history.values() if x.topic == topic),
                      key=lambda x: x.ledger_id)

    def payloads(self, topic: TopicName) -> dict[Position, bytes]:
        return dict(self.written.get(topic, []))

    def ml_path(self, topic: TopicName) -> str:
        return managed_ledger_path(topic.managed_ledger)

    # ---- the schema registry -------------------------------------------------------------
    async def put_schema(self, topic: TopicName, info: SchemaInfo) -> int:
        """Add ``info`` as the topic's next schema version, as Pulsar's
        ``BookkeeperSchemaStorage`` does: a new ledger (empty password) of one ``SchemaEntry``,
        closed, then the locator ``/schemas/<schema id>`` created or compare-and-set. Returns
        the version."""
        sid = topic_schema_id(topic)
        path = f"{SCHEMAS_ROOT}/{sid}"
        try:
            node = await self.zk.get(path)
            locator: SchemaLocator | None = SchemaLocator.decode(node.data)
        except NotFound:
            node, locator = None, None
        version = 0 if locator is None else locator.info.version + 1
        chain = locator.index if locator is not None else (IndexEntry(0, -1, -1, info.hash()),)
        ledger_id = await self.write_single_entry_ledger(
            SchemaEntry(info.encode(), chain).encode(),
            {"application": b"pulsar", "component": b"schema",
             "pulsar/schemaId": sid.encode()})
        entry = IndexEntry(version, ledger_id, 0, info.hash())
        new = SchemaLocator(entry, (locator.index if locator is not None else ()) + (entry,))
        if node is None:
            await self.zk.create(path, new.encode())
        else:
            await self.zk.set(path, new.encode(), node.version)
        return version

    async def write_single_entry_ledger(self, payload: bytes, custom: dict[str, bytes]) -> int:
        """A ledger outside every topic holding ``payload`` as entry 0, closed."""
        ledger_id = self.next_ledger_id
        self.next_ledger_id += 1
        members = tuple(self._choose_ensemble())
        digest = codec.digest_for(self.digest_type, SCHEMA_PASSWORD)
        meta = LedgerMetadata(ledger_id, len(members), self.write_quorum, self.ack_quorum,
                              LedgerStateBK.OPEN, -1, 0, int(self.digest_type), SCHEMA_PASSWORD,
                              int(time.time() * 1000), ((0, members),))
        path = ledger_path(ledger_id, self.ledgers_root)
        await self.zk.create(path, encode_ledger_metadata(meta, custom))
        body = encode_entry(digest, ledger_id, 0, -1, len(payload), payload)
        acks = await asyncio.gather(*(self.adder.add(b, ledger_id, 0,  # type: ignore[union-attr]
                                                     master_key(SCHEMA_PASSWORD), body)
                                      for b in meta.bookies_for(0)))
        if sum(acks) < self.ack_quorum:
            raise AssertionError(f"schema ledger {ledger_id}: the add was not acknowledged")
        closed = dataclasses.replace(meta, state=LedgerStateBK.CLOSED, last_entry_id=0,
                                     length=len(payload))
        node = await self.zk.get(path)
        await self.zk.set(path, encode_ledger_metadata(closed, custom), node.version)
        return ledger_id
