"""Pulsar's message (entry) format: golden bytes, round trips, every corruption named.

The encoder in this file is written from the format facts with ``struct`` and the protobuf
runtime only — independent of ``offloadd.format.message.encode_*`` — so a round trip checks the
decoder against a second reading of the layout::

    [0x0E02 | u32 size | BrokerEntryMetadata]   optional
    [0x0E01 | u32 CRC32C over the rest]         optional (old entries have none)
    u32 metadata size | MessageMetadata | payload (compressed; a batch = N × [u32 | SMM | bytes])
"""

from __future__ import annotations

import contextlib
import struct
import zlib
from dataclasses import dataclass, field

import cramjam
import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from offloadd._proto import pulsar_api_pb2 as pb
from offloadd.errors import FormatError
from offloadd.format.compression import Compression, compress, decompress
from offloadd.format.message import decode_entry, encode_batch, encode_entry
from offloadd.format.varint import encode_varint as varint
from tests.format._support import RELAXED

WHERE = "persistent://public/default/t 7:42"


# -- an independent encoder ----------------------------------------------------------------------


def _codec(codec: int, data: bytes) -> bytes:
    if codec == 0:
        return data
    if codec == 1:
        return bytes(cramjam.lz4.compress_block(data, store_size=False))
    if codec == 2:
        return zlib.compress(data, 9)
    if codec == 3:
        return bytes(cramjam.zstd.compress(data, level=3))
    if codec == 4:
        return bytes(cramjam.snappy.compress_raw(data))
    raise AssertionError(codec)


@dataclass
class Msg:
    payload: bytes | None
    key: str | None = None
    ordering_key: bytes | None = None
    properties: list[tuple[str, str]] = field(default_factory=list)
    event_time: int = 0
    sequence_id: int | None = None


def single_metadata(m: Msg) -> pb.SingleMessageMetadata:
    """A batched message's own metadata, as Pulsar's producer writes it."""
    smm = pb.SingleMessageMetadata(payload_size=len(m.payload or b""))
    keyed(smm, m)
    if m.event_time:
        smm.event_time = m.event_time
    if m.sequence_id is not None:
        smm.sequence_id = m.sequence_id
    return smm


def keyed(md: pb.SingleMessageMetadata | pb.MessageMetadata, m: Msg) -> None:
    """The fields a message carries in its batch entry or, unbatched, in the entry's own
    metadata (the same names in both)."""
    for k, v in m.properties:
        md.properties.add(key=k, value=v)
    if m.key is not None:
        md.partition_key = m.key
    if m.ordering_key is not None:
        md.ordering_key = m.ordering_key
    if m.payload is None:
        md.null_value = True


def build(msgs: list[Msg], *, codec: int = 0, batched: bool = True, checksum: bool = True,
          broker: tuple[int, int] | None = None, encrypted: bool = False,
          chunk: tuple[str, int, int] | None = None, publish_time: int = 1_700_000_000_123,
          seq: int = 10, event_time: int = 0) -> bytes:
    md = pb.MessageMetadata(producer_name="prod-1", sequence_id=seq, publish_time=publish_time)
    if event_time:
        md.event_time = event_time
    if batched:
        parts = []
        for m in msgs:
            smm = single_metadata(m)
            raw = smm.SerializeToString()
            parts.append(struct.pack(">I", len(raw)) + raw + (m.payload or b""))
        plain = b"".join(parts)
        md.num_messages_in_batch = len(msgs)
    else:
        (m,) = msgs
        plain = m.payload or b""
        keyed(md, m)
        if m.event_time:
            md.event_time = m.event_time
    if codec:
        md.compression = codec
    md.uncompressed_size = len(plain)
    payload = _codec(codec, plain)
    if encrypted:
        md.encryption_keys.add(key="k", value=b"\x01\x02")
        md.encryption_algo = "RSA"
        payload = bytes(b ^ 0x5A for b in payload)
    if chunk is not None:
        md.uuid, md.chunk_id, md.num_chunks_from_msg = chunk
        md.total_chunk_msg_size = 1000
    mdb = md.SerializeToString()
    body = struct.pack(">I", len(mdb)) + mdb + payload
    out = b""
    if broker is not None:
        bem = pb.BrokerEntryMetadata(broker_timestamp=broker[0], index=broker[1])
        raw = bem.SerializeToString()
        out += struct.pack(">HI", 0x0E02, len(raw)) + raw
    if checksum:
        out += struct.pack(">HI", 0x0E01, crc32c.crc32c(body))
    return out + body


