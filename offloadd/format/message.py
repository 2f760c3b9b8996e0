"""Pulsar's message format: what a broker stores in one ledger entry (pure, no I/O).

All integers are big-endian. Field numbers are Pulsar's (``PulsarApi.proto``; ours, with only
the fields we use, is ``proto/pulsar_api.proto``). One entry, as a BookKeeper ledger holds it::

    [optional broker entry metadata]  uint16 0x0E02 | uint32 size | BrokerEntryMetadata
    [optional checksum]               uint16 0x0E01 | uint32 CRC32C
    uint32 metadata size | MessageMetadata | payload

The CRC32C (Castagnoli) covers every byte after it: metadata size, metadata and payload. An entry
without the 0x0E01 magic is an old one without checksum and starts at the metadata size.
``BrokerEntryMetadata`` (``broker_timestamp``, ``index``) is prepended by brokers running
broker-entry-metadata interceptors; the checksum does not cover it.

The payload is compressed as a whole by ``MessageMetadata.compression``
(:mod:`offloadd.format.compression`; ``uncompressed_size`` is its size before). When the
metadata has ``num_messages_in_batch`` the producer batched, and the decompressed payload is
``num_messages_in_batch`` times::

    uint32 size | SingleMessageMetadata | payload_size bytes of payload

with nothing after the last one. A batched message takes its key, properties, event time,
ordering key and sequence id from its ``SingleMessageMetadata`` (sequence id, when absent: the
entry's plus its index) and the rest (producer, publish time, schema version) from the entry.
An entry without ``num_messages_in_batch`` holds one message whose fields are the entry's own.

Two kinds of entry are returned undecoded, as one message holding the payload bytes as stored:

- *encrypted* (``encryption_keys`` non-empty): the payload is ciphertext of the compressed
  batch; without the key neither the compression nor the batch can be opened.
- *a chunk* of a large message (``num_chunks_from_msg`` > 1; ``uuid``, ``chunk_id``,
  ``total_chunk_msg_size``): the message was compressed whole and then cut, so one chunk does
  not decompress alone; every chunk is its own entry, never batched.

Bad bytes never pass silently: each problem below is a :class:`~offloadd.errors.FormatError`
naming where (the caller's ``where``, e.g. topic and position) and the byte offset —

=========================  ====================================================================
problem                    detected by
=========================  ====================================================================
truncated entry            fewer bytes than a header, size or declared length needs
bad checksum               stored CRC32C differs from the computed one
bad magic                  no 0x0E01: read as an entry without checksum, whose metadata size
                           then does not fit (or whose metadata does not parse)
bad metadata               MessageMetadata / SingleMessageMetadata / BrokerEntryMetadata do not
                           parse or lack required fields
unknown compression        a codec id other than 0..4
bad compressed payload     does not decompress to exactly ``uncompressed_size`` bytes, or that
                           size is beyond the limit
truncated batch            a message's size or payload runs past the payload's end
short or long batch        fewer messages than ``num_messages_in_batch``, or bytes left after
=========================  ====================================================================
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import crc32c
from google.protobuf.message import DecodeError
from google.protobuf.message import Message as ProtoMessage

from offloadd._proto import pulsar_api_pb2 as pb
from offloadd.errors import FormatError
from offloadd.format.compression import DEFAULT_LIMIT, CodecError, Compression, decompress

__all__ = [
    "BROKER_ENTRY_METADATA_MAGIC",
    "CHECKSUM_MAGIC",
    "BrokerEntryMeta",
    "ChunkInfo",
    "DecodedEntry",
    "Message",
    "decode_entry",
    "encode_batch",
    "encode_entry",
]

CHECKSUM_MAGIC = 0x0E01
BROKER_ENTRY_METADATA_MAGIC = 0x0E02

Buffer = bytes | bytearray | memoryview

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_CHECKSUM_HEAD = struct.Struct(">HI")

_P = TypeVar("_P", bound=ProtoMessage)
_SMM = pb.SingleMessageMetadata
_MM = pb.MessageMetadata
_BEM = pb.BrokerEntryMetadata


@dataclass(frozen=True, slots=True)
class BrokerEntryMeta:
    broker_timestamp: int | None  # ms since the epoch
    index: int | None  # the broker's offset of the entry's last message


@dataclass(frozen=True, slots=True)
class ChunkInfo:
    uuid: str
    chunk_id: int  # 0-based
    num_chunks: int
    total_size: int


@dataclass(frozen=True, slots=True)
class Message:
    """One message (a row): the entry's fields resolved for this message."""

    batch_index: int  # -1: the entry is not a batch (Pulsar's MessageId says the same)
    payload: bytes | None  # None: a null value (tombstone)
    key: str | None
    ordering_key: bytes | None
    properties: tuple[tuple[str, str], ...]
    event_time: int | None  # ms, None when the producer set none
    sequence_id: int
    compacted_out: bool = False


