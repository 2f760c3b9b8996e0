"""What a gc pass did, or with ``--dry-run`` would do: the report and its text
(``offloadd gc``, ``offloadd gc --json``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from offloadd.model.segment_state import SegmentState

__all__ = ["GcReport", "LedgerAction", "Mark", "SegmentDeletion", "render_text"]


@dataclass(frozen=True)
class LedgerAction:
    topic: str
    ledger_id: int


@dataclass(frozen=True)
class Mark:
    topic: str
    ledger_id: int
    segment: str


@dataclass(frozen=True)
class SegmentDeletion:
    segment: str
    topic: str
    keys: tuple[str, ...]
    attempts: int = 0  # failed attempts so far, this one included when it failed
    error: str | None = None
    state: str = SegmentState.OFFLOADED.value  # "deleted" once every object is gone


@dataclass
class GcReport:
    """What one pass did (with ``dry_run``: what it would have done)."""

    dry_run: bool = False
    tracked: int = 0  # segment records created
    marked: list[Mark] = field(default_factory=list)
    deleted_ledgers: list[LedgerAction] = field(default_factory=list)  # retention
    trimmed: list[LedgerAction] = field(default_factory=list)  # source copies dropped
    deleted_segments: list[SegmentDeletion] = field(default_factory=list)
    failed: list[SegmentDeletion] = field(default_factory=list)  # pending, retried next pass
    orphans_removed: list[str] = field(default_factory=list)
    orphans_failed: list[str] = field(default_factory=list)
    uploads_swept: int = 0
    lagging: int = 0  # merged-away segments whose deletion lag has not passed yet
    refused: list[str] = field(default_factory=list)  # the invariant stopped a deletion
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.failed or self.orphans_failed or self.refused or self.errors)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["ok"] = self.ok
        return out


def render_text(rep: GcReport) -> str:
    """The human report of ``offloadd gc``."""
    would = "would " if rep.dry_run else ""
    lines: list[str] = []
    lines += [f"{would}delete ledger {a.ledger_id} of {a.topic} (retention)"
              for a in rep.deleted_ledgers]
    lines += [f"{would}drop the local copy of ledger {a.ledger_id} of {a.topic}"
              for a in rep.trimmed]
    lines += [f"marked ledger {m.ledger_id} of {m.topic} deleted (segment {m.segment})"
              for m in rep.marked]
    for d in rep.deleted_segments:
        lines.append(f"{would}delete segment {d.segment} of {d.topic}: {', '.join(d.keys)}")
    for d in rep.failed:
        lines.append(f"FAILED segment {d.segment} of {d.topic} (attempt {d.attempts}, stays "
                     f"pending): {d.error}")
    lines += [f"{would}delete orphan {k}" for k in rep.orphans_removed]
    lines += [f"FAILED orphan {k}" for k in rep.orphans_failed]
    lines += [f"REFUSED {r}" for r in rep.refused]
    if rep.lagging:
        lines.append(f"{rep.lagging} merged-away segment(s) kept until their deletion lag has "
                     "passed")
    lines += [f"note: {n}" for n in rep.notes]
    lines += [f"ERROR {e}" for e in rep.errors]
    lines.append(
        f"gc{' (dry run)' if rep.dry_run else ''}: {len(rep.deleted_segments)} segment(s), "
        f"{len(rep.orphans_removed)} orphan(s), {rep.uploads_swept} stale upload(s) removed; "
        f"{len(rep.deleted_ledgers)} ledger(s) expired, {len(rep.trimmed)} local cop(ies) "
        f"dropped; {rep.tracked} segment(s) newly tracked; {len(rep.failed)} deletion(s) "
        f"pending after failure; {'OK' if rep.ok else 'FAILED'}")
    return "\n".join(lines)