# -- golden vectors ------------------------------------------------------------------------------


class TestGolden:
    """Bytes assembled by hand from the format facts decode to the fields they spell."""

    def test_crc32c_is_castagnoli(self) -> None:
        assert crc32c.crc32c(b"123456789") == 0xE3069283  # the standard CRC-32C check value

    def test_single_message_entry_with_checksum(self) -> None:
        md = bytes.fromhex(
            "0a0170"          # 1 producer_name "p"
            "1007"            # 2 sequence_id 7
            "18e807"          # 3 publish_time 1000
            "220a0a01611205"  # 4 properties {a: "hello"} ...
            "68656c6c6f"
            "32026b31"        # 6 partition_key "k1"
            "6064"            # 12 event_time 100
        )
        body = struct.pack(">I", len(md)) + md + b"payload!"
        entry = bytes.fromhex("0e01") + struct.pack(">I", crc32c.crc32c(body)) + body
        assert entry.hex() == ("0e01" "7aa5d39e" "0000001a" + md.hex() + b"payload!".hex())
        d = decode_entry(entry, WHERE)
        assert (d.producer_name, d.sequence_id, d.publish_time, d.has_checksum) == (
            "p", 7, 1000, True)
        (m,) = d.messages
        assert (m.batch_index, m.payload, m.key, m.properties, m.event_time, m.sequence_id) == (
            -1, b"payload!", "k1", (("a", "hello"),), 100, 7)

    def test_lz4_batch_of_two_with_broker_metadata(self) -> None:
        smm0 = bytes.fromhex("1202" "6b30" "1803")  # partition_key "k0", payload_size 3
        smm1 = bytes.fromhex("1802" "4009")  # payload_size 2, sequence_id 9
        plain = (struct.pack(">I", 6) + smm0 + b"abc" + struct.pack(">I", 4) + smm1 + b"de")
        assert len(plain) == 23
        # LZ4 block of 23 literals: token 0xF0 (15 + extension 8), then the bytes
        lz4 = bytes([0xF0, 23 - 15]) + plain
        assert bytes(cramjam.lz4.decompress_block(lz4, output_len=23)) == plain
        md = bytes.fromhex("0a0170" "1005" "18d00f" "4001" "4817" "5802")
        #                  name p   seq 5  pt 2000  LZ4    usize 23 batch 2
        body = struct.pack(">I", len(md)) + md + lz4
        bem = bytes.fromhex("08904e" "1029")  # broker_timestamp 10000, index 41
        entry = (bytes.fromhex("0e02") + struct.pack(">I", len(bem)) + bem
                 + bytes.fromhex("0e01") + struct.pack(">I", crc32c.crc32c(body)) + body)
        d = decode_entry(entry, WHERE)
        assert d.broker is not None
        assert (d.broker.broker_timestamp, d.broker.index) == (10000, 41)
        assert (d.compression, d.num_messages, d.publish_time) == (1, 2, 2000)
        assert [(m.batch_index, m.payload, m.key, m.sequence_id) for m in d.messages] == [
            (0, b"abc", "k0", 5), (1, b"de", None, 9)]

    def test_old_entry_without_checksum(self) -> None:
        md = bytes.fromhex("0a0170" "1001" "1802")
        entry = struct.pack(">I", len(md)) + md + b"x"
        d = decode_entry(entry, WHERE)
        assert not d.has_checksum
        assert d.messages[0].payload == b"x"

    @pytest.mark.parametrize("codec", list(Compression))
    def test_each_codec_as_pulsar_writes_it(self, codec: Compression) -> None:
        plain = b"pulsar " * 300
        packed = compress(codec, plain)
        assert decompress(codec, packed, len(plain)) == plain
        if codec is Compression.LZ4:  # a bare block: no frame magic, no size prefix
            assert packed[:4] != b"\x04\x22\x4d\x18"
        if codec is Compression.ZLIB:
            assert packed[0] == 0x78  # zlib header (Deflater's default), not raw deflate
        if codec is Compression.ZSTD:
            assert packed[:4] == b"\x28\xb5\x2f\xfd"  # a zstd frame
        if codec is Compression.SNAPPY:
            assert packed[:2] == varint(len(plain))  # raw block: the length varint first