@dataclass(frozen=True, slots=True)
class DecodedEntry:
    producer_name: str
    sequence_id: int
    publish_time: int  # ms since the epoch
    compression: int  # the codec of the stored payload (Compression)
    num_messages: int  # messages the entry stands for (num_messages_in_batch, else 1)
    messages: tuple[Message, ...]
    broker: BrokerEntryMeta | None = None
    schema_version: bytes | None = None
    has_checksum: bool = True
    encrypted: bool = False  # messages[0].payload is ciphertext, batch unopened
    chunk: ChunkInfo | None = None  # messages[0].payload is this chunk as stored
    # MessageMetadata.marker_type (20): a broker-written marker (replicated subscriptions 10..13,
    # transaction commit 21 / abort 22), never delivered to consumers; None for a message
    marker_type: int | None = None
    # (txnid_most_bits 23, txnid_least_bits 22): the transaction the entry belongs to
    txn: tuple[int, int] | None = None


def decode_entry(buf: Buffer, where: str, *, limit: int = DEFAULT_LIMIT) -> DecodedEntry:
    """Decode one ledger entry; ``where`` names it in errors (e.g. ``"<topic> 12:34"``).

    ``limit`` bounds the uncompressed payload size a corrupt header may claim.
    """
    mv = memoryview(buf)
    n = len(mv)
    off = 0
    broker = None
    if n >= 2 and _U16.unpack_from(mv, 0)[0] == BROKER_ENTRY_METADATA_MAGIC:
        if n < 6:
            raise FormatError(where, 2, f"truncated entry: broker entry metadata magic, then "
                              f"{n - 2} bytes where its 4-byte size belongs")
        (size,) = _U32.unpack_from(mv, 2)
        if size > n - 6:
            raise FormatError(where, 2, f"truncated entry: broker entry metadata of {size} "
                              f"bytes, only {n - 6} follow")
        bem = _parse(_BEM, mv[6:6 + size], where, 6, "BrokerEntryMetadata")
        broker = BrokerEntryMeta(bem.broker_timestamp if bem.HasField("broker_timestamp")
                                 else None, bem.index if bem.HasField("index") else None)
        off = 6 + size
    has_checksum = n - off >= 2 and _U16.unpack_from(mv, off)[0] == CHECKSUM_MAGIC
    if has_checksum:
        if n - off < 6:
            raise FormatError(where, off + 2, f"truncated entry: checksum magic, then "
                              f"{n - off - 2} bytes where the 4-byte CRC32C belongs")
        (stored,) = _U32.unpack_from(mv, off + 2)
        off += 6
        computed = crc32c.crc32c(mv[off:])
        if computed != stored:
            raise FormatError(where, off - 4, f"checksum mismatch: stored CRC32C {stored:08x}, "
                              f"computed {computed:08x} over the {n - off} bytes after it")
    hint = "" if has_checksum else (f" (no 0x{CHECKSUM_MAGIC:04X} magic at byte {off}, so "
                                    "it was read as an entry without checksum)")
    if n - off < 4:
        raise FormatError(where, off, f"truncated entry: {n - off} bytes where the 4-byte "
                          f"metadata size belongs{hint}")
    (md_size,) = _U32.unpack_from(mv, off)
    off += 4
    if md_size > n - off:
        raise FormatError(where, off - 4, f"truncated entry: metadata size {md_size}, only "
                          f"{n - off} bytes follow{hint}")
    md = _parse(_MM, mv[off:off + md_size], where, off, "MessageMetadata", hint)
    off += md_size
    payload = mv[off:]
    codec = md.compression
    chunk = None
    if md.num_chunks_from_msg > 1:
        chunk = ChunkInfo(md.uuid, md.chunk_id, md.num_chunks_from_msg, md.total_chunk_msg_size)
    encrypted = len(md.encryption_keys) > 0
    if codec not in _KNOWN_CODECS and not encrypted and chunk is None:
        raise FormatError(where, off - md_size, f"unknown compression type {codec} (Pulsar "
                          "knows 0..4: NONE, LZ4, ZLIB, ZSTD, SNAPPY)")
    batched = md.HasField("num_messages_in_batch")
    count = md.num_messages_in_batch if batched else 1
    common = _Entry(md, broker, has_checksum, encrypted, chunk, count)
    if encrypted or chunk is not None:
        return common.build((_single(md, bytes(payload)),))
    if codec != Compression.NONE:
        try:
            data: Buffer = decompress(codec, payload, md.uncompressed_size, limit)
        except CodecError as exc:
            raise FormatError(where, off, str(exc)) from None
        base = 0  # offsets inside the decompressed payload from here on
        inside = " of the decompressed payload"
    else:
        data, base, inside = payload, off, ""
    if not batched:
        return common.build((_single(md, bytes(data)),))
    return common.build(_batch(md, memoryview(data), count, where, base, inside))


