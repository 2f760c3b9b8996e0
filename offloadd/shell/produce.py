"""``offloadd produce``: the embedded writer alone — history for backfill, a live writer for a
daemon started with ``run``, load for benchmarks.

Two kinds of entry, appended in batches paced to the requested byte rate:

- ``pulsar`` (the default): what a Pulsar broker stores — Pulsar-format entries
  (:mod:`offloadd.format.message`) from a few producers per topic, batches of 1..``max_batch``
  JSON messages with keys, ordering keys, properties and event times, compressed with each codec
  of a list in turn, with broker entry metadata (broker timestamp and index). ``--entry-size`` is
  the entry's size before compression (exact up to a few bytes of varint growth).
- ``raw``: slices of one random pool (distinct per entry, no per-entry allocation), for
  benchmarks that measure bytes only.

Per entry, Python work is kept small: message payloads, batch layouts and their compressed forms
are built once per template (a pool of them, cycled), and each entry only splices its sequence
id, times and broker index into pre-encoded metadata bytes, then computes its CRC32C.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import crc32c

from offloadd.format.compression import Compression, compress
from offloadd.format.message import BROKER_ENTRY_METADATA_MAGIC, CHECKSUM_MAGIC
from offloadd.format.varint import encode_varint as varint
from offloadd.ledger.local import LocalLedgerWriter
from offloadd.model import TopicName

POOL_BYTES = 8 * 1024 * 1024
TEMPLATE_BYTES = 4 * 1024 * 1024  # the pulsar templates' uncompressed bytes, at most
PayloadKind = Literal["pulsar", "raw"]


def topic_names(k: int, prefix: str = "persistent://public/default/topic-") -> list[TopicName]:
    return [TopicName.parse(f"{prefix}{i}") for i in range(k)]


class PayloadPool:
    """Distinct-looking payloads without allocating per entry."""

    def __init__(self, entry_size: int, seed_bytes: bytes | None = None) -> None:
        self.entry_size = entry_size
        size = max(POOL_BYTES, 2 * entry_size + 1)
        self._pool = memoryview(seed_bytes if seed_bytes is not None else os.urandom(size))
        self._span = len(self._pool) - entry_size
        self._next = 0

    def take(self, n: int) -> list[memoryview]:
        out = []
        step = 8191  # odd stride: consecutive entries differ
        for _ in range(n):
            off = self._next % (self._span + 1)
            out.append(self._pool[off:off + self.entry_size])
            self._next += step
        return out


class EntrySource(Protocol):
    def take(self, topic: TopicName, n: int) -> tuple[list[bytes | memoryview], int]:
        """``n`` entries for ``topic`` and their size as accounted against the rate."""
        ...


class RawEntries:
    """:class:`PayloadPool` slices as entries."""

    def __init__(self, entry_size: int) -> None:
        self._pool = PayloadPool(entry_size)
        self._size = entry_size

    def take(self, topic: TopicName, n: int) -> tuple[list[bytes | memoryview], int]:
        return list(self._pool.take(n)), n * self._size


@dataclass(frozen=True)
class PulsarShape:
    """What the ``pulsar`` entries look like."""

    compression: tuple[Compression, ...] = (Compression.NONE,)  # one producer per codec
    max_batch: int = 16  # messages per entry: 1..max_batch, varying
    broker_metadata: bool = True  # prepend broker entry metadata (timestamp, index)
    # two entries in three are transactional (a few transactions open at once, interleaved);
    # every ABORT_EVERY-th transaction is aborted; commit/abort markers follow as a broker's
    transactions: bool = False


@dataclass
class TopicDigest:
    """What a topic was sent: messages, and the SHA-1 over every message payload in log order,
    each as ``uint32 length (big-endian) + bytes``."""

    messages: int = 0
    sha1: hashlib._Hash = field(default_factory=hashlib.sha1)
    # with transactions: messages a read-committed consumer sees (``sha1`` covers only them),
    # and what was written besides
    visible_messages: int | None = None
    aborted_messages: int = 0
    transactions: int = 0
    aborted_transactions: int = 0

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"messages": self.messages, "sha1": self.sha1.hexdigest()}
        if self.visible_messages is not None:
            out.update(visible_messages=self.visible_messages,
                       aborted_messages=self.aborted_messages, transactions=self.transactions,
                       aborted_transactions=self.aborted_transactions)
        return out


_U32 = struct.Struct(">I")
_REGIONS = (b"eu-west", b"us-east", b"ap-south", b"sa-east")


class _Template:
    """One entry's contents, built once: the (batch) payload, compressed per codec on demand,
    and the metadata fields that do not change between the entries that reuse it."""

    __slots__ = ("batched", "digest", "md_after_time", "md_tail", "n", "packed", "plain")

    def __init__(self, k: int, target: int, max_batch: int, filler: bytes) -> None:
        # at least ~128 bytes a message, so that most are whole JSON objects
        n = 1 + k % max(1, min(max_batch, target // 128))
        self.n = n
        self.batched = not (n == 1 and k % 2 == 0)  # some entries are unbatched messages
        weights = [2 + (k + 3 * i) % 3 for i in range(n)]
        keys = [None if k % 5 == 4 else f"key-{(k * 7 + i) % 64}".encode() for i in range(n)]
        props = [((b"source", b"offloadd-produce"),) + (((b"trace", b"t-%d-%d" % (k, i)),)
                                                        if (k + i) % 3 == 0 else ())
                 if (k + i) % 2 == 0 else () for i in range(n)]
        ordering = k % 3 == 0

        def kv(field_no: int, key: bytes, value: bytes) -> bytes:
            inner = b"\x0a" + varint(len(key)) + key + b"\x12" + varint(len(value)) + value
            return varint(field_no << 3 | 2) + varint(len(inner)) + inner

        def ld(field_no: int, value: bytes) -> bytes:
            return varint(field_no << 3 | 2) + varint(len(value)) + value

        if self.batched:
            heads = []
            for i in range(n):  # SingleMessageMetadata without payload_size: fields 1, 2
                head = b"".join(kv(1, a, b) for a, b in props[i])
                key = keys[i]
                if key is not None:
                    head += ld(2, key)
                heads.append((head, ld(7, key) if ordering and key is not None else b""))

            def layout(sizes: list[int]) -> list[bytes]:
                return [h + b"\x18" + varint(sz) + t for (h, t), sz in zip(heads, sizes,
                                                                          strict=True)]

            room = target - sum(4 + len(h) + len(t) + 2 for h, t in heads)
            sizes = _split(max(room, 0), weights)
            for _ in range(4):  # payload_size varints grow with the sizes: settle them
                smms = layout(sizes)
                over = sum(4 + len(m) + sz for m, sz in zip(smms, sizes, strict=True)) - target
                if over == 0 or sizes[-1] - over < 0:
                    break
                sizes[-1] -= over
            smms = layout(sizes)
            payloads = [_json(k, i, sz, filler) for i, sz in enumerate(sizes)]
            self.plain = b"".join(b"".join((_U32.pack(len(m)), m, p))
                                  for m, p in zip(smms, payloads, strict=True))
            self.md_tail = b""
            mid = b""
        else:
            mid = b"".join(kv(4, a, b) for a, b in props[0])
            key = keys[0]
            if key is not None:
                mid += ld(6, key)
            self.md_tail = ld(18, key) if ordering and key is not None else b""
            # the message's fields live in the entry's metadata: they count against the size
            payloads = [_json(k, 0, max(target - len(mid) - len(self.md_tail), 0), filler)]
            self.plain = payloads[0]
        self.md_after_time = mid  # MessageMetadata fields 4 and 6 (unbatched only)
        self.digest = b"".join(_U32.pack(len(p)) + p for p in payloads)
        self.packed: dict[Compression, bytes] = {}


def _split(total: int, weights: list[int]) -> list[int]:
    """``total`` bytes in parts proportional to ``weights``, summing exactly."""
    w = sum(weights)
    sizes = [total * x // w for x in weights]
    sizes[-1] += total - sum(sizes)
    return sizes


def _json(k: int, i: int, size: int, filler: bytes) -> bytes:
    """A JSON object of exactly ``size`` bytes (plain filler when that is too small for one)."""
    head = b'{"id":%d,"customer":"c%03d","amount":%d.%02d,"region":"%s","note":"' % (
        k * 1000 + i, (k * 31 + i) % 1000, (k * 17 + i * 5) % 500, (k + i) % 100,
        _REGIONS[(k + i) % len(_REGIONS)])
    room = size - len(head) - 2
    if room < 0:
        return filler[:size]
    start = ((k * 131 + i) * 8191) % max(1, len(filler) - room)
    return head + filler[start:start + room] + b'"}'


class PulsarEntries:
    """Pulsar-format entries for :func:`produce` (see the module docstring)."""

    def __init__(self, entry_size: int, shape: PulsarShape | None = None, *,
                 clock: Callable[[], float] = time.time, seed: bytes | None = None) -> None:
        self.shape = shape or PulsarShape()
        if self.shape.max_batch < 1:
            raise ValueError(f"max_batch={self.shape.max_batch}: must be at least 1")
        if not self.shape.compression:
            raise ValueError("no compression given: name at least one (none, lz4, ...)")
        self.entry_size = entry_size
        self._clock = clock
        count = max(1, min(97, TEMPLATE_BYTES // max(entry_size, 1)))
        # broker metadata ~18, checksum 6, size 4, metadata ~45 bytes (name, times, sizes)
        overhead = (18 if self.shape.broker_metadata else 0) + 10 + 45
        raw = seed if seed is not None else os.urandom(max(64 * 1024, 2 * entry_size))
        filler = _b64ish(raw)
        self._templates = [_Template(k, entry_size - overhead, self.shape.max_batch, filler)
                           for k in range(count)]
        self._next = 0
        self._producers: dict[TopicName, list[_Producer]] = {}
        self.digests: dict[TopicName, TopicDigest] = {}
        self._index: dict[TopicName, int] = {}
        self._txns = TxnPlan()

    def take(self, topic: TopicName, n: int) -> tuple[list[bytes | memoryview], int]:
        producers = self._producers.get(topic)
        if producers is None:
            producers = self._producers[topic] = [
                _Producer(f"{topic.local}-{c.name.lower()}", c) for c in self.shape.compression]
            self.digests[topic] = TopicDigest(
                visible_messages=0 if self.shape.transactions else None)
            self._index[topic] = -1
        digest = self.digests[topic]
        now_ms = int(self._clock() * 1000)
        out: list[bytes | memoryview] = []
        accounted = 0
        for j in range(n):
            t = self._templates[self._next % len(self._templates)]
            self._next += 1
            p = producers[self._next % len(producers)]
            txn = self._txn(topic) if self.shape.transactions and self._next % 3 else None
            entry, plain_len = self._entry(topic, p, t, now_ms, j,
                                           txn.id if txn is not None else None)
            out.append(entry)
            accounted += plain_len
            digest.messages += t.n
            if txn is None or not txn.abort:
                digest.sha1.update(t.digest)
                if digest.visible_messages is not None:
                    digest.visible_messages += t.n
            else:
                digest.aborted_messages += t.n
            if txn is not None:
                txn.left -= 1
                if txn.left == 0:
                    out.append(self._marker(topic, txn, now_ms))
        return out, accounted

    def finish(self, topic: TopicName) -> list[bytes]:
        """The markers of the transactions still open on ``topic`` (written last)."""
        now_ms = int(self._clock() * 1000)
        return [self._marker(topic, t, now_ms) for t in self._txns.still_open(topic)]

    def _txn(self, topic: TopicName) -> _Txn:
        return self._txns.join(topic, self.digests[topic])

    def _marker(self, topic: TopicName, txn: _Txn, now_ms: int) -> bytes:
        broker = None
        if self.shape.broker_metadata:
            from offloadd._proto import pulsar_api_pb2 as pb

            self._index[topic] += 1
            broker = pb.BrokerEntryMetadata(broker_timestamp=now_ms, index=self._index[topic])
        return self._txns.marker(topic, txn, now_ms, broker)

    def _entry(self, topic: TopicName, p: _Producer, t: _Template, now_ms: int,
               j: int, txn: tuple[int, int] | None = None) -> tuple[bytes, int]:
        codec = p.codec
        payload = t.packed.get(codec)
        if payload is None:
            payload = t.packed[codec] = compress(codec, t.plain)
        seq = p.seq
        p.seq += t.n
        md = b"".join((
            p.head, varint(seq), b"\x18", varint(now_ms), t.md_after_time, p.codec_field,
            b"\x48", varint(len(t.plain)),
            b"\x58" + varint(t.n) if t.batched else b"",
            b"\x60", varint(now_ms - (seq * 37 + j) % 1000), t.md_tail,
            b"" if txn is None else  # fields 22 and 23: txnid_least_bits, txnid_most_bits
            b"\xb0\x01" + varint(txn[1]) + b"\xb8\x01" + varint(txn[0])))
        body = b"".join((_U32.pack(len(md)), md, payload))
        parts = [_CHECKSUM_HEAD.pack(CHECKSUM_MAGIC, crc32c.crc32c(body)), body]
        if self.shape.broker_metadata:
            self._index[topic] += t.n
            bem = b"\x08" + varint(now_ms) + b"\x10" + varint(self._index[topic])
            parts.insert(0, _BROKER_HEAD.pack(BROKER_ENTRY_METADATA_MAGIC, len(bem)) + bem)
        entry = b"".join(parts)
        return entry, len(entry) - len(payload) + len(t.plain)


_CHECKSUM_HEAD = struct.Struct(">HI")
_BROKER_HEAD = struct.Struct(">HI")


ABORT_EVERY = 4  # --transactions aborts one transaction in four


@dataclass(eq=False)
class _Txn:
    id: tuple[int, int]  # (most bits: the coordinator, least bits)
    left: int  # entries still to write
    abort: bool


class TxnPlan:
    """The transactions of generated entries, per topic: up to three open at once, each 1..4
    entries long (so that their entries and markers interleave), every ``ABORT_EVERY``-th
    aborted; shared by every entry source that writes ``--transactions``."""

    def __init__(self) -> None:
        self._open: dict[TopicName, list[_Txn]] = {}
        self._turn: dict[TopicName, int] = {}

    def join(self, topic: TopicName, digest: TopicDigest) -> _Txn:
        """The transaction the next transactional entry joins (a new one counted in
        ``digest``)."""
        open_ = self._open.setdefault(topic, [])
        if len(open_) < 3:
            digest.transactions += 1
            k = digest.transactions
            abort = k % ABORT_EVERY == 0
            digest.aborted_transactions += abort
            open_.append(_Txn((7, k), 1 + (k * 5) % 4, abort))
        # in turn, so that every open transaction progresses and ends within a few entries
        turn = self._turn[topic] = self._turn.get(topic, -1) + 1
        return open_[turn % len(open_)]

    def still_open(self, topic: TopicName) -> list[_Txn]:
        return list(self._open.get(topic, ()))

    def marker(self, topic: TopicName, txn: _Txn, now_ms: int,
               broker: Any = None) -> bytes:
        """The commit or abort marker a broker appends (``Markers.newTxnMarker``); ``broker``:
        the entry's ``BrokerEntryMetadata``, if the log has them."""
        from offloadd._proto import pulsar_api_pb2 as pb
        from offloadd.format.message import encode_entry

        self._open[topic].remove(txn)
        md = pb.MessageMetadata(producer_name="pulsar.txn.marker", sequence_id=(1 << 64) - 1,
                                publish_time=now_ms, marker_type=22 if txn.abort else 21,
                                txnid_most_bits=txn.id[0], txnid_least_bits=txn.id[1])
        return encode_entry(md, b"", broker=broker)