# -- round trips ---------------------------------------------------------------------------------

_texts = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
_msgs = st.builds(
    Msg,
    payload=st.one_of(st.none(), st.binary(max_size=40)),
    key=st.one_of(st.none(), _texts),
    ordering_key=st.one_of(st.none(), st.binary(max_size=8)),
    properties=st.lists(st.tuples(_texts, _texts), max_size=3),
    event_time=st.integers(0, 2**63 - 1),
    sequence_id=st.one_of(st.none(), st.integers(0, 2**64 - 1)),
)


class TestRoundTrip:
    """Whatever the encoder writes, the decoder returns field for field."""

    @RELAXED
    @given(msgs=st.lists(_msgs, min_size=1, max_size=40), codec=st.sampled_from(range(5)),
           checksum=st.booleans(), broker=st.one_of(st.none(), st.tuples(
               st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))),
           event_time=st.integers(0, 2**40))
    def test_batches(self, msgs: list[Msg], codec: int, checksum: bool,
                     broker: tuple[int, int] | None, event_time: int) -> None:
        d = decode_entry(build(msgs, codec=codec, checksum=checksum, broker=broker,
                               event_time=event_time), WHERE)
        assert (d.compression, d.num_messages, d.has_checksum) == (codec, len(msgs), checksum)
        assert (d.broker.broker_timestamp, d.broker.index) == broker if d.broker else \
            broker is None
        for i, (m, want) in enumerate(zip(d.messages, msgs, strict=True)):
            assert m.batch_index == i
            assert m.payload == want.payload
            assert m.key == want.key
            assert m.ordering_key == want.ordering_key
            assert list(m.properties) == want.properties
            assert m.event_time == (want.event_time or event_time or None)
            assert m.sequence_id == (want.sequence_id if want.sequence_id is not None
                                     else 10 + i)

    @RELAXED
    @given(n=st.integers(1, 1000), codec=st.sampled_from(range(5)), size=st.integers(0, 64))
    def test_batch_sizes_up_to_1000(self, n: int, codec: int, size: int) -> None:
        msgs = [Msg(bytes([i % 251]) * size, key=f"k{i}") for i in range(n)]
        d = decode_entry(build(msgs, codec=codec), WHERE)
        assert len(d.messages) == n
        assert [m.payload for m in d.messages] == [m.payload for m in msgs]
        assert d.messages[-1].key == f"k{n - 1}"

    @RELAXED
    @given(msg=_msgs, codec=st.sampled_from(range(5)), checksum=st.booleans())
    def test_unbatched(self, msg: Msg, codec: int, checksum: bool) -> None:
        d = decode_entry(build([msg], codec=codec, batched=False, checksum=checksum), WHERE)
        (m,) = d.messages
        assert (m.batch_index, m.payload, m.key, m.ordering_key, list(m.properties)) == (
            -1, msg.payload, msg.key, msg.ordering_key, msg.properties)
        assert d.num_messages == 1

    @RELAXED
    @given(msgs=st.lists(_msgs, min_size=1, max_size=5), codec=st.sampled_from(range(5)))
    def test_encrypted_entries_keep_their_ciphertext(self, msgs: list[Msg], codec: int) -> None:
        raw = build(msgs, codec=codec, encrypted=True)
        d = decode_entry(raw, WHERE)
        assert d.encrypted
        assert d.num_messages == len(msgs)
        (m,) = d.messages  # the batch inside cannot be opened
        assert m.batch_index == -1
        assert m.payload is not None and raw.endswith(m.payload)

    @RELAXED
    @given(payload=st.binary(min_size=1, max_size=200), chunk_id=st.integers(0, 9),
           codec=st.sampled_from(range(5)))
    def test_chunks_are_returned_as_stored(self, payload: bytes, chunk_id: int,
                                           codec: int) -> None:
        raw = build([Msg(payload)], codec=codec, batched=False,
                    chunk=("uuid-1", chunk_id, 10))
        d = decode_entry(raw, WHERE)
        assert d.chunk is not None
        assert (d.chunk.uuid, d.chunk.chunk_id, d.chunk.num_chunks, d.chunk.total_size) == (
            "uuid-1", chunk_id, 10, 1000)
        assert d.messages[0].payload == _codec(codec, payload)  # not decompressed alone

    @RELAXED
    @given(msgs=st.lists(_msgs, min_size=1, max_size=10), codec=st.sampled_from(range(5)),
           broker=st.booleans())
    def test_package_encoder_writes_the_same_bytes(self, msgs: list[Msg], codec: int,
                                                   broker: bool) -> None:
        want = build(msgs, codec=codec, broker=(5, 6) if broker else None)
        d = decode_entry(want, WHERE)
        smms = []
        for m in msgs:
            smm = single_metadata(m)
            smms.append((smm, m.payload or b""))
        plain = encode_batch(smms)
        md = pb.MessageMetadata(producer_name="prod-1", sequence_id=10,
                                publish_time=1_700_000_000_123, num_messages_in_batch=len(msgs),
                                uncompressed_size=len(plain))
        if codec:
            md.compression = codec
        got = encode_entry(md, _codec(codec, plain),
                           broker=pb.BrokerEntryMetadata(broker_timestamp=5, index=6)
                           if broker else None)
        assert decode_entry(got, WHERE) == d
        if codec in (0, 1, 4):  # deterministic codecs: byte-identical
            assert got == want

    @given(st.integers(0, 2**64 - 1))
    def test_varint_matches_protobuf(self, value: int) -> None:
        assert varint(value) == pb.BrokerEntryMetadata(index=value).SerializeToString()[1:]


