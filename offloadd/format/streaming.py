"""Streaming offload objects (PIP-76): one data object ``<uuid>`` + one index ``<uuid>-index``.

Data object: streaming blocks (magic 0x26A66D32, ledger id in the header; see ``block.py``)
laid end to end. A block never mixes ledgers; a segment may span several ledgers. Block lengths
follow ``layout.py`` with ``pad_to="min"``: at least ``min_block_size``, and every block — the
last one too — ends with at least 4 padding bytes.

Index object, all integers big-endian::

    header (24 bytes)
      int32   magic 0x3D1FB0BC
      int32   total index length (header included; equals the object's length)
      int64   data object length (exactly the data object's length)
      int64   data block header length = 128
    then one section per ledger, in ledger order, until the end (no trailing bytes):
      int64   ledgerId
      int32   block count
      int32   metadata length
      bytes   metadata: managed-ledger ``ManagedLedgerInfo.LedgerInfo`` protobuf
              (ledgerId, entries, size, timestamp)
      count × (int64 firstEntryId, int32 partId, int64 offset)

``offset`` is where the block's header starts in the data object; part ids count blocks across
the whole object from 1. ``entries`` in the LedgerInfo is the last entry id this object holds for
that ledger, plus one (Pulsar's reader treats ``entries - 1`` as the last readable entry and waits
forever for anything beyond); ``size`` is the sum of those entries' payload bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from google.protobuf.message import DecodeError

from offloadd._proto.mldataformats_pb2 import ManagedLedgerInfo
from offloadd.errors import FormatError, NotFound
from offloadd.format import _index
from offloadd.format._index import IndexEntry
from offloadd.format.block import HEADER_LEN, pack_streaming_header
from offloadd.format.checksum import RECORD_DRIVER, RECORD_KEY, RECORD_VALUE
from offloadd.format.layout import Block, ObjectPair, make_block, plan_blocks
from offloadd.model.frames import FRAME_OVERHEAD, EntryRun

Buffer = bytes | bytearray | memoryview

STREAMING_INDEX_MAGIC = 0x3D1FB0BC

_HEADER = struct.Struct(">Iiqq")
_SECTION = struct.Struct(">qii")


@dataclass(frozen=True)
class LedgerSection:
    """The part of a streaming index describing one ledger; ``ledger_info`` is the raw protobuf."""

    ledger_id: int
    entries: int
    size: int
    timestamp: int
    blocks: tuple[IndexEntry, ...]
    ledger_info: bytes

    @property
    def last_entry_id(self) -> int:
        return self.entries - 1

    @cached_property
    def records_checksums(self) -> bool:
        """The LedgerInfo records that every block carries a CRC32C (``format/checksum.py``)."""
        info = ManagedLedgerInfo.LedgerInfo.FromString(self.ledger_info)
        if not info.HasField("offloadContext"):
            return False
        driver = info.offloadContext.driverMetadata
        return driver.name == RECORD_DRIVER and any(
            kv.key == RECORD_KEY and kv.value == RECORD_VALUE for kv in driver.properties)

    @cached_property
    def _firsts(self) -> tuple[int, ...]:
        return tuple(b.first_entry_id for b in self.blocks)

    def locate(self, entry_id: int) -> IndexEntry:
        """The block holding ``entry_id``; :class:`NotFound` outside this section's entries."""
        if not self.blocks or not self.blocks[0].first_entry_id <= entry_id < self.entries:
            raise NotFound(f"entry {self.ledger_id}:{entry_id} is not in this object")
        return _index.locate(self.blocks, self._firsts, entry_id)


@dataclass(frozen=True)
class StreamingIndex:
    """A decoded streaming index."""

    data_object_length: int
    data_header_length: int
    sections: tuple[LedgerSection, ...]

    @cached_property
    def _by_ledger(self) -> dict[int, LedgerSection]:
        return {s.ledger_id: s for s in self.sections}

    @cached_property
    def _offsets(self) -> tuple[int, ...]:
        return tuple(sorted(b.offset for s in self.sections for b in s.blocks))

    @property
    def records_checksums(self) -> bool:
        """The index records that every block of the object carries a CRC32C (any section
        saying so is enough: never a reason to check less)."""
        return any(s.records_checksums for s in self.sections)

    def section(self, ledger_id: int) -> LedgerSection:
        """The section of ``ledger_id``; :class:`NotFound` if the object holds none of it."""
        try:
            return self._by_ledger[ledger_id]
        except KeyError:
            raise NotFound(f"ledger {ledger_id} is not in this object") from None

    def locate(self, ledger_id: int, entry_id: int) -> IndexEntry:
        """The block holding ``ledger_id:entry_id``; :class:`NotFound` if the object lacks it."""
        return self.section(ledger_id).locate(entry_id)

    def block_end(self, block: IndexEntry) -> int:
        """Where ``block`` ends in the data object: the next block's offset or the data end."""
        return _index.block_end(self._offsets, self.data_object_length, block.offset)


