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

The daemon's ``/status`` is asked for at the start, beside the store's reads (at most
``DAEMON_TIMEOUT_S``): at 10,000 topics a busy daemon takes seconds to answer, and waiting for it
after the reads added those seconds to the command's.

Over many topics (issue 22): the nodes are read in batches (:func:`topics_status`), the topics
worked out one after the other with no task each, and the summary view
(:func:`~offloadd.shell.status_view.summarize`) gives counts by state, the worst lags and every
failing topic from two nodes a topic (``lean``: the status record and the managed ledger, no
owner or epoch, no tier cost); ``--topic`` and ``--namespace`` narrow the set. The lakehouse is
not imported unless it is on or has a catalog. What is shown, and how, is
:mod:`offloadd.shell.status_view`'s.

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
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
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
from offloadd.shell.policies import policy_detail
from offloadd.shell.status_view import (
    EXIT_DATA_LOST,
    EXIT_FAILING,
    EXIT_OK,
    SUMMARY_OVER,
    TOP_LAG,
    exit_code,
    failing,
    render_json,
    render_summary,
    render_text,
    summarize,
    topic_state,
)

__all__ = ["EXIT_DATA_LOST", "EXIT_FAILING", "EXIT_OK", "SUMMARY_OVER", "TOP_LAG", "Position",
           "collect", "exit_code", "failing", "in_namespaces", "read_nodes", "render_json",
           "render_summary", "render_text", "summarize", "topic_state", "topic_status",
           "topics_status"]

# At 10,000 topics one status is 20,000-40,000 metadata reads and 10,000 source look-ups: read
# the nodes in batches (SQLite ``IN`` queries in one transaction, ZooKeeper reads pipelined),
# work each topic out in place, and ask a remote source about many topics at once.