# -- corruption ----------------------------------------------------------------------------------


def _entry(codec: int = 0, n: int = 3) -> bytes:
    return build([Msg(b"hello %d" % i, key=f"k{i}") for i in range(n)], codec=codec)


def _rechecksum(entry: bytes) -> bytes:
    """Recompute the CRC so a deeper corruption is what the decoder sees."""
    body = entry[6:]
    return entry[:2] + struct.pack(">I", crc32c.crc32c(body)) + body


def _with_metadata(entry: bytes, edit: object) -> bytes:
    (size,) = struct.unpack_from(">I", entry, 6)
    md = pb.MessageMetadata.FromString(entry[10:10 + size])
    edit(md)  # type: ignore[operator]
    raw = md.SerializeToString()
    return _rechecksum(entry[:6] + struct.pack(">I", len(raw)) + raw + entry[10 + size:])


def _set(**fields: object) -> object:
    def edit(md: pb.MessageMetadata) -> None:
        for k, v in fields.items():
            setattr(md, k, v)
    return edit


CORRUPTIONS: list[tuple[str, bytes, str]] = [
    ("empty entry", b"", "truncated entry: 0 bytes where the 4-byte metadata size"),
    ("checksum magic only", b"\x0e\x01\x00", "truncated entry: checksum magic"),
    ("broker metadata magic only", b"\x0e\x02\x00", "truncated entry: broker entry metadata "
     "magic"),
    ("broker metadata too long", b"\x0e\x02\x00\x00\x00\x90" + _entry(),
     "broker entry metadata of 144 bytes"),
    ("broker metadata junk", b"\x0e\x02\x00\x00\x00\x02\xff\xff" + _entry(),
     "BrokerEntryMetadata does not parse"),
    ("bad checksum", _entry()[:-1] + b"X", "checksum mismatch: stored CRC32C"),
    ("flipped bit in metadata", _entry()[:12] + bytes([_entry()[12] ^ 4]) + _entry()[13:],
     "checksum mismatch"),
    ("wrong magic", b"\x0e\x03" + _entry()[2:], "no 0x0E01 magic at byte 0"),
    ("truncated metadata", _rechecksum(_entry()[:14]), "truncated entry: metadata size"),
    ("metadata junk", _rechecksum(_entry()[:6] + b"\x00\x00\x00\x03\xff\xff\xff"),
     "MessageMetadata does not parse"),
    ("metadata without required fields", _rechecksum(
        _entry()[:6] + b"\x00\x00\x00\x03\x0a\x01p"), "MessageMetadata does not parse"),
    ("unknown compression", _with_metadata(_entry(), _set(compression=7)),
     "unknown compression type 7"),
    ("compressed payload corrupt", _rechecksum(_entry(3)[:-6] + b"\xff" * 6),
     "ZSTD payload does not decompress"),
    ("lz4 payload shorter than its size", _with_metadata(
        _entry(1), _set(uncompressed_size=500)), "LZ4 payload decompressed to 51 bytes, the "
     "metadata says 500"),
    ("zstd payload shorter than its size", _with_metadata(
        _entry(3), _set(uncompressed_size=500)), "ZSTD payload decompressed to 51 bytes"),
    ("zstd frame larger than its size", _with_metadata(
        _entry(3), _set(uncompressed_size=10)), "ZSTD frame declares 51 bytes, the metadata 10"),
    ("zlib payload longer than its size", _with_metadata(
        _entry(2), _set(uncompressed_size=5)), "ZLIB payload decompresses to more"),
    ("snappy size disagrees", _with_metadata(_entry(4), _set(uncompressed_size=7)),
     "SNAPPY block says"),
    ("absurd uncompressed size", _with_metadata(_entry(1), _set(uncompressed_size=2**31)),
     "beyond the limit"),
    ("truncated batch", _rechecksum(_entry()[:-3]), "truncated batch: message 2 of 3 has a "
     "payload of 7 bytes, only 4 follow"),
    ("batch cut before a message", _with_metadata(_entry(), _set(num_messages_in_batch=4)),
     "truncated batch: message 3 of 4 starts 0 bytes before the end"),
    ("batch longer than it says", _with_metadata(_entry(), _set(num_messages_in_batch=2)),
     "batch of 2 messages leaves 17 bytes unread"),
    ("batch of zero", _with_metadata(_entry(), _set(num_messages_in_batch=0)),
     "batch of 0 messages"),
    ("message metadata size runs past the end", _rechecksum(
        _entry()[:-17] + b"\x00\x00\xff\xff" + _entry()[-13:]), "has metadata of 65535 bytes"),
    ("message metadata without payload_size", _rechecksum(
        _entry()[:-17] + b"\x00\x00\x00\x04\x12\x02k2" + _entry()[-7:]),
     "SingleMessageMetadata of message 2 does not parse: required field payload_size"),
    ("message metadata junk", _rechecksum(_entry()[:-13] + b"\xff\xff\xff\xff" +
                                          _entry()[-9:]), "SingleMessageMetadata of message 2"),
]


