"""Entries as every stage carries them: framed the way blocks frame them (pure).

A ledger source hands out runs of consecutive entries of one ledger already framed::

    [int32 length][int64 entryId][length bytes]   (big-endian)

so that a block's payload is one contiguous slice of a run and the pipeline never touches
entries one by one (``format/block.py`` lays the frames into blocks, the sources read them from
their storage). :data:`FRAME` is that header, defined here once for every reader and writer.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["FRAME", "FRAME_OVERHEAD", "EntryRun", "PieceSums"]

FRAME = struct.Struct(">iq")  # payload length, entry id
FRAME_OVERHEAD = FRAME.size  # 12 bytes in front of every payload


@dataclass(frozen=True)
class PieceSums:
    """CRC32Cs of consecutive pieces of a run's ``data``, computed from those very bytes.

    Piece ``k`` is ``data[starts[k]:starts[k + 1]]`` and its CRC32C is ``crcs[k]``; the pieces
    need not reach either end of ``data``. A source that has already passed every byte through
    CRC32C (to check it against its store) hands these on, so the block checksum is derived
    from them (``format/checksum.py``, CRC32C combine) instead of a second pass over the bytes.
    """

    starts: Sequence[int]  # len(crcs) + 1 boundaries, ascending, relative to ``data``
    crcs: Sequence[int]


@dataclass(frozen=True, slots=True)
class EntryRun:
    """Entries ``first_entry_id .. first_entry_id + count - 1`` of one ledger, framed.

    ``data`` may be a view into a larger buffer: treat it as read-only and slice, never copy.
    ``offsets[i]`` is where entry ``first_entry_id + i``'s frame starts in ``data``;
    ``offsets[count] == len(data)``. ``crcs`` (CRC32C of each payload) when the source keeps them.
    """

    ledger_id: int
    first_entry_id: int
    data: memoryview
    offsets: Sequence[int]
    crcs: Sequence[int] | None = None
    sums: PieceSums | None = None

    @property
    def count(self) -> int:
        return len(self.offsets) - 1

    @property
    def last_entry_id(self) -> int:
        return self.first_entry_id + self.count - 1

    @property
    def payload_bytes(self) -> int:
        """Sum of entry payload sizes (frames minus their 12-byte headers)."""
        return len(self.data) - FRAME_OVERHEAD * self.count
