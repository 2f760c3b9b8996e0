"""The segment roller: what the streaming mode does next, decided from what it knows (pure).

A segment closes at ``max_bytes`` of entry frames or ``max_age_s`` after its first entry,
whichever comes first, or at once on a manual trigger — independent of ledger rollover, so a
segment may span ledgers and a ledger may span segments. A time or manual roll closes at the
topic's tail *as it is when the roll is decided* (entries written later go to the next
segment); a size or shutdown roll closes at what the segment holds.

Reads are sized to fill one block (``block_budget`` frame bytes, never past the segment's
remaining budget). A partial block is read only when it must be: its ledger is closed, or the
segment is closing. Otherwise the task waits for more entries, so a slow topic does not produce
many tiny blocks (each costs a header, its padding and an index row) nor re-read the same
bytes again and again.

:func:`decide` is one turn of the streaming loop as a function of the clock's ``now``, the open
segment and the topic's ledgers: tested with a fake clock, no sleeping.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, replace

from offloadd.format.block import HEADER_LEN, MIN_PADDING
from offloadd.model import FRAME_OVERHEAD, LedgerDesc, LedgerState, Position


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


# ---- one turn of the streaming loop ----------------------------------------------------------

class Action(enum.Enum):
    READ = "read"  # read up to ``entries`` entries of the position's ledger into the segment
    CLOSE = "close"  # close and commit the open segment
    STOP = "stop"  # the task is stopping and nothing is left to do
    WAIT = "wait"  # wait for entries (or a trigger) at most ``wait_s``


@dataclass(frozen=True, slots=True)
class OpenSegment:
    """What the roller needs to know of the open segment."""

    frame_bytes: int
    opened_at: float
    end: Position | None  # its last entry
    close_target: Position | None  # set once a roll was decided: read no further than this


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    close_target: Position | None = None  # the open segment's, possibly just decided
    entries: int = 0  # READ: at most this many entries from the position
    wait_s: float = 0.0  # WAIT: at most this long
    pending_since: float | None = None  # when unread entries were first seen, no segment open
    trigger_used: bool = False  # the manual trigger was consumed (or was a no-op)


def tail_of(ledgers: Sequence[LedgerDesc]) -> Position | None:
    """The topic's last readable entry."""
    return next((Position(d.ledger_id, d.last_entry_id) for d in reversed(ledgers)
                 if d.last_entry_id >= 0), None)


def normalise(ledgers: Sequence[LedgerDesc], pos: Position | None
              ) -> tuple[Position | None, LedgerDesc | None, list[Position]]:
    """Move ``pos`` over ended or vanished ledgers: the position, its ledger (None when past
    the last one), and the positions skipped because their ledger vanished (deleted before they
    were offloaded)."""
    skipped: list[Position] = []
    if not ledgers:
        return pos, None, skipped
    if pos is None:
        pos = Position(ledgers[0].ledger_id, 0)
    ids = [d.ledger_id for d in ledgers]
    while True:
        if pos.ledger_id not in ids:
            later = [d for d in ledgers if d.ledger_id > pos.ledger_id]
            if not later:
                return pos, None, skipped
            skipped.append(pos)
            pos = Position(later[0].ledger_id, 0)
            continue
        idx = ids.index(pos.ledger_id)
        desc = ledgers[idx]
        if (desc.state is LedgerState.CLOSED and pos.entry_id > desc.last_entry_id
                and idx + 1 < len(ledgers)):
            pos = Position(ledgers[idx + 1].ledger_id, 0)
            continue
        return pos, desc, skipped


def roll(policy: RollPolicy, *, now: float, ledgers: Sequence[LedgerDesc],
         segment: OpenSegment | None, manual: bool, stopping: bool
         ) -> tuple[Position | None, bool]:
    """Whether the open segment must close now and where: its close target (the one it had,
    or the one decided now) and whether a manual trigger was consumed deciding it."""
    seg = segment
    if seg is None:
        return None, False
    if seg.close_target is not None:
        return seg.close_target, False
    reason = roll_reason(policy, seg.frame_bytes, seg.opened_at, now, manual)
    if stopping and seg.frame_bytes:
        reason = RollReason.SHUTDOWN
    if reason is None:
        return None, False
    tail = tail_of(ledgers)
    target = (max(tail, seg.end or tail)
              if tail is not None and reason in (RollReason.TIME, RollReason.MANUAL)
              else seg.end)
    return target, reason is RollReason.MANUAL


def decide(policy: RollPolicy, *, now: float, ledgers: Sequence[LedgerDesc],
           pos: Position | None, desc: LedgerDesc | None, segment: OpenSegment | None,
           pending_since: float | None, manual: bool, stopping: bool,
           bytes_before: int | None, idle_poll_s: float) -> Decision:
    """The streaming loop's next step (the roll included: :func:`roll`).

    ``pos``/``desc``: the next position and its ledger (:func:`normalise`); ``bytes_before``:
    payload bytes of ``desc`` before ``pos`` when known (then a partial block is recognised as
    such); ``pending_since``: when unread entries were first seen while no segment was open (the
    next segment's age counts from then).
    """
    seg = segment
    target, trigger_used = roll(policy, now=now, ledgers=ledgers, segment=seg, manual=manual,
                                stopping=stopping)
    avail = 0 if desc is None or pos is None else desc.last_entry_id - pos.entry_id + 1
    if seg is not None and seg.frame_bytes >= policy.max_bytes:
        avail = 0  # full: whatever else is readable goes to the next segment
    elif seg is not None and target is not None and pos is not None:
        # closing: read only up to where the topic was when the roll was decided
        if pos > target:
            avail = 0
        elif desc is not None and desc.ledger_id == target.ledger_id:
            avail = min(avail, target.entry_id - pos.entry_id + 1)
    if seg is None and avail <= 0:
        trigger_used = trigger_used or manual  # a trigger with nothing to offload is a no-op
        pending_since = None
    elif seg is None and pending_since is None:
        pending_since = now  # the next segment's age counts from its first entry
    still_manual = manual and not trigger_used
    overdue = seg is None and pending_since is not None and now - pending_since >= policy.max_age_s
    base = Decision(Action.WAIT, close_target=target, pending_since=pending_since,
                    trigger_used=trigger_used)
    if desc is not None and pos is not None and avail > 0 and not (stopping and seg is None):
        must_read = should_read(
            policy, seg_bytes=seg.frame_bytes if seg else 0, avail_entries=avail,
            avail_payload=(desc.size - bytes_before) if bytes_before is not None else 1 << 62,
            ledger_closed=desc.state is LedgerState.CLOSED,
            closing=still_manual or overdue or target is not None)
        if must_read:
            return replace(base, action=Action.READ, entries=avail)
    if seg is not None and target is not None and seg.frame_bytes:
        return replace(base, action=Action.CLOSE)
    if stopping:
        return replace(base, action=Action.STOP)
    timeout = idle_poll_s
    since = seg.opened_at if seg is not None else pending_since
    if since is not None:
        timeout = max(0.0, min(timeout, since + policy.max_age_s - now))
    return replace(base, wait_s=timeout)