class TestCorruption:
    """Every kind of damage is an error naming the entry, the byte and the problem."""

    @pytest.mark.parametrize(("name", "raw", "problem"), CORRUPTIONS,
                             ids=[c[0] for c in CORRUPTIONS])
    def test_named(self, name: str, raw: bytes, problem: str) -> None:
        with pytest.raises(FormatError) as info:
            decode_entry(raw, WHERE)
        assert str(info.value).startswith(WHERE + " at byte ")
        assert problem in str(info.value)

    @RELAXED
    @given(data=st.data(), codec=st.sampled_from(range(5)))
    def test_any_truncation_or_flip_is_an_error_or_a_faithful_decode(
            self, data: st.DataObject, codec: int) -> None:
        """Junk never crashes the decoder with anything but FormatError, and with the checksum
        on, a flipped byte is always caught."""
        raw = _entry(codec, 4)
        cut = data.draw(st.integers(0, len(raw) - 1))
        with pytest.raises(FormatError):
            decode_entry(raw[:cut], WHERE)
        pos = data.draw(st.integers(6, len(raw) - 1))
        flipped = raw[:pos] + bytes([raw[pos] ^ data.draw(st.integers(1, 255))]) + raw[pos + 1:]
        with pytest.raises(FormatError, match="checksum mismatch"):
            decode_entry(flipped, WHERE)
        # without the checksum, damage is still either an error or a decode, never a crash
        body = raw[6:]
        pos = data.draw(st.integers(0, len(body) - 1))
        junk = body[:pos] + bytes([body[pos] ^ 0xFF]) + body[pos + 1:]
        with contextlib.suppress(FormatError):
            decode_entry(junk, WHERE)
