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

Over many topics (issue 22): the nodes are read in batches (:func:`topics_status`), and the
summary view (:func:`summarize`) gives counts by state, the worst lags and every failing topic;
``--topic`` and ``--namespace`` narrow the set.

Exit codes (:func:`exit_code`): 0 every topic offloads; 1 a topic is failing (its last attempt
or its recovery failed and nothing succeeded since, per the daemon or the persisted record), or
its metadata cannot be read, or a member of this host is a dead process (killed: its record
still says what it last wrote); 3 data was lost to retention; 2 is left to configuration
errors.
Never shows a secret.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import socket
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from offloadd import wiring
from offloadd.commit import cluster, epochs
from offloadd.commit.epochs import TopicState
from offloadd.config import Settings
from offloadd.errors import NotFound, OffloaddError
from offloadd.ledger.base import SourceView
from offloadd.ledger.local import LocalLedgerSource
from offloadd.metadata import managed_ledger, offload_status
from offloadd.metadata.base import BatchedReads, MetadataStore, Versioned
from offloadd.metadata.offload_status import OffloadStatus
from offloadd.model import FRAME_OVERHEAD, Position, TopicName, catalog
from offloadd.model.cost import Prices, topic_cost
from offloadd.model.hostport import connect_url
from offloadd.model.keys import (
    CONDITIONAL_WRITES,
    managed_ledger_path,
    offload_status_path,
    owner_path,
    topic_state_path,
)
from offloadd.model.losses import lost_ledgers
from offloadd.model.system_topics import is_system_topic
from offloadd.offload.lag import committed_payload_bytes, measure
from offloadd.shell.policies import policy_detail, policy_lines

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
                       now_ms: int | None = None, prices: Prices | None = None,
                       nodes: TopicNodes | None = None) -> dict[str, Any]:
    """One topic's status; ``nodes``: its metadata already read (:func:`read_nodes`), else it
    is read here."""
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    ml = topic.managed_ledger
    if nodes is None:
        out: dict[str, Any] = {"topic": str(topic), **await ownership_status(md, topic)}
    else:
        out = {"topic": str(topic), **_ownership_of(nodes, ml)}
    try:
        if nodes is None:
            rec = await offload_status.read(md, ml)
        else:
            rec = None if nodes.status is None else OffloadStatus.decode(
                nodes.status.data, offload_status_path(ml))
        out["status"] = rec.as_dict() if rec is not None else None
    except OffloaddError as exc:
        out["status"] = None
        out["status_error"] = str(exc)
    try:
        if nodes is None:
            info, _ = await managed_ledger.load(md, ml)
        elif nodes.ml is None:
            raise NotFound(f"metadata node {managed_ledger_path(ml)} does not exist")
        else:
            info = managed_ledger.decode(nodes.ml.data, managed_ledger_path(ml))
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
        if nodes is not None and isinstance(source.source, LocalLedgerSource):
            ledgers = source.source.ledgers_in(info)  # the record is read: no hop, no re-read
        else:
            ledgers = await source.source.ledgers(topic)
        if last is None:
            cbytes = None
        elif nodes is not None:  # many topics: no worker-thread hop each (see _payload_bytes)
            cbytes = _payload_bytes(source, last)
        else:
            cbytes = await committed_payload_bytes(source.offsets, last)
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


def _listed(managed_ledgers: Sequence[str], *, asked: bool) -> list[TopicName]:
    """The topics of these managed ledgers; Pulsar's system topics (never offloaded) only when
    asked for by name."""
    names = [TopicName.from_managed_ledger(n) for n in managed_ledgers]
    return names if asked else [n for n in names if not is_system_topic(n)]


