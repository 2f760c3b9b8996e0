"""How ``offloadd status`` reads and shows what :mod:`offloadd.shell.status` gathered: each
topic's state (:func:`failing`, :func:`topic_state`), the exit code, the summary view
(:func:`summarize`), and the renderings: text (:func:`render_text`, :func:`render_summary`)
and JSON (:func:`render_json`). Pure functions of the gathered document: no I/O.

``--json`` above ``SUMMARY_OVER`` topics is still one JSON document, but written a topic a line
(``"topics": [`` on a line of its own, then one compact object per line, ``]}`` last): indented,
10,000 topics were 22 MB and a third of the command's time, and a line per topic lets ``grep``,
``head`` or ``jq -c`` work on it. The daemon's own ``topics`` map is left out there (each
topic's ``live`` holds its entry); ``daemon.topics_owned`` always says how many it owns.
"""

from __future__ import annotations

import heapq
import json
from datetime import UTC, datetime
from typing import Any

from offloadd.shell.policies import policy_lines

EXIT_OK, EXIT_FAILING, EXIT_DATA_LOST = 0, 1, 3

# ``offloadd status`` in text shows the summary instead of every topic above this many topics
# (unless --all-topics or --topic); ``--json`` writes a topic a line above it
SUMMARY_OVER = 50
TOP_LAG = 20


def failing(t: dict[str, Any]) -> bool:
    """The topic's last attempt (or recovery) failed and nothing succeeded since; or its
    metadata cannot be read."""
    if "error" in t or t.get("owner_alive") is False:
        return True
    live = t.get("live")
    if live is not None:
        return bool(live.get("failed_attempts"))
    rec = t.get("status")
    return bool(rec and rec.get("failed_attempts"))


def exit_code(st: dict[str, Any]) -> int:
    topics = st["topics"]
    if any(t.get("data_lost") for t in topics):
        return EXIT_DATA_LOST
    if any(failing(t) for t in topics) or any(
            m.get("alive") is False for m in st.get("members", ())):
        return EXIT_FAILING
    return EXIT_OK


def topic_state(t: dict[str, Any]) -> str:
    """One word for a topic's state (the summary's counts): ``error`` (metadata unreadable),
    ``data-lost``, ``failing``, ``ok``, ``stopped``, ``never-offloaded``."""
    if "error" in t:
        return "error"
    if t.get("data_lost"):
        return "data-lost"
    if failing(t):
        return "failing"
    if t.get("live") is not None:
        return "ok"
    state = (t.get("status") or {}).get("state")
    return str(state) if state else "never-offloaded"


def _lag_key(t: dict[str, Any]) -> tuple[float, float]:
    lag = t.get("lag") or {}
    if "error" in lag:
        return (-1.0, -1.0)
    return (float(lag.get("bytes") or 0), float(lag.get("seconds") or 0))


def summarize(st: dict[str, Any], top: int = TOP_LAG) -> dict[str, Any]:
    """Counts of topics by state, the ``top`` topics by lag (bytes, then seconds) and every
    failing topic (its error), from :func:`collect`'s document."""
    topics = st["topics"]
    counts: dict[str, int] = {}
    for t in topics:
        state = topic_state(t)
        counts[state] = counts.get(state, 0) + 1
    worst = heapq.nlargest(top, (t for t in topics if _lag_key(t)[0] > 0), key=_lag_key)
    bad = [t for t in topics if topic_state(t) in ("failing", "error", "data-lost")]
    return {
        "topics": len(topics),
        "by_state": dict(sorted(counts.items())),
        "top_lag": [{"topic": t["topic"], "lag": t["lag"]} for t in worst],
        "failing": [{"topic": t["topic"], "state": topic_state(t),
                     "error": t.get("error") or (t.get("live") or {}).get("last_error")
                     or (t.get("status") or {}).get("last_error"),
                     "failed_attempts": ((t.get("live") or t.get("status") or {})
                                         .get("failed_attempts"))}
                    for t in bad],
    }


