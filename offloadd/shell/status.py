"""``offloadd status``: per topic, whether offload works, how far it trails, what failed last.

Read from the metadata store and the source, so it works with no daemon running:

* the catalog: segments by state, the last committed position and when it was committed;
* the topic's persisted offload status (``/offloadd/status/<ml>``, written by its owner:
  :mod:`offloadd.metadata.offload_status`): ``ok`` / ``failing`` / ``stopped``, failing attempts
  and since when, the last error and its time, the last success;
* lag from the last committed position to the source's LAC (:func:`offloadd.offload.lag.measure`;
  without the daemon's LAC history the age is its ledger's, an upper bound);
* data lost to retention (sidecar mode), owner and fencing epoch, the cluster's members;
* the tier's cost (:mod:`offloadd.model.cost`): objects, stored and payload bytes, PUT-class and
  GET-class requests per GiB, and a monthly estimate at ``[cost]`` prices — from the usage each
  committed segment recorded and the status record's read requests: no request to the bucket.

When the daemon answers on its metrics endpoint, its live view of the topics it owns wins
(``/status``): its lag is the figure its ``/metrics`` exports at the same moment, and its failing
attempts are current.

Exit codes (:func:`exit_code`): 0 every topic offloads; 1 a topic is failing (its last attempt
or its recovery failed and nothing succeeded since, per the daemon or the persisted record), or
its metadata cannot be read, or a member of this host is a dead process (killed: its record
still says what it last wrote); 3 data was lost to retention; 2 is left to configuration
errors.
Never shows a secret.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from offloadd import wiring
from offloadd.commit import cluster, epochs
from offloadd.config import Settings
from offloadd.errors import NotFound, OffloaddError
from offloadd.ledger.base import SourceView
from offloadd.metadata import managed_ledger, offload_status
from offloadd.metadata.base import MetadataStore
from offloadd.model import Position, TopicName, catalog
from offloadd.model.cost import Prices, topic_cost
from offloadd.model.keys import CONDITIONAL_WRITES
from offloadd.model.losses import lost_ledgers
from offloadd.offload.lag import committed_payload_bytes, measure

EXIT_OK, EXIT_FAILING, EXIT_DATA_LOST = 0, 1, 3


async def ownership_status(md: MetadataStore, topic: TopicName) -> dict[str, Any]:
    """``owner`` (whose session holds the topic now, or None) and ``epoch`` (the latest handed
    out, None if never owned)."""
    ml = topic.managed_ledger
    out: dict[str, Any] = {"owner": None, "epoch": None}
    try:
        out["owner"] = await epochs.current_owner(md, ml)
        state = await epochs.read_state(md, ml)
        if state is not None:
            out["epoch"] = state.epoch
    except OffloaddError as exc:
        out["ownership_error"] = str(exc)
    return out


async def topic_status(md: MetadataStore, source: SourceView, topic: TopicName,
                       now_ms: int | None = None, prices: Prices | None = None
                       ) -> dict[str, Any]:
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    out: dict[str, Any] = {"topic": str(topic), **await ownership_status(md, topic)}
    try:
        rec = await offload_status.read(md, topic.managed_ledger)
        out["status"] = rec.as_dict() if rec is not None else None
    except OffloaddError as exc:
        out["status"] = None
        out["status_error"] = str(exc)
    try:
        info, _ = await managed_ledger.load(md, topic.managed_ledger)
    except OffloaddError as exc:
        out["error"] = str(exc)
        return out
    segs = catalog.segments(info)
    done = [s for s in segs if s.complete]
    out["segments"] = {"offloaded": len(done), "assigned": len(segs) - len(done)}
    out["ledgers"] = len(info.ledgerInfo)
    last: Position | None = done[-1].end if done else None
    out["last_offloaded"] = str(last) if last else None
    out["last_commit_ms"] = done[-1].offloaded_ms or None if done else None
    out["entries_offloaded"] = sum(s.entries for s in done)
    reads: dict[str, Any] = out.get("status") or {}
    out["tier"] = topic_cost(
        done, prices or Prices(), now_ms, get_requests=int(reads.get("get_requests") or 0),
        get_bytes=int(reads.get("get_bytes") or 0), get_since_ms=reads.get("get_since_ms"),
    ).as_dict()
    lost = lost_ledgers(info)
    if lost:  # sidecar mode: entries Pulsar's retention deleted before offloadd took them
        out["data_lost"] = [{"ledger": x.ledger_id, "first": x.first, "last": x.last,
                             "entries": x.entries} for x in lost]
    try:
        ledgers = await source.source.ledgers(topic)
        cbytes = await committed_payload_bytes(source.offsets, last) if last is not None else None
        lag = measure(ledgers, last, now_ms, committed_bytes=cbytes)
        out["lag"] = {**lag.as_dict(), "measured_by": "status"}
    except OffloaddError as exc:
        out["lag"] = {"error": str(exc)}
    return out


def _merge_live(t: dict[str, Any], live: dict[str, Any]) -> None:
    """The running daemon's view of a topic it owns: current attempts, error, lag."""
    t["live"] = live
    if isinstance(live.get("lag"), dict):
        t["lag"] = {**live["lag"], "measured_by": "daemon"}


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