async def collect(settings: Settings, topics: Sequence[TopicName] | None = None,
                  namespaces: Sequence[str] | None = None) -> dict[str, Any]:
    """What ``offloadd status`` shows: every topic's status (or those of ``topics``, of the
    ``namespaces`` ``tenant/ns``), the members, the running daemon's view."""
    md = await wiring.open_metadata(settings, read_only=True)  # status never writes
    src = wiring.connect_source(settings, md, read_only=True)
    try:
        names = _listed(await managed_ledger.list_names(md), asked=bool(topics))
        if topics:
            wanted = set(topics)
            missing = [str(t) for t in topics if t not in set(names)]
            if missing:
                raise OffloaddError(f"no such topic in the metadata store: "
                                    f"{', '.join(missing)}")
            names = [n for n in names if n in wanted]
        if namespaces:
            names = in_namespaces(names, namespaces)
        now_ms = int(time.time() * 1000)
        c = settings.cost
        prices = Prices(c.storage_per_gb_month, c.put_per_1000, c.get_per_1000)
        out_topics = await topics_status(md, src, names, now_ms, prices)
        if topics:  # the detail view: each policy value and where it comes from
            detail = await policy_detail(settings, src.source, names, md)
            for t in out_topics:
                t["policy"] = detail[t["topic"]]
        members = [_liveness(asdict(m)) for m in await cluster.read_members(md)]
        fence = await _conditional_writes(md)
        lake = await _lakehouse(settings, md, names, now_ms)
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
    if lake is not None:
        out["lakehouse"] = lake
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


async def _lakehouse(settings: Settings, md: MetadataStore, names: Sequence[TopicName],
                     now_ms: int) -> dict[str, Any] | None:
    """The tables and the warehouse (:mod:`offloadd.lakehouse.ops`) when the lakehouse is on or
    has a catalog; None without the extra or anything projected."""
    from offloadd import lakehouse
    from offloadd.errors import ConfigError

    try:
        lakehouse.require()
        from offloadd.lakehouse.ops import lakehouse_status

        out = await lakehouse_status(settings, md, names, now_ms)
    except ConfigError as exc:
        return {"error": str(exc)} if settings.lakehouse.enabled else None
    except Exception as exc:  # the catalog's or the warehouse's: shown, status goes on
        return {"error": f"{type(exc).__name__}: {exc}"}
    wh = out["warehouse"]
    wh["monthly_cost"] = round(wh["bytes"] / 2**30 * settings.cost.storage_per_gb_month, 4)
    return out


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
    try:
        with urllib.request.urlopen(connect_url(bind, "/status"), timeout=2) as resp:
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
    if st.get("lakehouse"):
        lines.extend(_lakehouse_lines(st["lakehouse"], st.get("currency", "USD")))
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
    if t.get("policy"):
        out.extend(policy_lines(t["policy"]))
    if failing(t):
        error = (live or {}).get("last_error") or rec.get("last_error")
        if error:
            when = rec.get("last_error_ms") if rec.get("last_error") == error else None
            out.append(f"  last error{f' at {_when(when)}' if when else ''}: {error}")
    return out


__all__ = ["EXIT_DATA_LOST", "EXIT_FAILING", "EXIT_OK", "Position", "collect", "exit_code",
           "failing", "in_namespaces", "read_nodes", "render_summary", "render_text",
           "summarize", "topic_state", "topic_status", "topics_status"]


# ---- many topics: batched reads, the summary view, filters (issue 22) --------------------------
# At 10,000 topics one status is 40,000 metadata reads and 10,000 source look-ups: read the
# nodes in batches (one SQLite transaction per batch, ZooKeeper reads pipelined) and ask the
# source for many topics at once; show counts, the worst lags and every failing topic rather
# than 20,000 lines.

# Topics at most whose metadata is read in one batch (4 nodes each).
READ_BATCH = 1000
# Source look-ups (ledger lists, offsets) outstanding at once.
SOURCE_CONCURRENCY = 32
# ``offloadd status`` in text shows the summary instead of every topic above this many topics
# (unless --all-topics or --topic).
SUMMARY_OVER = 50
TOP_LAG = 20