def render_summary(st: dict[str, Any], summary: dict[str, Any] | None = None) -> str:
    """The header lines of :func:`render_text`, then the summary instead of every topic."""
    summary = summary or summarize(st)
    head = render_text({**st, "topics": []})
    counts = ", ".join(f"{n} {state}" for state, n in summary["by_state"].items())
    lines = [head, f"{summary['topics']} topic(s): {counts or 'none'}"]
    if summary["top_lag"]:
        lines.append(f"top {len(summary['top_lag'])} by lag:")
        lines.extend(f"  {x['topic']}: {_lag_text(x['lag'])}" for x in summary["top_lag"])
    if summary["failing"]:
        lines.append(f"failing ({len(summary['failing'])}):")
        for x in summary["failing"]:
            attempts = f", {x['failed_attempts']} failed attempt(s)" \
                if x.get("failed_attempts") else ""
            lines.append(f"  {x['topic']}: {x['state'].upper()}{attempts}"
                         + (f": {x['error']}" if x.get("error") else ""))
    lines.append("(offloadd status --topic TOPIC or --namespace TENANT/NS for details, "
                 "--all-topics for every topic)")
    return "\n".join(lines)


def _owned(daemon: dict[str, Any]) -> int:
    owned = daemon.get("topics_owned")
    return owned if isinstance(owned, int) else len(daemon.get("topics") or {})


def render_json(st: dict[str, Any]) -> str:
    """``--json``: indented up to ``SUMMARY_OVER`` topics; above, the document's head indented
    and then one compact topic a line (each followed by a comma but the last), with the
    daemon's ``topics`` map left out (each topic's ``live`` has its entry)."""
    topics = st.get("topics")
    if topics is None or len(topics) <= SUMMARY_OVER:
        return json.dumps(st, indent=2)
    head = {k: v for k, v in st.items() if k != "topics"}
    if isinstance(head.get("daemon"), dict):
        head["daemon"] = {k: v for k, v in head["daemon"].items() if k != "topics"}
    text = json.dumps(head, indent=2)
    dump = json.JSONEncoder(separators=(",", ":")).encode
    return (text[:-2] + ',\n  "topics": [\n' + ",\n".join(dump(t) for t in topics)
            + "\n  ]\n}")


def render_text(st: dict[str, Any]) -> str:
    lines = [f"metadata {st['metadata']}  driver {st['driver']}"]
    d = st.get("daemon")
    if d:
        store = d.get("store_circuit")
        if d.get("store_ready") is False:
            store = f"{store}, NOT READY: {d.get('store_reason')}"
        lines.append(f"daemon pid {d.get('pid')} {d.get('state')}: store circuit "
                     f"{store}, buffer {d['buffer']['used']}/"
                     f"{d['buffer']['cap']} bytes, {_owned(d)} topic(s) owned")
    elif st.get("other_daemon"):
        o = st["other_daemon"]
        lines.append(f"daemon: the one answering on {o['bind']} (pid {o.get('pid')}) serves "
                     f"another deployment ({o.get('metadata')}); check [metrics] bind (status "
                     "below is what the metadata store holds)")
    elif "daemon" in st:
        lines.append("daemon: not answering (status below is what the metadata store holds)")
    cw = (d or {}).get("conditional_writes") or st.get("conditional_writes")
    if cw:
        lines.append(f"conditional writes {'on' if cw.get('on') else 'off'}: {cw.get('how')}")
    if st.get("members"):
        lines.append("members " + ", ".join(
            m["owner"] + (f" (DEAD: pid {m['pid']} is not running)" if m.get("alive") is False
                          else "") for m in st["members"]))
    bookies = ((d or {}).get("source") or st.get("source") or {}).get("bookies")
    if bookies:  # the daemon's view when it answers: it is the one reading them
        lines.append("bookies " + ", ".join(
            f"{b} {v['reads']}" + (" batched" if v.get("batched_reads") == "yes" else "")
            + (f" ({v['note']})" if v.get("note") else "") for b, v in bookies.items()))
    for t in st["topics"]:
        owner = (f"; owner {t.get('owner') or '-'} epoch {t['epoch']}"
                 if t.get("epoch") is not None else "")
        if "error" in t:
            lines.append(f"{t['topic']}: ERROR {t['error']}{owner}")
            continue
        if t.get("data_lost"):
            lines.append(f"{t['topic']}: DATA LOST TO RETENTION: " + ", ".join(
                f"{x['ledger']}:{x['first']}..{x['last']}" for x in t["data_lost"]))
        lines.extend(_topic_lines(t, owner, st.get("currency", "USD")))
    if st.get("lakehouse"):
        lines.extend(_lakehouse_lines(st["lakehouse"], st.get("currency", "USD")))
    return "\n".join(lines)