# Topics at most whose metadata is read in one batch (2 or 4 nodes each).
READ_BATCH = 1000
# Source look-ups (ledger lists) outstanding at once, for a source that is not local.
SOURCE_CONCURRENCY = 32
# How long the daemon's ``/status`` may take (asked for beside the store's reads).
DAEMON_TIMEOUT_S = 5.0


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
    is read here, node by node."""
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    if nodes is not None:
        out, info, last = _from_nodes(topic, nodes, now_ms, prices or Prices())
        if info is not None:
            if isinstance(source.source, LocalLedgerSource):
                _lag_in_place(out, source, source.source, info, last, now_ms)
            else:
                await _lag_asked(out, source, topic, last, now_ms)
        return out
    ml = topic.managed_ledger
    out = {"topic": str(topic), **await ownership_status(md, topic)}
    try:
        rec = await offload_status.read(md, ml)
        out["status"] = rec.as_dict() if rec is not None else None
    except OffloaddError as exc:
        out["status"] = None
        out["status_error"] = str(exc)
    try:
        info, _ = await managed_ledger.load(md, ml)
    except OffloaddError as exc:
        out["error"] = str(exc)
        return out
    last = _catalog_fields(out, info, now_ms, prices or Prices())
    try:
        ledgers = await source.source.ledgers(topic)
        cbytes = None if last is None else await committed_payload_bytes(source.offsets, last)
        out["lag"] = {**measure(ledgers, last, now_ms, committed_bytes=cbytes).as_dict(),
                      "measured_by": "status"}
    except OffloaddError as exc:
        out["lag"] = {"error": str(exc)}
    return out


def _catalog_fields(out: dict[str, Any], info: managed_ledger.ManagedLedgerInfo, now_ms: int,
                    prices: Prices | None) -> Position | None:
    """What the topic's catalog says (segments, last offloaded, the tier's cost unless
    ``prices`` is None, data lost) into ``out``; the last committed position."""
    segs = catalog.segments(info)
    done = [s for s in segs if s.complete]
    out["segments"] = {"offloaded": len(done), "assigned": len(segs) - len(done)}
    out["ledgers"] = len(info.ledgerInfo)
    last: Position | None = done[-1].end if done else None
    out["last_offloaded"] = str(last) if last else None
    out["last_commit_ms"] = done[-1].offloaded_ms or None if done else None
    out["entries_offloaded"] = sum(s.entries for s in done)
    if prices is not None:
        reads: dict[str, Any] = out.get("status") or {}
        out["tier"] = topic_cost(
            done, prices, now_ms, get_requests=int(reads.get("get_requests") or 0),
            get_bytes=int(reads.get("get_bytes") or 0), get_since_ms=reads.get("get_since_ms"),
        ).as_dict()
    lost = lost_ledgers(info)
    if lost:  # sidecar mode: entries Pulsar's retention deleted before offloadd took them
        out["data_lost"] = [{"ledger": x.ledger_id, "first": x.first, "last": x.last,
                             "entries": x.entries} for x in lost]
    return last


def _from_nodes(topic: TopicName, nodes: TopicNodes, now_ms: int, prices: Prices | None
                ) -> tuple[dict[str, Any], managed_ledger.ManagedLedgerInfo | None,
                           Position | None]:
    """The part of a topic's status its nodes give, its catalog (None: unreadable, the error
    is in the status) and its last committed position."""
    ml = topic.managed_ledger
    out: dict[str, Any] = {"topic": str(topic)}
    if not nodes.lean:
        out.update(_ownership_of(nodes, ml))
    try:
        rec = None if nodes.status is None else OffloadStatus.decode(
            nodes.status.data, offload_status_path(ml))
        out["status"] = rec.as_dict() if rec is not None else None
    except OffloaddError as exc:
        out["status"] = None
        out["status_error"] = str(exc)
    try:
        if nodes.ml is None:
            raise NotFound(f"metadata node {managed_ledger_path(ml)} does not exist")
        info = managed_ledger.decode(nodes.ml.data, managed_ledger_path(ml))
    except OffloaddError as exc:
        out["error"] = str(exc)
        return out, None, None
    return out, info, _catalog_fields(out, info, now_ms, None if nodes.lean else prices)


def _lag_in_place(out: dict[str, Any], view: SourceView, source: LocalLedgerSource,
                  info: managed_ledger.ManagedLedgerInfo, last: Position | None,
                  now_ms: int) -> None:
    """The lag from the embedded store's files, read in place: the record is already read (no
    second read), and a worker-thread hop a topic was a third of the command's time."""
    try:
        ledgers = source.ledgers_in(info)
        cbytes = None if last is None else _payload_bytes(view, last)
        out["lag"] = {**measure(ledgers, last, now_ms, committed_bytes=cbytes).as_dict(),
                      "measured_by": "status"}
    except OffloaddError as exc:
        out["lag"] = {"error": str(exc)}


async def _lag_asked(out: dict[str, Any], view: SourceView, topic: TopicName,
                     last: Position | None, now_ms: int) -> None:
    """The lag from a source that is asked (BookKeeper's ledger lists)."""
    try:
        ledgers = await view.source.ledgers(topic)
        cbytes = None if last is None else _payload_bytes(view, last)
        out["lag"] = {**measure(ledgers, last, now_ms, committed_bytes=cbytes).as_dict(),
                      "measured_by": "status"}
    except OffloaddError as exc:
        out["lag"] = {"error": str(exc)}


def _merge_live(t: dict[str, Any], live: dict[str, Any]) -> None:
    """The running daemon's view of a topic it owns: current attempts, error, lag."""
    t["live"] = live
    if isinstance(live.get("lag"), dict):
        t["lag"] = {**live["lag"], "measured_by": "daemon"}


def _listed(managed_ledgers: Sequence[str], *, asked: bool) -> list[TopicName]:
    """The topics of these managed ledgers; Pulsar's system topics (never offloaded) only when
    asked for by name."""
    names = [TopicName.from_managed_ledger(n) for n in managed_ledgers]
    return names if asked else [n for n in names if not is_system_topic(n)]


