"""Read-committed: what a Pulsar consumer is delivered, decided from the log alone (pure, no I/O).

A broker writes entries no consumer ever receives, and the projection must not make rows of them
(Pulsar's ``TopicTransactionBuffer`` and ``AbstractBaseDispatcher`` filter them):

- **markers** (``MessageMetadata.marker_type`` set): replicated-subscription snapshots and updates
  (10..13) and a transaction's commit (21) or abort (22) marker, appended after its messages;
- **messages of an aborted transaction** (``txnid_most_bits``/``txnid_least_bits`` set, and an
  abort marker for that id in the log).

Committed transactional messages are delivered at their own positions, but only once their commit
marker is in the log: the broker's ``maxReadPosition`` stops every consumer just before the first
entry of the oldest undecided transaction. :class:`ReadCommitted` does the same. Entries come in
log order; from the first entry of an undecided transaction on, every entry (transactional or
not) is *held*; when that transaction's marker arrives the held entries are released in log
order, each with its verdict, up to the next undecided transaction's first entry.

Where held entries live across a crash: nowhere but the log. The projection records in the table
only the position of the last *released* entry, so after a restart (or a pass that ended with
entries held) it reads them again from the tier and decides them again — the same way, since the
decisions depend on the log only. Nothing held is lost, and nothing released is released twice.

The bound: a transaction with no marker ``timeout_ms`` of *log time* after its first entry (an
entry of the log published at least that much later) is treated as aborted and its messages are
dropped as ``timed-out``. That is what Pulsar does: its coordinator aborts a transaction at its
timeout (the client default is one minute) and a later commit is refused, so the default here (three
minutes) leaves the coordinator time to write the abort marker. Log time, not the wall clock: a
backlog projected hours later decides every transaction exactly as a live follower would. A commit
marker for a transaction already timed out is counted (``late_commits``) and logged; its messages
stay dropped. Held memory is bounded by what the topic writes in ``timeout_ms``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from offloadd.errors import FormatError
from offloadd.format.message import DecodedEntry
from offloadd.model import Position

__all__ = [
    "ABORTED",
    "HELD",
    "TIMED_OUT",
    "Counts",
    "ReadCommitted",
    "Released",
    "hidden_totals",
    "last_held",
    "marker_name",
    "totals_properties",
    "txn_text",
]

log = logging.getLogger(__name__)

TXN_COMMIT = 21
TXN_ABORT = 22
ABORTED = "aborted"  # a message of an aborted transaction
TIMED_OUT = "timed-out"  # a message of a transaction undecided after the timeout
_MARKERS = {10: "replicated-subscription-snapshot-request-marker",
            11: "replicated-subscription-snapshot-response-marker",
            12: "replicated-subscription-snapshot-marker",
            13: "replicated-subscription-update-marker",
            20: "txn-committing-marker", TXN_COMMIT: "txn-commit-marker",
            TXN_ABORT: "txn-abort-marker"}


def marker_name(marker_type: int) -> str:
    return _MARKERS.get(marker_type, f"marker-{marker_type}")


def txn_text(txn: tuple[int, int]) -> str:
    """Pulsar's ``TxnID.toString()``: ``(most,least)``."""
    return f"({txn[0]},{txn[1]})"


@dataclass
class Counts:
    """What read-committed hid (messages), and the transactions it decided."""

    markers: int = 0
    aborted_messages: int = 0
    timed_out_messages: int = 0
    transactions_committed: int = 0
    transactions_aborted: int = 0
    transactions_timed_out: int = 0
    late_commits: int = 0

    def add(self, other: Counts) -> None:
        for k, v in other.__dict__.items():
            setattr(self, k, getattr(self, k) + v)

    def to_json(self) -> dict[str, int]:
        return dict(self.__dict__)


class _Txn:
    __slots__ = ("counted", "first_publish", "id", "state")

    def __init__(self, txn: tuple[int, int], first_publish: int) -> None:
        self.id = txn
        self.first_publish = first_publish
        self.state = "open"  # open, committed, aborted, timed-out
        self.counted = False


@dataclass(slots=True)
class Released:
    """An entry whose fate is decided: a row (``hidden`` None) or hidden for the reason given."""

    position: Position
    raw: bytes | memoryview
    entry: DecodedEntry | FormatError  # the decoder's error for an undecodable entry
    hidden: str | None = None
    txn: str | None = None  # the transaction id as text, for transactional messages


@dataclass(slots=True)
class _Held:
    position: Position
    raw: bytes | memoryview
    entry: DecodedEntry | FormatError
    txn: _Txn | None = None  # a data entry's transaction
    marker: str | None = None  # a marker's name