@dataclass(frozen=True)
class TopicNodes:
    """A topic's metadata nodes as read (None: absent)."""

    owner: Versioned | None
    state: Versioned | None
    status: Versioned | None
    ml: Versioned | None


def _node_paths(topic: TopicName) -> tuple[str, str, str, str]:
    ml = topic.managed_ledger
    return (owner_path(ml), topic_state_path(ml), offload_status_path(ml),
            managed_ledger_path(ml))


async def read_nodes(md: MetadataStore, topics: Sequence[TopicName]) -> list[TopicNodes]:
    """Every topic's four nodes, read in batches (:class:`BatchedReads`) or, from a store
    without the capability, many reads at once."""
    out: list[TopicNodes] = []
    gate = asyncio.Semaphore(SOURCE_CONCURRENCY)

    async def one(path: str) -> Versioned | None:
        async with gate:
            try:
                return await md.get(path)
            except NotFound:
                return None

    for start in range(0, len(topics), READ_BATCH):
        chunk = topics[start:start + READ_BATCH]
        paths = [p for t in chunk for p in _node_paths(t)]
        if isinstance(md, BatchedReads):
            got = await md.get_many(paths)
        else:
            got = list(await asyncio.gather(*(one(p) for p in paths)))
        out.extend(TopicNodes(*got[i:i + 4]) for i in range(0, len(got), 4))
    return out


def _ownership_of(nodes: TopicNodes, ml: str) -> dict[str, Any]:
    """:func:`ownership_status` from nodes already read."""
    out: dict[str, Any] = {"owner": None, "epoch": None}
    try:
        if nodes.owner is not None:
            out["owner"] = nodes.owner.data.decode()
        if nodes.state is not None:
            out["epoch"] = TopicState.decode(nodes.state.data, nodes.state.version,
                                             topic_state_path(ml)).epoch
    except (OffloaddError, UnicodeDecodeError) as exc:
        out["ownership_error"] = str(exc)
    return out


async def topics_status(md: MetadataStore, source: SourceView, topics: Sequence[TopicName],
                        now_ms: int, prices: Prices) -> list[dict[str, Any]]:
    """:func:`topic_status` of every topic, in order: the metadata read in batches, the source
    asked about ``SOURCE_CONCURRENCY`` topics at once. A batch that cannot be read is read
    topic by topic, so one bad node only marks its own topic."""
    try:
        nodes: Sequence[TopicNodes | None] = await read_nodes(md, topics)
    except OffloaddError:
        nodes = [None] * len(topics)
    gate = asyncio.Semaphore(SOURCE_CONCURRENCY)

    async def one(topic: TopicName, n: TopicNodes | None) -> dict[str, Any]:
        async with gate:
            return await topic_status(md, source, topic, now_ms, prices, nodes=n)

    return list(await asyncio.gather(*(one(t, n) for t, n in zip(topics, nodes, strict=True))))


def _payload_bytes(source: SourceView, committed: Position) -> int | None:
    """:func:`committed_payload_bytes` read in place (a small read of the offset index): at
    10,000 topics a worker-thread hop each cost ``status`` a tenth of its CPU time, and the
    command has nothing else to do meanwhile."""
    if source.offsets is None:
        return None
    n = committed.entry_id + 1
    try:
        frames = source.offsets.cumulative_bytes(committed.ledger_id, n)
    except (OffloaddError, OSError):
        return None
    return frames - FRAME_OVERHEAD * n


def in_namespaces(topics: Sequence[TopicName], namespaces: Sequence[str]) -> list[TopicName]:
    """The topics of the ``tenant/ns`` namespaces (``tenant/*`` for all of a tenant's)."""
    wanted = {n.strip("/") for n in namespaces}
    tenants = {n[:-2] for n in wanted if n.endswith("/*")}
    return [t for t in topics if t.ns in wanted or t.tenant in tenants]


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