_KNOWN_CODECS = frozenset(int(c) for c in Compression)


class _Entry:
    __slots__ = ("broker", "chunk", "count", "encrypted", "has_checksum", "md")

    def __init__(self, md: pb.MessageMetadata, broker: BrokerEntryMeta | None,
                 has_checksum: bool, encrypted: bool, chunk: ChunkInfo | None,
                 count: int) -> None:
        self.md, self.broker, self.has_checksum = md, broker, has_checksum
        self.encrypted, self.chunk, self.count = encrypted, chunk, count

    def build(self, messages: tuple[Message, ...]) -> DecodedEntry:
        md = self.md
        return DecodedEntry(
            md.producer_name, md.sequence_id, md.publish_time, md.compression, self.count,
            messages, self.broker,
            md.schema_version if md.HasField("schema_version") else None,
            self.has_checksum, self.encrypted, self.chunk,
            md.marker_type if md.HasField("marker_type") else None,
            (md.txnid_most_bits, md.txnid_least_bits)
            if md.HasField("txnid_most_bits") or md.HasField("txnid_least_bits") else None)


def _single(md: pb.MessageMetadata, payload: bytes) -> Message:
    return Message(
        -1,
        None if md.null_value else payload,
        md.partition_key if md.HasField("partition_key") and not md.null_partition_key
        else None,
        md.ordering_key if md.HasField("ordering_key") else None,
        tuple((kv.key, kv.value) for kv in md.properties),
        md.event_time or None,
        md.sequence_id,
    )


