"""Multipart parts assembled from blocks (pure: no I/O, no bytes copied).

Blocks are sized by their content (``format/layout.py``: header + entries + at least 4 bytes of
padding), so a block cut short at the end of a ledger may be a few KiB. S3 refuses a multipart
part under 5 MiB unless it is the last one (EntityTooSmall), so a block is not a part: parts are
runs of consecutive blocks, cut as soon as a part reaches ``part_size``::

    blocks  |b1 |b2      |b3|b4          |b5 |b6|b7      |
    parts   |part 1 (>= part_size)|part 2 (>= part_size)|last part (any size)|

* every part but the last holds at least ``part_size`` bytes, at most ``part_size - 1`` plus
  its last block;
* parts tile the data object in number order, and every block lies wholly inside one part, so
  every index offset still points at a block header;
* a part's buffers are the blocks' own buffers (views), never joined;
* a part's CRC32C (the store's per-part checksum) is combined from its blocks' own, computed
  when they were stamped: no pass over the part's bytes.

The index's part ids are the blocks' ordinals (as Pulsar's writer numbers them; Pulsar's readers
locate a block by its offset and never use the part id), independent of these part numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from offloadd.format.checksum import crc32c_combine
from offloadd.format.layout import Block

__all__ = ["DEFAULT_PART_SIZE", "PartAssembler", "UploadPart"]

DEFAULT_PART_SIZE = 8 * 1024 * 1024

Buffer = bytes | memoryview


@dataclass(frozen=True)
class UploadPart:
    """One multipart part: ``blocks`` laid back to back from ``offset`` (``length`` bytes)."""

    number: int
    offset: int
    length: int
    blocks: tuple[Block, ...]

    @property
    def buffers(self) -> tuple[Buffer, ...]:
        return tuple(b for block in self.blocks for b in block.buffers)

    @property
    def crc32c(self) -> int | None:
        """The CRC32C of the part's bytes, combined from its stamped blocks' (None when one
        is not stamped): the store's part checksum costs no pass over the bytes."""
        crc = 0
        for block in self.blocks:
            if block.crc32c is None:
                return None
            crc = crc32c_combine(crc, block.crc32c, block.length)
        return crc


class PartAssembler:
    """Groups the blocks of one data object, in order, into parts of at least ``part_size``."""

    def __init__(self, part_size: int) -> None:
        if part_size < 1:
            raise ValueError(f"part size must be >= 1, got {part_size}")
        self.part_size = part_size
        self._pending: list[Block] = []
        self._pending_bytes = 0
        self._number = 0
        self._offset = 0  # where the pending part starts
        self._finished = False

    @property
    def pending(self) -> tuple[Block, ...]:
        """Blocks waiting for the part they will travel in (it is not full yet)."""
        return tuple(self._pending)

    @property
    def pending_bytes(self) -> int:
        return self._pending_bytes

    def add(self, blocks: Sequence[Block]) -> list[UploadPart]:
        """Take the next blocks; return the parts they filled (possibly none)."""
        if self._finished:
            raise ValueError("add after finish")
        out: list[UploadPart] = []
        for block in blocks:
            expected = self._offset + self._pending_bytes
            if block.offset != expected:
                raise ValueError(f"block {block.number} starts at byte {block.offset}, "
                                 f"expected {expected} (blocks must come in object order)")
            self._pending.append(block)
            self._pending_bytes += block.length
            if self._pending_bytes >= self.part_size:
                out.append(self._cut())
        return out

    def finish(self) -> UploadPart | None:
        """The last part (any size), or None when every block already travels in a part."""
        self._finished = True
        return self._cut() if self._pending else None

    def _cut(self) -> UploadPart:
        self._number += 1
        part = UploadPart(self._number, self._offset, self._pending_bytes, tuple(self._pending))
        self._offset += self._pending_bytes
        self._pending, self._pending_bytes = [], 0
        return part
