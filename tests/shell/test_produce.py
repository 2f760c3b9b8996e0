"""The embedded writer's Pulsar-format entries: what a broker would have stored, every codec,
and the per-topic digest a table can be checked against."""

from __future__ import annotations

import hashlib
import json
import struct
from collections import Counter
from pathlib import Path

import pytest

from offloadd._proto import pulsar_api_pb2 as pb
from offloadd.format.compression import Compression
from offloadd.format.message import decode_entry
from offloadd.ledger.local import LocalLedgerSource, LocalLedgerWriter
from offloadd.metadata.memory import MemoryMetadataStore
from offloadd.model import TopicName
from offloadd.shell.produce import PulsarEntries, PulsarShape, produce

TOPIC = TopicName.parse("persistent://public/default/orders")


def _digest(payloads: list[bytes]) -> str:
    h = hashlib.sha1()
    for p in payloads:
        h.update(struct.pack(">I", len(p)) + p)
    return h.hexdigest()


def test_transactions_commit_abort_and_end_soon() -> None:
    """--transactions: markers as a broker writes them, one transaction in four aborted, the
    digest over what a read-committed consumer sees, and no transaction left open for long (a
    held transaction holds back the table)."""
    from offloadd.lakehouse.transactions import ReadCommitted
    from offloadd.model import Position

    src = PulsarEntries(1024, PulsarShape(compression=(Compression.NONE, Compression.LZ4),
                                          transactions=True))
    entries: list[bytes | memoryview] = []
    for _ in range(20):
        entries += src.take(TOPIC, 50)[0]
    rc = ReadCommitted(timeout_ms=10**9)
    most_held = 0
    visible: list[bytes] = []
    for i, raw in enumerate(entries):
        rc.add(Position(1, i), raw, decode_entry(raw, "t"))
        most_held = max(most_held, rc.held)
        visible += [m.payload or b"" for r in rc.take() if r.hidden is None
                    for m in r.entry.messages]  # type: ignore[union-attr]
    assert most_held <= 20, most_held
    for raw in src.finish(TOPIC):
        rc.add(Position(1, len(entries)), raw, decode_entry(raw, "t"))
        visible += [m.payload or b"" for r in rc.take() if r.hidden is None
                    for m in r.entry.messages]  # type: ignore[union-attr]
    assert rc.held == 0
    d = src.digests[TOPIC]
    assert d.transactions > 100 and d.aborted_transactions == d.transactions // 4
    assert rc.counts.transactions_committed + rc.counts.transactions_aborted == d.transactions
    assert rc.counts.aborted_messages == d.aborted_messages > 0
    assert d.visible_messages is not None
    assert len(visible) == d.visible_messages < d.messages
    assert _digest(visible) == d.sha1.hexdigest()


@pytest.mark.parametrize("kind", ["avro", "json"])
def test_schema_messages_in_transactions(kind: str) -> None:
    """--schema with --transactions: schema'd messages inside transactions (their
    schema_version kept), one transaction in four aborted, markers as a broker writes them,
    and visible_messages/sha1 what a read-committed consumer sees."""
    from offloadd.format.schema_storage import version_bytes
    from offloadd.lakehouse.transactions import ReadCommitted
    from offloadd.model import Position
    from offloadd.shell.produce_schema import SchemaEntries

    src = SchemaEntries(kind, {TOPIC: 2}, max_batch=4, transactions=True)  # type: ignore[arg-type]
    entries: list[bytes | memoryview] = []
    for _ in range(10):
        entries += src.take(TOPIC, 30)[0]
    entries += src.finish(TOPIC)
    rc = ReadCommitted(timeout_ms=10**9)
    visible: list[bytes] = []
    in_txn = 0
    for i, raw in enumerate(entries):
        e = decode_entry(raw, "t")
        if e.marker_type is None:
            assert e.schema_version == version_bytes(2)
            in_txn += e.txn is not None
        rc.add(Position(1, i), raw, e)
        visible += [m.payload or b"" for r in rc.take() if r.hidden is None
                    for m in r.entry.messages]  # type: ignore[union-attr]
    assert rc.held == 0
    d = src.digests[TOPIC]
    assert in_txn == 200  # two entries in three
    assert d.transactions > 50 and d.aborted_transactions == d.transactions // 4
    assert rc.counts.transactions_committed + rc.counts.transactions_aborted == d.transactions
    assert rc.counts.aborted_messages == d.aborted_messages > 0
    assert d.visible_messages is not None
    assert len(visible) == d.visible_messages < d.messages
    assert _digest(visible) == d.sha1.hexdigest()