def _batch(md: pb.MessageMetadata, data: memoryview, count: int, where: str, base: int,
           inside: str) -> tuple[Message, ...]:
    if count < 1:
        raise FormatError(where, base, f"batch of {count} messages (num_messages_in_batch "
                          "must be at least 1)")
    out: list[Message] = []
    n = len(data)
    off = 0
    entry_event = md.event_time or None
    seq0 = md.sequence_id
    unpack = _U32.unpack_from
    from_string = _SMM.FromString
    for i in range(count):
        if n - off < 4:
            raise FormatError(where, base + off, f"truncated batch: message {i} of {count} "
                              f"starts {n - off} bytes before the end{inside}")
        (size,) = unpack(data, off)
        off += 4
        if size > n - off:
            raise FormatError(where, base + off - 4, f"truncated batch: message {i} of {count} "
                              f"has metadata of {size} bytes, only {n - off} follow{inside}")
        try:
            smm = from_string(data[off:off + size])  # type: ignore[arg-type]  # any buffer
        except DecodeError as exc:
            raise FormatError(where, base + off, f"SingleMessageMetadata of message {i} does "
                              f"not parse{inside}: {exc}") from None
        if not smm.HasField("payload_size"):
            raise FormatError(where, base + off, f"SingleMessageMetadata of message {i} does "
                              f"not parse{inside}: required field payload_size missing")
        off += size
        psize = smm.payload_size
        if psize < 0 or psize > n - off:
            raise FormatError(where, base + off, f"truncated batch: message {i} of {count} has "
                              f"a payload of {psize} bytes, only {n - off} follow{inside}")
        payload = None if smm.null_value else bytes(data[off:off + psize])
        off += psize
        out.append(Message(
            i, payload,
            smm.partition_key if smm.HasField("partition_key") and not smm.null_partition_key
            else None,
            smm.ordering_key if smm.HasField("ordering_key") else None,
            tuple((kv.key, kv.value) for kv in smm.properties) if smm.properties else (),
            smm.event_time or entry_event,
            smm.sequence_id if smm.HasField("sequence_id") else seq0 + i,
            smm.compacted_out,
        ))
    if off != n:
        raise FormatError(where, base + off, f"batch of {count} messages leaves {n - off} "
                          f"bytes unread{inside}: num_messages_in_batch is too small or the "
                          "payload is corrupt")
    return tuple(out)


def _parse(cls: type[_P], view: memoryview, where: str, offset: int, what: str,
           hint: str = "") -> _P:
    try:
        msg = cls.FromString(view)  # type: ignore[arg-type]  # the runtime takes any buffer
    except DecodeError as exc:
        raise FormatError(where, offset, f"{what} does not parse: {exc}{hint}") from None
    if not msg.IsInitialized():  # the runtime parses proto2 messages without checking
        raise FormatError(where, offset, f"{what} does not parse: required field(s) "
                          f"{', '.join(msg.FindInitializationErrors())} missing{hint}")  # type: ignore[attr-defined]
    return msg


# -- encoding (the embedded writer and the tests) ------------------------------------------------


def encode_batch(messages: Sequence[tuple[bytes | pb.SingleMessageMetadata, Buffer]]) -> bytes:
    """A batch payload (uncompressed) from ``(SingleMessageMetadata, payload)`` pairs; the
    metadata may be given serialized."""
    parts: list[Buffer] = []
    for smm, payload in messages:
        raw = smm if isinstance(smm, bytes) else smm.SerializeToString()
        parts += (_U32.pack(len(raw)), raw, payload)
    return b"".join(parts)


def encode_entry(metadata: bytes | pb.MessageMetadata, payload: Buffer, *,
                 checksum: bool = True,
                 broker: bytes | pb.BrokerEntryMetadata | None = None) -> bytes:
    """One entry as a broker stores it; ``payload`` already compressed as ``metadata`` says."""
    md = metadata if isinstance(metadata, bytes) else metadata.SerializeToString()
    body = b"".join((_U32.pack(len(md)), md, payload))
    head = b""
    if broker is not None:
        raw = broker if isinstance(broker, bytes) else broker.SerializeToString()
        head = _U16.pack(BROKER_ENTRY_METADATA_MAGIC) + _U32.pack(len(raw)) + raw
    if checksum:
        head += _CHECKSUM_HEAD.pack(CHECKSUM_MAGIC, crc32c.crc32c(body))
    return head + body