def _topic_lines(t: dict[str, Any], owner: str, currency: str = "USD") -> list[str]:
    seg = t["segments"]
    live, rec = t.get("live"), t.get("status") or {}
    attempts = (live or rec).get("failed_attempts") or 0
    if t.get("owner_alive") is False:
        state = f"OWNER DEAD ({t.get('owner')} is not running; nothing offloads this topic)"
    elif failing(t):
        since = f" since {_when(rec.get('failing_since_ms'))}" if rec.get(
            "failing_since_ms") else ""
        state = f"FAILING ({attempts} failed attempt{'s' if attempts != 1 else ''}{since})"
    elif live is not None:
        state = "ok"
    elif rec.get("state") == "stopped":
        state = "stopped"
    else:
        state = rec.get("state") or "never offloaded by a daemon"
    last = t["last_offloaded"] or "-"
    at = f" at {_when(t.get('last_commit_ms'))}" if t.get("last_commit_ms") else ""
    out = [f"{t['topic']}: {state}; offloaded {seg['offloaded']} assigned {seg['assigned']} "
           f"last {last}{at}; {_lag_text(t.get('lag', {}))}{owner}"]
    if t.get("tier"):
        out.append("  " + _tier_text(t["tier"], currency))
    if t.get("policy"):
        out.extend(policy_lines(t["policy"]))
    if failing(t):
        error = (live or {}).get("last_error") or rec.get("last_error")
        if error:
            when = rec.get("last_error_ms") if rec.get("last_error") == error else None
            out.append(f"  last error{f' at {_when(when)}' if when else ''}: {error}")
    return out


def _per_gib(x: object) -> str:
    return f"{x:g}" if isinstance(x, int | float) else "-"


def _tier_text(tier: dict[str, Any], currency: str) -> str:
    unsized = tier.get("unsized_segments") or 0
    note = f" ({unsized} older segment(s) recorded no usage)" if unsized else ""
    return (f"tier: {tier['objects']} objects, {_size(tier['stored_bytes'])} stored for "
            f"{_size(tier['payload_bytes'])} payload; PUT-class "
            f"{_per_gib(tier['put_requests_per_gib'])}/GiB, GET-class "
            f"{_per_gib(tier['get_requests_per_gib'])}/GiB read; est. "
            f"{tier['monthly_cost']:.2f} {currency}/month{note}")


def _lakehouse_lines(lake: dict[str, Any], currency: str) -> list[str]:
    if "error" in lake:
        return [f"lakehouse: ERROR {lake['error']}"]
    wh = lake["warehouse"]
    out = [f"lakehouse warehouse {wh['location']}: {wh['files']} files, {_size(wh['bytes'])}; "
           f"est. {wh['monthly_cost']:.2f} {currency}/month"]
    for t in lake["tables"]:
        lag = ("lag unknown" if t["lag_entries"] is None else
               f"lag {t['lag_entries']} entries, {t['lag_seconds']:.0f} s")
        out.append(f"  {t['table']}: {t['rows']} rows in {t['data_files']} files "
                   f"({_size(t['data_bytes'])}), last snapshot "
                   f"{_when(t['last_snapshot_ms'])}, position {t['last_position'] or '-'}; "
                   f"{lag}{_read_committed(t)}")
    return out


def _read_committed(t: dict[str, Any]) -> str:
    """What read-committed kept out of a table, when it kept anything (docs/lakehouse.md)."""
    rc, held = t.get("read_committed") or {}, t.get("held_entries") or 0
    if not any(rc.values()) and not held:
        return ""
    return (f"; read-committed: {held} entries held, hidden {rc.get('markers', 0)} markers, "
            f"{rc.get('aborted_messages', 0)} aborted and {rc.get('timed_out_messages', 0)} "
            f"timed-out messages")


def _when(ms: object) -> str:
    if not isinstance(ms, int | float) or not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _size(n: object) -> str:
    if not isinstance(n, int | float):
        return "?"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"  # pragma: no cover


def _lag_text(lag: dict[str, Any]) -> str:
    if "error" in lag:
        return f"lag unknown ({lag['error']})"
    estimated = "" if lag.get("bytes_exact", True) else " (estimated)"
    return (f"lag {lag.get('entries', '?')} entries, {_size(lag.get('bytes'))}{estimated}, "
            f"{lag.get('seconds', 0):.0f} s")