@dataclass
class ReadCommitted:
    """The filter for one pass over one topic's log (see the module docstring)."""

    timeout_ms: int
    counts: Counts = field(default_factory=Counts)
    _open: dict[tuple[int, int], _Txn] = field(default_factory=dict)
    _aborted: set[tuple[int, int]] = field(default_factory=set)
    _timed_out: set[tuple[int, int]] = field(default_factory=set)
    _held: list[_Held] = field(default_factory=list)
    _out: list[Released] = field(default_factory=list)
    _next_expiry: int | None = None  # the earliest first_publish + timeout among open txns

    @property
    def held(self) -> int:
        """Entries held (not yet released)."""
        return len(self._held)

    def add(self, position: Position, raw: bytes | memoryview,
            entry: DecodedEntry | FormatError) -> None:
        """The next entry of the log (in log order)."""
        if isinstance(entry, FormatError):  # undecodable: a flagged row, in its place
            self._push(_Held(position, raw, entry))
            return
        if self._next_expiry is not None and entry.publish_time >= self._next_expiry:
            self._expire(entry.publish_time)
        marker = entry.marker_type
        txn = entry.txn
        if marker is None and txn is None and not self._held:  # the common case, kept cheap
            self._out.append(Released(position, raw, entry))
            return
        if marker is not None:
            held = _Held(position, raw, entry, marker=marker_name(marker))
            if txn is not None and marker in (TXN_COMMIT, TXN_ABORT):
                self._decide(txn, marker == TXN_COMMIT)
            self._push(held)
            return
        if txn is None:
            self._push(_Held(position, raw, entry))
            return
        t = self._open.get(txn)
        if t is None:
            t = _Txn(txn, entry.publish_time)
            if txn in self._aborted:
                t.state, t.counted = "aborted", True  # the broker drops them too
            else:
                self._open[txn] = t
                expiry = entry.publish_time + self.timeout_ms
                if self._next_expiry is None or expiry < self._next_expiry:
                    self._next_expiry = expiry
        self._push(_Held(position, raw, entry, txn=t))

    def take(self) -> list[Released]:
        """The entries released since the last call, in log order."""
        out, self._out = self._out, []
        return out

    # ---- internals -------------------------------------------------------------------------
    def _push(self, h: _Held) -> None:
        if not self._held and (h.txn is None or h.txn.state != "open"):
            self._release(h)  # the common case: nothing undecided before it
        else:
            self._held.append(h)
        # (a held undecided entry is released by _drain once its transaction is decided)

    def _decide(self, txn: tuple[int, int], commit: bool) -> None:
        t = self._open.pop(txn, None)
        if t is None:
            if commit and txn in self._timed_out:
                self.counts.late_commits += 1
                log.warning("lakehouse: transaction %s committed after it was treated as timed "
                            "out; its messages are not in the table", txn_text(txn))
            if not commit:
                self._aborted.add(txn)
            return
        t.state = "committed" if commit else "aborted"
        if not commit:
            self._aborted.add(txn)
        self._recompute_expiry()
        self._drain()

    def _expire(self, now: int) -> None:
        for txn, t in list(self._open.items()):
            if t.first_publish + self.timeout_ms <= now:
                del self._open[txn]
                t.state = "timed-out"
                self._timed_out.add(txn)
                log.warning("lakehouse: transaction %s has no commit or abort marker %d ms of "
                            "log time after its first message: treated as aborted (timed out)",
                            txn_text(txn), self.timeout_ms)
        self._recompute_expiry()
        self._drain()

    def _recompute_expiry(self) -> None:
        self._next_expiry = min((t.first_publish for t in self._open.values()), default=None)
        if self._next_expiry is not None:
            self._next_expiry += self.timeout_ms

    def _drain(self) -> None:
        held = self._held
        i = 0
        while i < len(held):
            t = held[i].txn
            if t is not None and t.state == "open":
                break
            self._release(held[i])
            i += 1
        del held[:i]

    def _release(self, h: _Held) -> None:
        c = self.counts
        e: Any = h.entry
        if h.marker is not None:
            c.markers += 1
            if e.marker_type == TXN_COMMIT and e.txn is not None:
                c.transactions_committed += 1
            elif e.marker_type == TXN_ABORT and e.txn is not None:
                c.transactions_aborted += 1
            self._out.append(Released(h.position, h.raw, e, h.marker,
                                      txn_text(e.txn) if e.txn is not None else None))
            return
        t = h.txn
        if t is None:
            self._out.append(Released(h.position, h.raw, e))
            return
        hidden = None
        if t.state == "aborted":
            hidden = ABORTED
            c.aborted_messages += e.num_messages
        elif t.state == "timed-out":
            hidden = TIMED_OUT
            c.timed_out_messages += e.num_messages
            if not t.counted:
                t.counted = True
                c.transactions_timed_out += 1
        self._out.append(Released(h.position, h.raw, e, hidden, txn_text(t.id)))


_TOTAL = "offloadd.read-committed."  # + a Counts field: the table's running totals


# recorded by each projection commit: entries read past its last position and held back behind
# an undecided transaction when it was made (what `status` shows from another process)
HELD = "offloadd.read-committed.held-entries"


def totals_properties(totals: Counts) -> dict[str, int]:
    """Snapshot summary properties recording the running totals (``offloadd.read-committed.*``)."""
    return {_TOTAL + k.replace("_", "-"): v for k, v in totals.__dict__.items()}


def hidden_totals(table: Any) -> Counts:
    """The running totals of a pyiceberg table: from the newest snapshot that records them
    (compaction and maintenance snapshots do not)."""
    return _totals_and_held(table)[0]


def last_held(table: Any) -> int:
    """Entries held behind an undecided transaction when the table's last projection commit
    was made (0 before any)."""
    return _totals_and_held(table)[1]


def _totals_and_held(table: Any) -> tuple[Counts, int]:
    snap = table.current_snapshot()
    key = _TOTAL + "markers"
    while snap is not None:
        summary = snap.summary
        if summary is not None and summary.get(key) is not None:
            out = Counts()
            for k in out.__dict__:
                setattr(out, k, int(summary.get(_TOTAL + k.replace("_", "-")) or 0))
            return out, int(summary.get(HELD) or 0)
        if snap.parent_snapshot_id is None:
            break
        snap = table.snapshot_by_id(snap.parent_snapshot_id)
    return Counts(), 0