@dataclass(frozen=True)
class SectionInput:
    """What :func:`encode_streaming_index` needs for one ledger."""

    ledger_id: int
    entries: int
    size: int
    timestamp: int
    blocks: Sequence[IndexEntry]


def encode_streaming_index(data_object_length: int, sections: Sequence[SectionInput], *,
                           checksummed: bool = False) -> bytes:
    """The index object's bytes for a data object of ``data_object_length`` bytes;
    ``checksummed``: record in the first section that every block carries a CRC32C (once is
    enough: it is read from any section, and the index is one object)."""
    pieces: list[bytes] = [b""]  # the header, once the total length is known
    for n, s in enumerate(sections):
        msg = ManagedLedgerInfo.LedgerInfo(
            ledgerId=s.ledger_id, entries=s.entries, size=s.size, timestamp=s.timestamp
        )
        if checksummed and n == 0:
            driver = msg.offloadContext.driverMetadata
            driver.name = RECORD_DRIVER
            driver.properties.add(key=RECORD_KEY, value=RECORD_VALUE)
        info = msg.SerializeToString()
        pieces.append(_SECTION.pack(s.ledger_id, len(s.blocks), len(info)))
        pieces.append(info)
        pieces.append(_index.pack_rows(s.blocks))
    total = _HEADER.size + sum(len(p) for p in pieces)
    pieces[0] = _HEADER.pack(STREAMING_INDEX_MAGIC, total, data_object_length, HEADER_LEN)
    return b"".join(pieces)


def decode_streaming_index(buf: Buffer, obj: str) -> StreamingIndex:
    """Parse and validate a streaming index; :class:`FormatError` names ``obj`` and the offset."""
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    if len(view) < _HEADER.size:
        raise FormatError(obj, 0, f"truncated index header: {len(view)} of {_HEADER.size} bytes")
    magic, total, data_length, header_length = _HEADER.unpack_from(view, 0)
    if magic != STREAMING_INDEX_MAGIC:
        raise FormatError(
            obj, 0, f"bad index magic 0x{magic:08X}, expected 0x{STREAMING_INDEX_MAGIC:08X}"
        )
    _index.check_lengths(obj, len(view), total, _HEADER.size, data_length, header_length)
    sections: list[LedgerSection] = []
    pos = _HEADER.size
    prev_ledger = -1
    while pos < total:
        if total - pos < _SECTION.size:
            raise FormatError(obj, pos, "truncated ledger section header")
        ledger_id, count, meta_len = _SECTION.unpack_from(view, pos)
        if ledger_id <= prev_ledger:
            raise FormatError(
                obj, pos, f"ledger {ledger_id} follows ledger {prev_ledger} (sections must be in "
                "ledger order, one per ledger)"
            )
        if count < 1:
            raise FormatError(obj, pos + 8, f"ledger {ledger_id} lists {count} blocks")
        if meta_len < 0:
            raise FormatError(obj, pos + 12, f"negative metadata length {meta_len}")
        meta_at = pos + _SECTION.size
        rows_at = meta_at + meta_len
        end = rows_at + count * _index.ROW.size
        if end > total:
            raise FormatError(
                obj, pos, f"truncated section of ledger {ledger_id}: needs {end - pos} bytes, "
                f"{total - pos} left"
            )
        raw_info = bytes(view[meta_at:rows_at])
        info = _parse_ledger_info(raw_info, obj, meta_at)
        if info.ledgerId != ledger_id:
            raise FormatError(
                obj, meta_at, f"LedgerInfo names ledger {info.ledgerId} in the section of "
                f"ledger {ledger_id}"
            )
        blocks = _index.unpack_rows(view, rows_at, count, data_length, obj)
        if blocks[-1].first_entry_id >= info.entries:
            raise FormatError(
                obj, meta_at, f"ledger {ledger_id} has {info.entries} entries but a block "
                f"starts at entry {blocks[-1].first_entry_id}"
            )
        sections.append(
            LedgerSection(ledger_id, info.entries, info.size, info.timestamp, blocks, raw_info)
        )
        prev_ledger = ledger_id
        pos = end
    return StreamingIndex(data_length, header_length, tuple(sections))


def _parse_ledger_info(raw: bytes, obj: str, at: int) -> ManagedLedgerInfo.LedgerInfo:
    info = ManagedLedgerInfo.LedgerInfo()
    try:
        info.ParseFromString(raw)
    except DecodeError as e:
        raise FormatError(obj, at, f"LedgerInfo protobuf does not parse: {e}") from None
    if not info.IsInitialized():
        raise FormatError(obj, at, "LedgerInfo protobuf lacks required field ledgerId")
    return info


