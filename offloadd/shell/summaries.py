"""Text summaries of the reports ``produce``, ``standalone`` and ``compact`` print.

Each command prints text by default and, with ``--json``, the report itself; the text is made
from that same report (the dictionaries below), so both say the same thing. Pure functions.
"""

from __future__ import annotations

from typing import Any

from offloadd.model.sizes import size_text

# above this many topics a summary gives the totals only (``--json`` has each topic)
TOPIC_LINES = 20


def produce_text(out: dict[str, Any]) -> str:
    topics = out["topics"]
    secs = float(out["seconds"])
    rate = f" ({size_text(out['bytes'] / secs)}/s)" if secs > 0 else ""
    where = topics[0] if len(topics) == 1 else f"{len(topics):,} topics"
    return (f"produce: wrote {out['entries']:,} entries, {size_text(out['bytes'])} to {where} "
            f"in {secs:.1f} s{rate}")


def standalone_text(summary: dict[str, Any]) -> str:
    topics: dict[str, dict[str, Any]] = summary["topics"]
    offloaded = sum(int(t.get("entries_offloaded") or 0) for t in topics.values())
    segments = sum(int(t.get("segments") or 0) for t in topics.values())
    lines = [f"standalone: wrote {summary['entries_written']:,} entries "
             f"({size_text(summary['bytes_written'])}) to {len(topics):,} topic(s) in "
             f"{summary['seconds']} s; {offloaded:,} entries offloaded in {segments:,} "
             "segment(s)"]
    lake = summary.get("lakehouse") or {}
    if len(topics) <= TOPIC_LINES:
        for name, t in topics.items():
            line = (f"  {name}: {t['entries_offloaded']:,} entries in {t['segments']} "
                    f"segment(s) over {t['ledgers']} ledger(s), last offloaded "
                    f"{t['last_offloaded'] or '-'}")
            projected = lake.get(name)
            if projected is not None:
                line += (f"; lakehouse error: {projected['error']}" if projected.get("error")
                         else f"; lakehouse up to {projected.get('last_position') or '-'}")
            lines.append(line)
    else:
        lines.append(f"  ({len(topics):,} topics: --json lists each)")
    drained = summary.get("drained")
    lines.append("drained: " + (
        "yes, everything written is in the tier" if drained is True else
        "NO, not everything written was offloaded in time (it stays in the ledger store)"
        if drained is False else "not waited for (stopped by a signal)"))
    if summary.get("problem"):
        lines.append(f"problem: {summary['problem']}")
    return "\n".join(lines)


def compact_text(reports: list[dict[str, Any]], ok: bool) -> str:
    lines = []
    for r in reports:
        if "error" in r:
            lines.append(f"FAILED {r['topic']}: {r['error']}")
            continue
        merged = r.get("merged") or []
        line = (f"{r['topic']}: {r['segments_before']} -> {r['segments_after']} segment(s), "
                f"{len(merged)} merge(s)")
        if r.get("skipped"):
            line += f", {len(r['skipped'])} group(s) skipped (the catalog moved; run again)"
        lines.append(line)
    if not reports:
        lines.append("no topic to compact")
    lines.append("compact: OK" if ok else "compact: FAILED")
    return "\n".join(lines)
