"""Ledger-based offload objects (PIP-17): ``<uuid>-ledger-<id>`` + ``<uuid>-ledger-<id>-index``.

One data object holds one whole ledger (entries 0..lastEntryId). Data object: ledger-based
blocks (magic 0xFBDBABCB, no ledger id in the header; see ``block.py``) laid end to end, each one
S3 multipart part. Block lengths follow ``layout.py`` with ``pad_to="max"``: every block but the
last is exactly ``max_block_size`` long (or grown for an oversize entry) and ends with at least
4 padding bytes; the last block is sized exactly, without padding, as Pulsar's writer sizes it.

Index object, all integers big-endian::

    int32   magic 0xDE47DE47
    int32   index length (the whole index object, header included)
    int64   data object length (exactly the data object's length)
    int64   data block header length = 128
    int32   block count
    int32   metadata length
    bytes   metadata: BookKeeper ``LedgerMetadataFormat`` protobuf (required: quorumSize,
            ensembleSize, length, state; Pulsar reads lastEntryId as the last readable entry)
    count × (int64 firstEntryId, int32 partId, int64 offset)

``offset`` is where the block's header starts in the data object; part ids start at 1.
Nothing follows the block table.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Literal

from google.protobuf.message import DecodeError

from offloadd._proto.bookkeeper_pb2 import LedgerMetadataFormat
from offloadd.errors import FormatError, NotFound
from offloadd.format import _index
from offloadd.format._index import IndexEntry
from offloadd.format.block import HEADER_LEN, MIN_PADDING, pack_ledger_header
from offloadd.format.checksum import RECORD_KEY, RECORD_VALUE
from offloadd.format.layout import Block, ObjectPair, make_block, plan_blocks
from offloadd.model.frames import EntryRun

Buffer = bytes | bytearray | memoryview

LEDGER_INDEX_MAGIC = 0xDE47DE47

_HEADER = struct.Struct(">Iiqqii")

_REQUIRED = ("quorumSize", "ensembleSize", "length", "state")

DigestType = Literal["CRC32", "HMAC", "CRC32C", "DUMMY"]


@dataclass(frozen=True)
class LedgerIndex:
    """A decoded ledger-based index; ``ledger_metadata`` is the raw BookKeeper protobuf."""

    data_object_length: int
    data_header_length: int
    ledger_metadata: bytes
    blocks: tuple[IndexEntry, ...]

    @cached_property
    def metadata(self) -> LedgerMetadataFormat:
        return LedgerMetadataFormat.FromString(self.ledger_metadata)

    @cached_property
    def records_checksums(self) -> bool:
        """The ledger metadata records that every block carries a CRC32C
        (``format/checksum.py``)."""
        return any(kv.key == RECORD_KEY and kv.value == RECORD_VALUE.encode()
                   for kv in self.metadata.customMetadata)

    @property
    def last_entry_id(self) -> int:
        """The last readable entry (protobuf lastEntryId; -1 when absent)."""
        meta = self.metadata
        return meta.lastEntryId if meta.HasField("lastEntryId") else -1

    @cached_property
    def _firsts(self) -> tuple[int, ...]:
        return tuple(b.first_entry_id for b in self.blocks)

    @cached_property
    def _offsets(self) -> tuple[int, ...]:
        return tuple(b.offset for b in self.blocks)

    def locate(self, entry_id: int) -> IndexEntry:
        """The block holding ``entry_id``; :class:`NotFound` outside 0..last_entry_id."""
        if not self.blocks or not self.blocks[0].first_entry_id <= entry_id <= self.last_entry_id:
            raise NotFound(f"entry {entry_id} is not in this object")
        return _index.locate(self.blocks, self._firsts, entry_id)

    def block_end(self, block: IndexEntry) -> int:
        """Where ``block`` ends in the data object: the next block's offset or the data end."""
        return _index.block_end(self._offsets, self.data_object_length, block.offset)


def encode_ledger_index(
    data_object_length: int, ledger_metadata: bytes, blocks: Sequence[IndexEntry]
) -> bytes:
    """The index object's bytes for a data object of ``data_object_length`` bytes."""
    rows = _index.pack_rows(blocks)
    total = _HEADER.size + len(ledger_metadata) + len(rows)
    header = _HEADER.pack(
        LEDGER_INDEX_MAGIC, total, data_object_length, HEADER_LEN, len(blocks), len(ledger_metadata)
    )
    return b"".join((header, ledger_metadata, rows))