async def collect(settings: Settings, topics: Sequence[TopicName] | None = None,
                  namespaces: Sequence[str] | None = None, *,
                  lean_over: int | None = None) -> dict[str, Any]:
    """What ``offloadd status`` shows: every topic's status (or those of ``topics``, of the
    ``namespaces`` ``tenant/ns``), the members, the running daemon's view. ``lean_over``: with
    more topics than this, read only what the summary view shows (no owner, epoch or tier
    cost; None: everything)."""
    asking: asyncio.Task[dict[str, Any] | None] | None = None
    if settings.metrics.enabled:  # the daemon answers while the store is read
        asking = asyncio.ensure_future(_daemon_status(settings.metrics.bind))
    try:
        out = await _gather(settings, topics, namespaces, lean_over)
        if asking is not None:
            _merge_daemon(out, settings.metrics.bind, await asking)
    finally:
        if asking is not None and not asking.done():
            asking.cancel()
    return out


async def _gather(settings: Settings, topics: Sequence[TopicName] | None,
                  namespaces: Sequence[str] | None, lean_over: int | None) -> dict[str, Any]:
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
        lean = lean_over is not None and len(names) > lean_over
        out_topics = await topics_status(md, src, names, now_ms, prices, lean=lean)
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
    if dead:
        for t in out_topics:
            if _holder(t) in dead:  # its record says what the owner last wrote: stale now
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
    return out


def _holder(t: dict[str, Any]) -> object:
    """Who holds the topic: its owner node or, read lean (no owner node), the owner its status
    record names unless that owner let it go."""
    if "owner" in t:
        return t["owner"]
    rec = t.get("status") or {}
    return rec.get("owner") if rec.get("state") != "stopped" else None


def _merge_daemon(out: dict[str, Any], bind: str, daemon: dict[str, Any] | None) -> None:
    if daemon is not None and daemon.get("metadata") != out["metadata"]:
        # another deployment's daemon on this address: its view is not this one's
        out["other_daemon"] = {"bind": bind, "pid": daemon.get("pid"),
                               "metadata": daemon.get("metadata")}
        daemon = None
    out["daemon"] = daemon
    if daemon is None:
        return
    live = daemon.get("topics")
    live = live if isinstance(live, dict) else {}
    daemon["topics_owned"] = len(live)
    if live:
        for t in out["topics"]:
            mine = live.get(t["topic"])
            if isinstance(mine, dict):
                _merge_live(t, mine)


def _lakehouse_possible(settings: Settings) -> bool:
    """Whether there can be tables to show: the lakehouse is on, or a catalog exists (the
    default SQL catalog's file; another catalog only when configured). Decided without
    importing the lakehouse (pyiceberg: ~1 s of a one-shot command)."""
    lh = settings.lakehouse
    if lh.enabled or lh.catalog != "sql" or lh.catalog_uri:
        return True
    return (Path(lh.path) / "catalog.db").exists()


async def _lakehouse(settings: Settings, md: MetadataStore, names: Sequence[TopicName],
                     now_ms: int) -> dict[str, Any] | None:
    """The tables and the warehouse (:mod:`offloadd.lakehouse.ops`) when the lakehouse is on or
    has a catalog; None without the extra or anything projected."""
    if not _lakehouse_possible(settings):
        return None
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


async def _daemon_status(bind: str, timeout_s: float = DAEMON_TIMEOUT_S
                         ) -> dict[str, Any] | None:
    """The running daemon's live view (``/status`` on its metrics endpoint), if one answers
    within ``timeout_s``. Plain HTTP/1.0 on the event loop rather than urllib in a thread: a
    thread cannot be cancelled, and the command's exit would wait for it."""
    url = urllib.parse.urlsplit(connect_url(bind, "/status"))
    host, port = url.hostname or "127.0.0.1", url.port or 80
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(f"GET /status HTTP/1.0\r\nHost: {url.netloc}\r\n"
                             "Accept: application/json\r\n\r\n".encode())
                raw = await reader.read()  # HTTP/1.0: the server closes after the body
            finally:
                writer.close()
    except (OSError, TimeoutError):
        return None
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split()
    if len(status_line) < 2 or status_line[1] != b"200":
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


