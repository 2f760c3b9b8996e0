"""The segment roller: when to close the open segment and how much to read next (pure).

A segment closes at ``max_bytes`` of entry frames or ``max_age_s`` after its first entry,
whichever comes first, or at once on a manual trigger — independent of ledger rollover, so a
segment may span ledgers and a ledger may span segments.

Reads are sized to fill one block (``block_budget`` frame bytes, never past the segment's
remaining budget). A partial block is read only when it must be: its ledger is closed, or the
segment is closing. Otherwise the task waits for more entries, so a slow topic does not produce
many tiny blocks (S3 wants ≥ 5 MiB parts) nor re-read the same bytes again and again.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from offloadd.format.block import HEADER_LEN, MIN_PADDING
from offloadd.model import FRAME_OVERHEAD


class RollReason(enum.Enum):
    SIZE = "size"
    TIME = "time"
    MANUAL = "manual"
    SHUTDOWN = "shutdown"


@dataclass(frozen=True)
class RollPolicy:
    max_bytes: int
    max_age_s: float
    max_block_size: int
    min_block_size: int = 0

    @property
    def block_budget(self) -> int:
        """Frame bytes that fill one block, leaving room for the header and the padding."""
        return max(self.max_block_size - HEADER_LEN - MIN_PADDING, 1)


def roll_reason(policy: RollPolicy, seg_bytes: int, opened_at: float | None, now: float,
                manual: bool) -> RollReason | None:
    """Why the open segment must close now, or ``None``. No segment is open while
    ``opened_at`` is ``None``; an empty segment never closes (no block may be empty)."""
    if opened_at is None or seg_bytes == 0:
        return None
    if manual:
        return RollReason.MANUAL
    if seg_bytes >= policy.max_bytes:
        return RollReason.SIZE
    if now - opened_at >= policy.max_age_s:
        return RollReason.TIME
    return None


def read_budget(policy: RollPolicy, seg_bytes: int) -> int:
    """Frame bytes to ask the source for next (≥ 1 so an oversize entry still moves)."""
    return max(min(policy.block_budget, policy.max_bytes - seg_bytes), 1)


def should_read(policy: RollPolicy, *, seg_bytes: int, avail_entries: int, avail_payload: int,
                ledger_closed: bool, closing: bool) -> bool:
    """Read now, or wait for more entries? ``avail_*`` count readable entries not yet taken."""
    if avail_entries <= 0:
        return False
    if closing or ledger_closed:
        return True
    frames = avail_payload + FRAME_OVERHEAD * avail_entries
    return frames >= read_budget(policy, seg_bytes)