def decode_ledger_index(buf: Buffer, obj: str) -> LedgerIndex:
    """Parse and validate a ledger-based index; :class:`FormatError` names ``obj`` and offset."""
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    if len(view) < _HEADER.size:
        raise FormatError(obj, 0, f"truncated index header: {len(view)} of {_HEADER.size} bytes")
    magic, total, data_length, header_length, count, meta_len = _HEADER.unpack_from(view, 0)
    if magic != LEDGER_INDEX_MAGIC:
        raise FormatError(
            obj, 0, f"bad index magic 0x{magic:08X}, expected 0x{LEDGER_INDEX_MAGIC:08X}"
        )
    _index.check_lengths(obj, len(view), total, _HEADER.size, data_length, header_length)
    if count < 1:
        raise FormatError(obj, 24, f"index lists {count} blocks")
    if meta_len < 0:
        raise FormatError(obj, 28, f"negative metadata length {meta_len}")
    rows_at = _HEADER.size + meta_len
    end = rows_at + count * _index.ROW.size
    if end > total:
        raise FormatError(
            obj, 24, f"truncated index: {count} blocks and {meta_len} metadata bytes need "
            f"{end} bytes, the index has {total}"
        )
    if end < total:
        raise FormatError(obj, end, f"{total - end} trailing bytes after the block table")
    raw = bytes(view[_HEADER.size : rows_at])
    meta = LedgerMetadataFormat()
    try:
        meta.ParseFromString(raw)
    except DecodeError as e:
        raise FormatError(obj, _HEADER.size, f"LedgerMetadataFormat does not parse: {e}") from None
    if not meta.IsInitialized():
        missing = ", ".join(f for f in _REQUIRED if not meta.HasField(f))
        raise FormatError(obj, _HEADER.size, f"LedgerMetadataFormat lacks required {missing}")
    blocks = _index.unpack_rows(view, rows_at, count, data_length, obj)
    last = meta.lastEntryId if meta.HasField("lastEntryId") else -1
    if blocks[-1].first_entry_id > last:
        raise FormatError(
            obj, _HEADER.size, f"lastEntryId {last} but a block starts at entry "
            f"{blocks[-1].first_entry_id}"
        )
    return LedgerIndex(data_length, header_length, raw, blocks)


def build_ledger_metadata(
    *,
    last_entry_id: int,
    length: int,
    ensemble_size: int = 1,
    write_quorum_size: int | None = None,
    ack_quorum_size: int | None = None,
    ensemble: Sequence[str] | None = None,
    digest_type: DigestType = "CRC32C",
    ctime_ms: int | None = None,
    custom_metadata: Mapping[str, bytes | str] | None = None,
) -> bytes:
    """A CLOSED ledger's ``LedgerMetadataFormat`` bytes, as a ledger-based index embeds them.

    ``length`` is the ledger's payload bytes; ``write_quorum_size`` (protobuf quorumSize)
    defaults to ``ensemble_size`` and ``ack_quorum_size`` to the write quorum. ``ensemble`` (the
    bookies of the single segment, starting at entry 0) defaults to placeholder ids, because
    Pulsar rebuilds a BookKeeper ``LedgerMetadata`` from the index and that wants an ensemble of
    ``ensemble_size`` members. ``custom_metadata`` keeps its iteration order.
    """
    write_quorum = ensemble_size if write_quorum_size is None else write_quorum_size
    ack_quorum = write_quorum if ack_quorum_size is None else ack_quorum_size
    if not 1 <= ack_quorum <= write_quorum <= ensemble_size:
        raise ValueError(
            f"need 1 <= ack quorum ({ack_quorum}) <= write quorum ({write_quorum}) "
            f"<= ensemble size ({ensemble_size})"
        )
    members = (
        list(ensemble) if ensemble is not None
        else [f"offloadd-{i}:3181" for i in range(ensemble_size)]
    )
    if len(members) != ensemble_size:
        raise ValueError(f"ensemble has {len(members)} members, ensemble size is {ensemble_size}")
    meta = LedgerMetadataFormat(
        quorumSize=write_quorum,
        ensembleSize=ensemble_size,
        length=length,
        lastEntryId=last_entry_id,
        state=LedgerMetadataFormat.CLOSED,
        segment=[LedgerMetadataFormat.Segment(ensembleMember=members, firstEntryId=0)],
        digestType=digest_type,
        ackQuorumSize=ack_quorum,
    )
    if ctime_ms is not None:
        meta.ctime = ctime_ms
    for key, value in (custom_metadata or {}).items():
        meta.customMetadata.add(
            key=key, value=value.encode() if isinstance(value, str) else value
        )
    return meta.SerializeToString()