async def _conditional_writes(md: MetadataStore) -> dict[str, Any] | None:
    """The last daemon start-up's probe of the store's create-only writes (docs/s3.md)."""
    try:
        doc = json.loads((await md.get(CONDITIONAL_WRITES)).data)
    except (NotFound, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


# ---- many topics: batched reads, filters (issue 22) -----------------------------------------

@dataclass(frozen=True, slots=True)
class TopicNodes:
    """A topic's metadata nodes as read (None: absent). ``lean``: only the status record and
    the managed ledger were read (the summary view's), not the owner and topic-state nodes."""

    owner: Versioned | None
    state: Versioned | None
    status: Versioned | None
    ml: Versioned | None
    lean: bool = False


def _node_paths(topic: TopicName, lean: bool) -> tuple[str, ...]:
    ml = topic.managed_ledger
    if lean:
        return offload_status_path(ml), managed_ledger_path(ml)
    return (owner_path(ml), topic_state_path(ml), offload_status_path(ml),
            managed_ledger_path(ml))


async def read_nodes(md: MetadataStore, topics: Sequence[TopicName], *,
                     lean: bool = False) -> list[TopicNodes]:
    """Every topic's nodes (four, or two when ``lean``), read in batches
    (:class:`BatchedReads`) or, from a store without the capability, one after the other."""
    out: list[TopicNodes] = []
    for chunk in _chunks(topics, READ_BATCH):
        paths = [p for t in chunk for p in _node_paths(t, lean)]
        if isinstance(md, BatchedReads):
            got = await md.get_many(paths)
        else:
            got = [await _get_or_none(md, p) for p in paths]
        if lean:
            out.extend(TopicNodes(None, None, got[i], got[i + 1], lean=True)
                       for i in range(0, len(got), 2))
        else:
            out.extend(TopicNodes(got[i], got[i + 1], got[i + 2], got[i + 3])
                       for i in range(0, len(got), 4))
    return out


async def _get_or_none(md: MetadataStore, path: str) -> Versioned | None:
    try:
        return await md.get(path)
    except NotFound:
        return None


def _chunks(items: Sequence[TopicName], n: int) -> Iterator[Sequence[TopicName]]:
    for start in range(0, len(items), n):
        yield items[start:start + n]


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
                        now_ms: int, prices: Prices, *, lean: bool = False
                        ) -> list[dict[str, Any]]:
    """:func:`topic_status` of every topic, in order: the metadata read in batches and each
    topic worked out in place (the embedded store's files are read where they are); a source
    that must be asked (BookKeeper) is asked about ``SOURCE_CONCURRENCY`` topics at once, by as
    many workers, not a task a topic. A batch that cannot be read is read topic by topic, so
    one bad node only marks its own topic. ``lean``: the summary view's two nodes a topic."""
    try:
        nodes: Sequence[TopicNodes | None] = await read_nodes(md, topics, lean=lean)
    except OffloaddError:
        nodes = [None] * len(topics)
    local = source.source if isinstance(source.source, LocalLedgerSource) else None
    out: list[dict[str, Any]] = []
    later: list[tuple[int, TopicName, Position | None]] = []
    for topic, n in zip(topics, nodes, strict=True):
        if n is None:
            later.append((len(out), topic, None))
            out.append({})
            continue
        t, info, last = _from_nodes(topic, n, now_ms, prices)
        if info is not None:
            if local is not None:
                _lag_in_place(t, source, local, info, last, now_ms)
            else:
                later.append((len(out), topic, last))
        out.append(t)
    if later:
        work = iter(later)

        async def worker() -> None:
            for i, topic, last in work:  # the workers share the one iterator
                if out[i]:
                    await _lag_asked(out[i], source, topic, last, now_ms)
                else:
                    out[i] = await topic_status(md, source, topic, now_ms, prices)

        await asyncio.gather(*(worker() for _ in range(min(SOURCE_CONCURRENCY, len(later)))))
    return out


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