async def collect(settings: Settings, topics: Sequence[TopicName] | None = None
                  ) -> dict[str, Any]:
    md = await wiring.open_metadata(settings, read_only=True)  # status never writes
    src = wiring.connect_source(settings, md, read_only=True)
    try:
        names = [TopicName.from_managed_ledger(n) for n in await managed_ledger.list_names(md)]
        if topics:
            wanted = set(topics)
            missing = [str(t) for t in topics if t not in set(names)]
            if missing:
                raise OffloaddError(f"no such topic in the metadata store: "
                                    f"{', '.join(missing)}")
            names = [n for n in names if n in wanted]
        now_ms = int(time.time() * 1000)
        c = settings.cost
        prices = Prices(c.storage_per_gb_month, c.put_per_1000, c.get_per_1000)
        out_topics = [await topic_status(md, src, n, now_ms, prices) for n in names]
        members = [_liveness(asdict(m)) for m in await cluster.read_members(md)]
        fence = await _conditional_writes(md)
        source = wiring.source_status(settings, src.source)
    finally:
        await src.source.close()
        await md.close()
    dead = {m["owner"] for m in members if m.get("alive") is False}
    for t in out_topics:
        if t.get("owner") in dead:  # its record says what the owner last wrote: stale now
            t["owner_alive"] = False
    out: dict[str, Any] = {"metadata": wiring.deployment(settings),
                           "driver": settings.blobstore.driver, "members": members,
                           "currency": settings.cost.currency, "topics": out_topics}
    if fence is not None:
        out["conditional_writes"] = fence
    if source is not None:
        out["source"] = source
    if settings.metrics.enabled:
        daemon = await asyncio.to_thread(_daemon_status, settings.metrics.bind)
        if daemon is not None and daemon.get("metadata") != out["metadata"]:
            # another deployment's daemon on this address: its view is not this one's
            out["other_daemon"] = {"bind": settings.metrics.bind, "pid": daemon.get("pid"),
                                   "metadata": daemon.get("metadata")}
            daemon = None
        out["daemon"] = daemon
        live = (daemon or {}).get("topics") or {}
        for t in out_topics:
            if isinstance(live.get(t["topic"]), dict):
                _merge_live(t, live[t["topic"]])
    return out


def _liveness(member: dict[str, Any]) -> dict[str, Any]:
    """``alive``: whether a member of this host still runs (its pid, not a zombie). A member
    outlives its process where nothing ends its session: the embedded store reaps it only on
    its next write, which a read-only status never makes. Other hosts' members are left as
    they are (ZooKeeper ends their sessions)."""
    from offloadd.metadata.embedded.owners import alive

    pid = member.get("pid")
    if member.get("host") == socket.gethostname() and isinstance(pid, int):
        member["alive"] = alive(pid, None)
    return member


def _daemon_status(bind: str) -> dict[str, Any] | None:
    """The running daemon's live view (``/status`` on its metrics endpoint), if one answers."""
    host, _, port = bind.rpartition(":")
    if host in ("0.0.0.0", "", "[::]"):
        host = "127.0.0.1"
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/status", timeout=2) as resp:
            data = json.loads(resp.read())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


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


async def _conditional_writes(md: MetadataStore) -> dict[str, Any] | None:
    """The last daemon start-up's probe of the store's create-only writes (docs/s3.md)."""
    try:
        doc = json.loads((await md.get(CONDITIONAL_WRITES)).data)
    except (NotFound, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def render_text(st: dict[str, Any]) -> str:
    lines = [f"metadata {st['metadata']}  driver {st['driver']}"]
    d = st.get("daemon")
    if d:
        store = d.get("store_circuit")
        if d.get("store_ready") is False:
            store = f"{store}, NOT READY: {d.get('store_reason')}"
        lines.append(f"daemon pid {d.get('pid')} {d.get('state')}: store circuit "
                     f"{store}, buffer {d['buffer']['used']}/"
                     f"{d['buffer']['cap']} bytes, {len(d.get('topics', {}))} topic(s) owned")
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
    return "\n".join(lines)


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
    if failing(t):
        error = (live or {}).get("last_error") or rec.get("last_error")
        if error:
            when = rec.get("last_error_ms") if rec.get("last_error") == error else None
            out.append(f"  last error{f' at {_when(when)}' if when else ''}: {error}")
    return out


__all__ = ["EXIT_DATA_LOST", "EXIT_FAILING", "EXIT_OK", "Position", "collect", "exit_code",
           "failing", "render_text", "topic_status"]