StreamingObject = ObjectPair  # a whole streaming object pair


@dataclass
class _Section:
    ledger_id: int
    last_entry_id: int
    size: int
    blocks: list[IndexEntry] = field(default_factory=list)


class StreamingObjectBuilder:
    """Builds one streaming data object run by run, then its index.

    :meth:`add_run` plans the run's blocks and returns them as :class:`Block` s ready to upload
    (payloads are views of ``run.data``, nothing is copied); runs must come in log order:
    a later ledger, or the same ledger continuing at the next entry. Every run starts a new block.
    :meth:`finish` returns the index bytes for everything added.
    """

    def __init__(
        self, *, max_block_size: int, min_block_size: int, max_entries: int | None = None
    ) -> None:
        # Fail here, not on the first run: plan an empty run with these settings.
        plan_blocks(
            [0], 0, 0, max_block_size=max_block_size, min_block_size=min_block_size,
            pad_to="min", max_entries=max_entries,
        )
        self._max_block_size = max_block_size
        self._min_block_size = min_block_size
        self._max_entries = max_entries
        self._sections: list[_Section] = []
        self._length = 0
        self._blocks = 0
        self._finished = False

    @property
    def length(self) -> int:
        """Bytes of data object planned so far."""
        return self._length

    @property
    def block_count(self) -> int:
        return self._blocks

    def add_run(self, run: EntryRun) -> list[Block]:
        if self._finished:
            raise ValueError("add_run after finish")
        if run.count <= 0:
            return []
        offsets = run.offsets
        if offsets[-1] > len(run.data):
            raise ValueError(f"run offsets end at {offsets[-1]} past its {len(run.data)} bytes")
        plans = plan_blocks(
            offsets,
            run.first_entry_id,
            run.ledger_id,
            max_block_size=self._max_block_size,
            min_block_size=self._min_block_size,
            pad_to="min",
            max_entries=self._max_entries,
        )
        section = self._section_for(run)
        blocks: list[Block] = []
        number, offset = self._blocks, self._length
        for plan in plans:
            number += 1
            header = pack_streaming_header(plan.block_len, plan.first_entry_id, run.ledger_id)
            blocks.append(make_block(plan, number, offset, header, run.data))
            section.blocks.append(IndexEntry(plan.first_entry_id, number, offset))
            offset += plan.block_len
        self._blocks, self._length = number, offset
        section.last_entry_id = run.last_entry_id
        section.size += offsets[-1] - offsets[0] - FRAME_OVERHEAD * run.count
        return blocks

    def _section_for(self, run: EntryRun) -> _Section:
        last = self._sections[-1] if self._sections else None
        if last is not None and run.ledger_id == last.ledger_id:
            if run.first_entry_id != last.last_entry_id + 1:
                raise ValueError(
                    f"run starts at {run.ledger_id}:{run.first_entry_id}, expected entry "
                    f"{last.last_entry_id + 1} (runs of a ledger must be contiguous)"
                )
            return last
        if last is not None and run.ledger_id < last.ledger_id:
            raise ValueError(f"run of ledger {run.ledger_id} after ledger {last.ledger_id}")
        section = _Section(run.ledger_id, run.first_entry_id - 1, 0)
        self._sections.append(section)
        return section

    def finish(self, timestamps: Mapping[int, int] | None = None, *,
               checksummed: bool = False) -> bytes:
        """The index bytes; ``timestamps``: ledger id → LedgerInfo timestamp (ms; default 0);
        ``checksummed``: the blocks were stamped (``format/checksum.py``), and the index
        records it."""
        if not self._sections:
            raise ValueError("a streaming object needs at least one entry")
        self._finished = True
        ts = timestamps or {}
        return encode_streaming_index(
            self._length,
            [
                SectionInput(
                    s.ledger_id, s.last_entry_id + 1, s.size, ts.get(s.ledger_id, 0), s.blocks
                )
                for s in self._sections
            ],
            checksummed=checksummed,
        )


def build_streaming_object(
    runs: Sequence[EntryRun],
    *,
    max_block_size: int,
    min_block_size: int,
    timestamps: Mapping[int, int] | None = None,
    max_entries: int | None = None,
) -> StreamingObject:
    """A whole streaming object from ``runs`` (in log order)."""
    builder = StreamingObjectBuilder(
        max_block_size=max_block_size, min_block_size=min_block_size, max_entries=max_entries
    )
    blocks = [b for run in runs for b in builder.add_run(run)]
    index = builder.finish(timestamps)
    return StreamingObject(blocks, index, builder.length)
