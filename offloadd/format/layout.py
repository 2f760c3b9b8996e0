"""Planning blocks over a run of framed entries: where to cut and how long each block is.

Pure arithmetic on the run's frame offsets (``offsets[i]`` = start of entry i's frame,
``offsets[n]`` = end of the last one); no bytes are touched. Cut points come from bisecting the
offsets, so planning costs O(blocks × log entries) whatever the entry count.

Rules (what Pulsar's readers rely on without checking; docs/design.md "Formats"):

* Greedy: a block takes as many consecutive entries as fit with
  ``128 + payload + 4 <= max_block_size`` — the 4 bytes are the minimum padding every block
  ends with, so a reader always meets a negative length after the last entry.
* A block always holds at least one entry. An entry too large for ``max_block_size`` is never
  dropped and never refused here: it gets a block of its own, *grown* to
  ``128 + frame + 4`` bytes. (Pulsar ends the object early in that case, losing data.)
* Block length, ``pad_to="min"`` (streaming, PIP-76): ``max(min_block_size, 128 + payload + 4)``.
* Block length, ``pad_to="max"`` (ledger-based, PIP-17): every block but the last is padded to
  exactly ``max_block_size`` (a grown block keeps its grown length); the last block is sized
  exactly ``128 + payload`` with no padding, as Pulsar's writer sizes it — it ends the object.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from offloadd.format.block import HEADER_LEN, MIN_PADDING, padding
from offloadd.model.frames import FRAME_OVERHEAD

# The smallest max_block_size under which a block can hold anything but a grown entry.
MIN_MAX_BLOCK_SIZE = HEADER_LEN + FRAME_OVERHEAD + MIN_PADDING


@dataclass(frozen=True)
class BlockPlan:
    """One planned block: entries ``first_entry_id..last_entry_id`` of ``ledger_id``.

    ``start:end`` is the block's payload (framed entries) inside the run's data;
    ``block_len`` is the whole block: header + payload + padding.
    """

    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    start: int
    end: int
    block_len: int

    @property
    def payload_len(self) -> int:
        return self.end - self.start

    @property
    def padding_len(self) -> int:
        return self.block_len - HEADER_LEN - self.payload_len

    @property
    def entry_count(self) -> int:
        return self.last_entry_id - self.first_entry_id + 1


@dataclass(frozen=True)
class Block:
    """One block ready to upload (in a multipart part of whole blocks, ``offload/parts.py``).

    ``buffers`` are written back to back: the header, the payload (a view of the run's data,
    never a copy) and the padding (omitted when empty); ``length`` is their total, equal to
    ``plan.block_len``. ``number`` counts blocks from 1 (the index's part id); ``offset`` is
    where the block starts in the data object. ``crc32c``: the CRC32C of all ``length`` bytes,
    header included, once the block checksum is stamped (``format/checksum.py``): a store's
    part checksum is combined from it, not read again.
    """

    number: int
    offset: int
    buffers: tuple[bytes | memoryview, ...]
    length: int
    plan: BlockPlan
    crc32c: int | None = None


@dataclass(frozen=True)
class ObjectPair:
    """A whole object pair, either format: the data object's blocks, its length and the index."""

    blocks: list[Block]
    index: bytes
    length: int

    def data_bytes(self) -> bytes:
        """The data object as one bytes value (copies; for tests and small objects)."""
        return b"".join([b for blk in self.blocks for b in blk.buffers])


def make_block(
    plan: BlockPlan, number: int, offset: int, header: bytes, data: memoryview
) -> Block:
    """Assemble the buffers of a planned block whose payload lies in ``data``."""
    pad = plan.padding_len
    payload = data[plan.start : plan.end]
    buffers = (header, payload, padding(pad)) if pad else (header, payload)
    return Block(number, offset, buffers, plan.block_len, plan)


def plan_blocks(
    offsets: Sequence[int],
    first_entry_id: int,
    ledger_id: int,
    *,
    max_block_size: int,
    min_block_size: int = 0,
    pad_to: Literal["min", "max"],
    max_entries: int | None = None,
) -> list[BlockPlan]:
    """Cut the run described by ``offsets`` into blocks (see the module docstring for the rules).

    ``max_entries`` optionally caps the number of entries in one block.
    An empty run (one offset) plans no block.
    """
    if pad_to not in ("min", "max"):
        raise ValueError(f"pad_to must be 'min' or 'max', got {pad_to!r}")
    if max_block_size < MIN_MAX_BLOCK_SIZE:
        raise ValueError(f"max_block_size {max_block_size} is below {MIN_MAX_BLOCK_SIZE}")
    if pad_to == "min" and min_block_size > max_block_size:
        raise ValueError(f"min_block_size {min_block_size} exceeds max_block_size {max_block_size}")
    if max_entries is not None and max_entries < 1:
        raise ValueError(f"max_entries must be >= 1, got {max_entries}")
    n = len(offsets) - 1
    if n < 0:
        raise ValueError("offsets must hold at least one value (the end of the run)")
    room = max_block_size - HEADER_LEN - MIN_PADDING
    plans: list[BlockPlan] = []
    i = 0
    while i < n:
        start = offsets[i]
        # Largest j with offsets[j] - start <= room: entries i..j-1 fit.
        j = bisect_right(offsets, start + room, i + 1, n + 1) - 1
        if j <= i:
            j = i + 1  # oversize entry: grow its own block
        if max_entries is not None and j - i > max_entries:
            j = i + max_entries
        end = offsets[j]
        payload = end - start
        natural = HEADER_LEN + payload + MIN_PADDING
        if pad_to == "min":
            block_len = max(min_block_size, natural)
        elif j == n:
            block_len = HEADER_LEN + payload
        else:
            block_len = max(max_block_size, natural)
        plans.append(
            BlockPlan(ledger_id, first_entry_id + i, first_entry_id + j - 1, start, end, block_len)
        )
        i = j
    return plans
