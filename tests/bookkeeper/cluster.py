"""A Pulsar cluster in miniature for the BookKeeper source tests: Pulsar-style metadata in a real
ZooKeeper and entries on fake bookies, written the way a broker and its BookKeeper client do.

``FakePulsar`` plays the broker: it creates topics (``/managed-ledgers/...``), opens ledgers
(``/ledgers/<hierarchical path>``, then appends the ledger to the topic's ``ManagedLedgerInfo``),
adds entries over protocol v3 to every bookie of each entry's write set (the body carries the LAC
the writer knew when it sent the entry), closes ledgers (metadata ``CLOSED`` with
``lastEntryId``/``length``, then ``entries``/``size`` in the managed ledger), changes ensembles
and deletes ledgers as Pulsar's retention does. Everything it wrote is kept in :attr:`written`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from offloadd.errors import OffloaddError
from offloadd.ledger.bookkeeper import codec
from offloadd.ledger.bookkeeper.client import BookieClient, BookieError, ClientOptions
from offloadd.ledger.bookkeeper.codec import AddRequest, AddResponse, DigestType, Status
from offloadd.ledger.bookkeeper.layout import (
    HIERARCHICAL_FACTORY,
    LedgerMetadata,
    LedgerStateBK,
    encode_ledger_metadata,
    ledger_path,
)
from offloadd.metadata import managed_ledger
from offloadd.metadata.zookeeper import ZooKeeperMetadataStore
from offloadd.model import Position, TopicName
from offloadd.paths import managed_ledger_path
from tests.fixtures.fake_bookie import FakeBookie


@dataclass
class _Open:
    meta: LedgerMetadata
    version: int
    next_entry: int = 0
    length: int = 0
    lac: int = -1


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
    adder: BookieClient = field(default_factory=lambda: BookieClient(
        ClientOptions(read_timeout_s=5.0, connect_timeout_s=2.0, quarantine_s=0.0)))

    async def setup(self) -> None:
        await self.zk.create(f"{self.ledgers_root}/LAYOUT",
                             f"2\n{HIERARCHICAL_FACTORY}:1\n".encode())
        for b in self.bookies:
            await self.zk.create(f"{self.ledgers_root}/available/{b.address}", b"")

    async def close(self) -> None:
        await self.adder.close()

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
        members = ensemble or [b.address for b in self.bookies[:self.ensemble_size]]
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
        return ledger_id

    async def append(self, topic: TopicName, payloads: list[bytes]) -> Position:
        """Add a batch (opening a ledger if needed); all entries acked by ``ack_quorum``."""
        if topic not in self.open:
            await self.open_ledger(topic)
        led = self.open[topic]
        sends = []
        ids = []
        lac = led.lac  # what the writer knows confirmed when it sends the batch
        for p in payloads:
            e = led.next_entry
            led.next_entry += 1
            led.length += len(p)
            body = codec.encode_entry(self.digest, led.meta.ledger_id, e, lac, led.length, p)
            for b in led.meta.bookies_for(e):
                sends.append(self._add(b, led.meta.ledger_id, e, body))
            ids.append((e, p))
        results = await asyncio.gather(*sends, return_exceptions=True)
        per_entry = len(results) // len(payloads)
        for i in range(len(payloads)):
            acks = sum(1 for r in results[i * per_entry:(i + 1) * per_entry] if r is True)
            if acks < led.meta.ack_quorum:
                raise AssertionError(f"entry {ids[i][0]} got {acks} acks: {results}")
        led.lac = led.next_entry - 1
        for e, p in ids:
            self.written[topic].append((Position(led.meta.ledger_id, e), p))
        return Position(led.meta.ledger_id, led.next_entry - 1)

    async def _add(self, bookie: str, ledger_id: int, entry_id: int, body: bytes) -> bool:
        key = codec.master_key(self.password)
        try:
            resp = await self.adder.call(
                bookie, lambda txn: AddRequest(txn, ledger_id, entry_id, key, body))
        except (BookieError, OffloaddError):
            return False
        return isinstance(resp, AddResponse) and resp.status == Status.EOK

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
        segs = (*led.meta.segments, (led.next_entry, new))
        m = led.meta
        led.meta = LedgerMetadata(m.ledger_id, m.ensemble_size, m.write_quorum, m.ack_quorum,
                                  m.state, m.last_entry_id, m.length, m.digest_type, m.password,
                                  m.ctime_ms, segs)
        path = ledger_path(m.ledger_id, self.ledgers_root)
        node = await self.zk.get(path)
        await self.zk.set(path, encode_ledger_metadata(led.meta), node.version)

    async def delete_ledger(self, topic: TopicName, ledger_id: int) -> None:
        """Retention: drop it from the managed ledger, then from BookKeeper and the bookies."""

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

    def payloads(self, topic: TopicName) -> dict[Position, bytes]:
        return dict(self.written.get(topic, []))

    def ml_path(self, topic: TopicName) -> str:
        return managed_ledger_path(topic.managed_ledger)