class TestPulsarEntries:
    """Entries decode as Pulsar's format with the fields a real producer sets."""

    @pytest.mark.parametrize("entry_size", [256, 1024, 5000, 200_000])
    def test_every_entry_decodes_and_the_digest_matches(self, entry_size: int) -> None:
        src = PulsarEntries(entry_size, PulsarShape(compression=tuple(Compression)))
        entries, accounted = src.take(TOPIC, 300)
        payloads: list[bytes] = []
        shapes: Counter[tuple[bool, int]] = Counter()
        codecs: set[int] = set()
        last_index = -1
        for e in entries:
            d = decode_entry(e, "test")
            codecs.add(d.compression)
            shapes[(d.messages[0].batch_index >= 0, len(d.messages))] += 1
            assert d.broker is not None and d.broker.index is not None
            assert d.broker.index == last_index + len(d.messages)  # Pulsar: last message's
            last_index = d.broker.index
            assert d.producer_name.startswith("orders-")
            for m in d.messages:
                assert m.payload is not None
                assert m.event_time is not None and m.event_time <= d.publish_time
                payloads.append(m.payload)
        assert codecs == {int(c) for c in Compression}
        assert src.digests[TOPIC].messages == len(payloads)
        assert src.digests[TOPIC].sha1.hexdigest() == _digest(payloads)
        assert abs(accounted / 300 - entry_size) < 0.05 * entry_size
        if entry_size >= 1024:  # batches of several sizes, and unbatched messages
            assert any(not batched for batched, _ in shapes)
            assert len({n for _, n in shapes}) >= 4
            assert sum(p.startswith(b"{") for p in payloads) == len(payloads)
            json.loads(payloads[0])

    def test_sequence_ids_are_per_producer_and_consecutive(self) -> None:
        src = PulsarEntries(1024, PulsarShape(compression=(Compression.LZ4, Compression.NONE)))
        entries, _ = src.take(TOPIC, 50)
        nxt: dict[str, int] = {}
        for e in entries:
            d = decode_entry(e, "test")
            assert d.sequence_id == nxt.get(d.producer_name, 0)
            assert [m.sequence_id for m in d.messages] == list(
                range(d.sequence_id, d.sequence_id + len(d.messages)))
            nxt[d.producer_name] = d.sequence_id + len(d.messages)
        assert set(nxt) == {"orders-lz4", "orders-none"}

    def test_metadata_is_what_protobuf_would_write(self) -> None:
        """The hand-spliced metadata equals the protobuf runtime's own serialization."""
        src = PulsarEntries(2048, PulsarShape(compression=tuple(Compression)))
        for e in src.take(TOPIC, 60)[0]:
            mv = memoryview(e)
            (bsize,) = struct.unpack_from(">I", mv, 2)
            off = 6 + bsize + 6
            (size,) = struct.unpack_from(">I", mv, off)
            raw = bytes(mv[off + 4:off + 4 + size])
            assert pb.MessageMetadata.FromString(raw).SerializeToString() == raw

    def test_broker_metadata_can_be_left_out(self) -> None:
        src = PulsarEntries(1024, PulsarShape(broker_metadata=False))
        for e in src.take(TOPIC, 20)[0]:
            assert bytes(e[:2]) == b"\x0e\x01"
            assert decode_entry(e, "test").broker is None


@pytest.mark.timeout(60)
async def test_produce_writes_pulsar_entries_to_the_ledgers(tmp_path: Path) -> None:
    md = MemoryMetadataStore()
    writer = LocalLedgerWriter(tmp_path, md)
    stats = await produce(writer, [TOPIC], entry_size=700, total_bytes=50_000,
                          shape=PulsarShape(compression=(Compression.ZSTD,)))
    await writer.close()
    src = LocalLedgerSource(tmp_path, md)
    payloads = []
    for led in await src.ledgers(TOPIC):
        run = await src.read(TOPIC, led.ledger_id, 0, led.last_entry_id)
        data = bytes(run.data)
        for i in range(run.count):
            entry = data[run.offsets[i] + 12:run.offsets[i + 1]]
            payloads += [m.payload for m in decode_entry(entry, "x").messages]
    assert stats.entries == sum(led.entries for led in await src.ledgers(TOPIC))
    assert stats.digests[TOPIC].messages == len(payloads)
    assert stats.digests[TOPIC].sha1.hexdigest() == _digest(payloads)  # type: ignore[arg-type]
    assert stats.bytes >= 50_000


@pytest.mark.timeout(60)
async def test_raw_payloads_stay_for_benchmarks(tmp_path: Path) -> None:
    md = MemoryMetadataStore()
    writer = LocalLedgerWriter(tmp_path, md)
    stats = await produce(writer, [TOPIC], entry_size=512, total_bytes=10_240, payload="raw")
    await writer.close()
    assert (stats.entries, stats.bytes, stats.digests) == (20, 10_240, {})