class _Producer:
    __slots__ = ("codec", "codec_field", "head", "seq")

    def __init__(self, name: str, codec: Compression) -> None:
        raw = name.encode()
        self.head = b"\x0a" + varint(len(raw)) + raw + b"\x10"  # field 1, then field 2's tag
        self.codec = codec
        self.codec_field = b"\x40" + varint(codec) if codec else b""  # Pulsar omits NONE
        self.seq = 0


def _b64ish(raw: bytes) -> bytes:
    """Printable, JSON-safe filler that compresses about as well as real text fields."""
    import base64

    return base64.b64encode(raw)


@dataclass
class ProduceStats:
    entries: int = 0
    bytes: int = 0
    seconds: float = 0.0
    digests: dict[TopicName, TopicDigest] = field(default_factory=dict)


async def produce(writer: LocalLedgerWriter, topics: Sequence[TopicName], *, entry_size: int,
                  total_bytes: int | None = None, rate: float | None = None,
                  duration: float | None = None, batch_bytes: int = 256 * 1024,
                  stop: asyncio.Event | None = None,
                  on_batch: Callable[[ProduceStats], None] | None = None,
                  clock: Callable[[], float] = time.monotonic,
                  payload: PayloadKind = "pulsar", shape: PulsarShape | None = None,
                  source: EntrySource | None = None) -> ProduceStats:
    """Append to ``topics`` round-robin until ``total_bytes`` or ``duration`` (paced at
    ``rate`` bytes/s when given) or ``stop`` is set.

    Bytes are counted before compression (what producers sent); ``stats.digests`` holds, for
    ``pulsar`` entries, what each topic was sent. ``source`` (e.g. messages of a schema)
    replaces ``payload``/``shape``; its ``digests``, if it has them, are reported the same."""
    stats = ProduceStats()
    if source is not None:
        stats.digests = getattr(source, "digests", {})
    elif payload == "raw":
        source = RawEntries(entry_size)
    else:
        pulsar = PulsarEntries(entry_size, shape)
        source, stats.digests = pulsar, pulsar.digests
    if rate:
        # at most 50 ms of the rate per batch: a slow rate must not wait for a whole batch's
        # worth of time before its first entry (nor write in bursts)
        batch_bytes = min(batch_bytes, int(rate / 20))
    per_batch = max(1, batch_bytes // max(entry_size, 1))
    t0 = clock()
    i = 0
    while True:
        now = clock()
        if stop is not None and stop.is_set():
            break
        if total_bytes is not None and stats.bytes >= total_bytes:
            break
        if duration is not None and now - t0 >= duration:
            break
        n = per_batch
        if total_bytes is not None:
            n = max(1, min(n, (total_bytes - stats.bytes + entry_size - 1) // max(entry_size, 1)))
        if rate:
            due = t0 + (stats.bytes + n * entry_size) / rate
            if due > now:
                await asyncio.sleep(min(due - now, 0.05))
                continue
        topic = topics[i % len(topics)]
        i += 1
        entries, nbytes = source.take(topic, n)
        await writer.append(topic, entries)  # type: ignore[arg-type]
        stats.entries += len(entries)
        stats.bytes += nbytes
        await writer.roll_expired()
        if on_batch is not None:
            on_batch(stats)
    # end the transactions still open, as their clients would (a source without transactions
    # has none open)
    finish: Callable[[TopicName], list[bytes]] | None = getattr(source, "finish", None)
    if finish is not None:
        for topic in topics:
            markers = finish(topic)
            if markers:
                await writer.append(topic, markers)
                stats.entries += len(markers)
    stats.seconds = clock() - t0
    return stats