LedgerObject = ObjectPair  # a whole ledger-based object pair


def build_ledger_object(
    run: EntryRun,
    *,
    max_block_size: int,
    ledger_metadata: bytes,
    max_entries: int | None = None,
) -> LedgerObject:
    """The ledger-based object pair for one whole ledger held by ``run`` (entries 0..last).

    ``ledger_metadata`` (see :func:`build_ledger_metadata`) must name the run's last entry.
    """
    if run.count <= 0:
        raise ValueError(f"ledger {run.ledger_id}: a ledger-based object needs at least one entry")
    if run.first_entry_id != 0:
        raise ValueError(
            f"ledger {run.ledger_id}: a ledger-based object holds the whole ledger from entry 0, "
            f"the run starts at {run.first_entry_id}"
        )
    meta = LedgerMetadataFormat.FromString(ledger_metadata)
    if meta.lastEntryId != run.last_entry_id:
        raise ValueError(
            f"ledger {run.ledger_id}: metadata lastEntryId {meta.lastEntryId} but the run ends at "
            f"entry {run.last_entry_id}"
        )
    plans = plan_blocks(
        run.offsets,
        run.first_entry_id,
        run.ledger_id,
        max_block_size=max_block_size,
        pad_to="max",
        max_entries=max_entries,
    )
    blocks: list[Block] = []
    rows: list[IndexEntry] = []
    offset = 0
    for number, plan in enumerate(plans, start=1):
        header = pack_ledger_header(plan.block_len, plan.first_entry_id)
        blocks.append(make_block(plan, number, offset, header, run.data))
        rows.append(IndexEntry(plan.first_entry_id, number, offset))
        offset += plan.block_len
    return LedgerObject(blocks, encode_ledger_index(offset, ledger_metadata, rows), offset)


class LedgerObjectBuilder:
    """Builds one ledger-based data object run by run (bounded memory for big ledgers).

    Runs must cover the ledger from entry 0 in order; :meth:`add_run` returns the run's blocks
    (payloads are views of ``run.data``). Every block is padded to ``max_block_size`` except the
    very last one of the object, which is sized exactly (Pulsar's rule): pass ``last=True`` with
    the final run. :meth:`finish` returns the index.
    """

    def __init__(self, *, ledger_id: int, max_block_size: int) -> None:
        self.ledger_id = ledger_id
        self._max = max_block_size
        self._rows: list[IndexEntry] = []
        self._next_entry = 0
        self._done = False
        self.length = 0

    def add_run(self, run: EntryRun, *, last: bool) -> list[Block]:
        if self._done:
            raise ValueError(f"ledger {self.ledger_id}: object already has its last run")
        if run.ledger_id != self.ledger_id or run.first_entry_id != self._next_entry:
            raise ValueError(f"ledger {self.ledger_id}: run {run.ledger_id}:{run.first_entry_id} "
                             f"does not continue at entry {self._next_entry}")
        plans = plan_blocks(run.offsets, run.first_entry_id, run.ledger_id,
                            max_block_size=self._max, pad_to="max")
        if plans and not last:
            tail = plans[-1]
            plans[-1] = replace(tail, block_len=max(tail.block_len, self._max,
                                                    HEADER_LEN + tail.payload_len + MIN_PADDING))
        blocks: list[Block] = []
        for plan in plans:
            number = len(self._rows) + 1
            header = pack_ledger_header(plan.block_len, plan.first_entry_id)
            blocks.append(make_block(plan, number, self.length, header, run.data))
            self._rows.append(IndexEntry(plan.first_entry_id, number, self.length))
            self.length += plan.block_len
        self._next_entry = run.last_entry_id + 1
        self._done = last
        return blocks

    def finish(self, ledger_metadata: bytes) -> bytes:
        if not self._done or not self._rows:
            raise ValueError(f"ledger {self.ledger_id}: the object has no last run yet")
        meta = LedgerMetadataFormat.FromString(ledger_metadata)
        if meta.lastEntryId != self._next_entry - 1:
            raise ValueError(f"ledger {self.ledger_id}: metadata lastEntryId {meta.lastEntryId} "
                             f"but the object ends at entry {self._next_entry - 1}")
        return encode_ledger_index(self.length, ledger_metadata, self._rows)
