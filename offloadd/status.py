"""``offloadd status``: per topic, segments by state, lag and the last offloaded position,
owner and fencing epoch; the cluster's live members. Read from the metadata store and the source
(no daemon needed). Never shows a secret."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from dataclasses import asdict
from typing import Any

from offloadd import catalog, cluster, wiring
from offloadd.config import Settings
from offloadd.errors import OffloaddError
from offloadd.ledger.bookkeeper.layout import lost_ledgers
from offloadd.metadata import managed_ledger, ownership
from offloadd.metadata.base import MetadataStore
from offloadd.model import Position, TopicName


async def ownership_status(md: MetadataStore, topic: TopicName) -> dict[str, Any]:
    """``owner`` (whose session holds the topic now, or None) and ``epoch`` (the latest handed
    out, None if never owned)."""
    ml = topic.managed_ledger
    out: dict[str, Any] = {"owner": None, "epoch": None}
    try:
        out["owner"] = await ownership.current_owner(md, ml)
        state = await ownership.read_state(md, ml)
        if state is not None:
            out["epoch"] = state.epoch
    except OffloaddError as exc:
        out["ownership_error"] = str(exc)
    return out


async def topic_status(md: MetadataStore, source: Any, topic: TopicName) -> dict[str, Any]:
    out: dict[str, Any] = {"topic": str(topic), **await ownership_status(md, topic)}
    try:
        info, _ = await managed_ledger.load(md, topic.managed_ledger)
    except OffloaddError as exc:
        out["error"] = str(exc)
        return out
    segs = catalog.segments(info)
    done = [s for s in segs if s.complete]
    out["segments"] = {"offloaded": len(done), "assigned": len(segs) - len(done)}
    out["ledgers"] = len(info.ledgerInfo)
    last = done[-1].end if done else None
    out["last_offloaded"] = str(last) if last else None
    out["entries_offloaded"] = sum(s.entries for s in done)
    lost = lost_ledgers(info)
    if lost:  # sidecar mode: entries Pulsar's retention deleted before offloadd took them
        out["data_lost"] = [{"ledger": x.ledger_id, "first": x.first, "last": x.last,
                             "entries": x.entries} for x in lost]
    lag_entries = 0
    lag_bytes = 0
    try:
        for d in await source.ledgers(topic):
            if last is None or d.ledger_id > last.ledger_id:
                lag_entries += d.entries
                lag_bytes += d.size
            elif d.ledger_id == last.ledger_id:
                lag_entries += max(d.last_entry_id - last.entry_id, 0)
        out["lag"] = {"entries": lag_entries, "bytes_at_least": lag_bytes}
    except OffloaddError as exc:
        out["lag"] = {"error": str(exc)}
    return out


async def collect(settings: Settings) -> dict[str, Any]:
    md = await wiring.open_metadata(settings)
    src = wiring.open_source(settings, md, read_only=True)
    try:
        names = await managed_ledger.list_names(md)
        topics = [await topic_status(md, src, TopicName.from_managed_ledger(n)) for n in names]
        members = [asdict(m) for m in await cluster.read_members(md)]
    finally:
        await src.close()
        await md.close()
    out: dict[str, Any] = {"metadata": _redact_url(settings.metadata.url),
                           "driver": settings.blobstore.driver, "members": members,
                           "topics": topics}
    if settings.metrics.enabled:
        out["daemon"] = await asyncio.to_thread(_daemon_status, settings.metrics.bind)
    return out


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


def _redact_url(url: str) -> str:
    # zk://user:secret@host is not a form we accept, but never echo credentials anyway
    head, sep, tail = url.partition("@")
    return f"{head.split('//')[0]}//***@{tail}" if sep else url


def render_text(st: dict[str, Any]) -> str:
    lines = [f"metadata {st['metadata']}  driver {st['driver']}"]
    d = st.get("daemon")
    if d:
        lines.append(f"daemon pid {d.get('pid')} {d.get('state')}: store circuit "
                     f"{d.get('store_circuit')}, buffer {d['buffer']['used']}/"
                     f"{d['buffer']['cap']} bytes, {len(d.get('topics', {}))} topic(s) owned")
    if st.get("members"):
        lines.append("members " + ", ".join(m["owner"] for m in st["members"]))
    for t in st["topics"]:
        owner = (f" owner {t.get('owner') or '-'} epoch {t['epoch']}"
                 if t.get("epoch") is not None else "")
        if "error" in t:
            lines.append(f"{t['topic']}: ERROR {t['error']}{owner}")
            continue
        seg = t["segments"]
        lag = t.get("lag", {})
        if t.get("data_lost"):
            lines.append(f"{t['topic']}: DATA LOST TO RETENTION: " + ", ".join(
                f"{x['ledger']}:{x['first']}..{x['last']}" for x in t["data_lost"]))
        lines.append(
            f"{t['topic']}: offloaded {seg['offloaded']} assigned {seg['assigned']} "
            f"last {t['last_offloaded']} lag {lag.get('entries', '?')} entries{owner}")
    return "\n".join(lines)


__all__ = ["Position", "collect", "render_text", "topic_status"]
