"""Reading entries from bookies over protocol v3, on asyncio.

One TCP connection per bookie, opened on first use and re-opened after a failure. Requests carry
a fresh ``txnId`` each and many are in flight on a connection at once; responses are matched by
``txnId`` (a late answer to a request already given up is dropped). Reads go out in batches:
one ``writelines`` of many frames, one future per batch, no per-entry task.

Replica choice, in the spirit of BookKeeper's reorder-read. For each entry the candidates are
its write set; they are ranked by :func:`order_replicas`::

    healthy before quarantined (failed or timed out within ``quarantine_s``)
    before slow (latency EWMA > slow_factor × the best bookie's, and > slow_floor_s)
    local zone before remote (``zones`` maps bookie → zone; ``local_zone`` is ours)
    fewest reads in flight
    write-set order

A batch spreads entries over the equally-ranked best bookies by reads in flight. An entry that
fails (error status, timeout, lost connection, digest mismatch) is re-sent to the next untried
bookie of its write set. When every bookie answered "no such entry" the caller's metadata may be
stale (an ensemble change), so it is re-read once before giving up with ``NotFound``; all digests
wrong gives ``DigestError`` (a ``FormatError``); anything else ``Retriable``.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, cast

from offloadd.errors import FormatError, NotFound, Retriable
from offloadd.ledger.bookkeeper.codec import (
    LAST_ADD_CONFIRMED,
    MAX_FRAME,
    Digest,
    DigestError,
    Entry,
    Flag,
    ReadRequest,
    ReadResponse,
    Request,
    Response,
    Status,
    decode_entry,
    decode_response,
    encode_plain_reads,
    encode_read_request,
    encode_request,
    split_frames,
    status_name,
)
from offloadd.ledger.bookkeeper.layout import LedgerMetadata
from offloadd.ledger.bookkeeper.metrics import BookKeeperMetrics

log = logging.getLogger(__name__)

__all__ = [
    "BookieClient",
    "BookieError",
    "BookieHealth",
    "ClientOptions",
    "LedgerContext",
    "order_replicas",
]

_U32 = struct.Struct(">I")
_NOT_THERE = (Status.ENOENTRY, Status.ENOLEDGER)
_EWMA_ALPHA = 0.2


class BookieError(Retriable):
    """A request to one bookie failed; ``reason`` is a short label (metrics, decisions)."""

    def __init__(self, bookie: str, reason: str, detail: str = "") -> None:
        self.bookie = bookie
        self.reason = reason
        super().__init__(f"bookie {bookie}: {reason}{': ' + detail if detail else ''}")


@dataclass(frozen=True)
class ClientOptions:
    read_timeout_s: float = 10.0
    connect_timeout_s: float = 5.0
    quarantine_s: float = 10.0
    slow_factor: float = 4.0
    slow_floor_s: float = 0.05
    local_zone: str | None = None
    zones: Mapping[str, str] = field(default_factory=dict)


@dataclass
class BookieHealth:
    ewma_s: float | None = None
    down_until: float = 0.0
    failures: int = 0


def order_replicas(candidates: Sequence[str], *, now: float, pending: Mapping[str, int],
                   health: Mapping[str, BookieHealth], slow: Callable[[str], bool],
                   local_zone: str | None, zones: Mapping[str, str]) -> list[str]:
    """Rank a write set for one read (see the module docstring); pure."""

    def key(item: tuple[int, str]) -> tuple[bool, bool, bool, int, int]:
        pos, b = item
        h = health.get(b)
        down = h is not None and h.down_until > now
        remote = local_zone is not None and zones.get(b) != local_zone
        return down, slow(b), remote, pending.get(b, 0), pos

    return [b for _, b in sorted(enumerate(candidates), key=key)]


class LedgerContext(Protocol):
    """What a read needs to know about its ledger (the source's ledger state)."""

    ledger_id: int
    meta: LedgerMetadata
    digest: Digest

    async def refresh(self) -> bool:
        """Re-read the ledger's metadata; True if its ensembles changed."""
        ...


# ---- one connection ---------------------------------------------------------------------------


class _Sink:
    """Collects the responses of one batch (or one request) into slots."""

    __slots__ = ("future", "remaining", "results")

    def __init__(self, n: int, future: asyncio.Future[None]) -> None:
        self.results: list[Response | BookieError | None] = [None] * n
        self.remaining = n
        self.future = future
        if n == 0:  # nothing to wait for: a sink of no requests must never hang its waiter
            future.set_result(None)

    def deliver(self, slot: int, result: Response | BookieError) -> None:
        if self.results[slot] is not None:
            return
        self.results[slot] = result
        self.remaining -= 1
        if self.remaining == 0 and not self.future.done():
            self.future.set_result(None)


class _Connection(asyncio.Protocol):
    def __init__(self, addr: str) -> None:
        self.addr = addr
        self.transport: asyncio.Transport | None = None
        self.pending: dict[int, tuple[_Sink, int]] = {}
        self.closed = False
        self._chunks: list[memoryview] = []
        self._have = 0
        self._need = 4

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        # Whole frames are handed on as views of ``data``. A frame split across reads is
        # joined alone, at its exact size: joining whole reads would allocate (and page-fault
        # in) buffers above malloc's mmap threshold for every large entry.
        try:
            view = memoryview(data)
            while self._chunks:
                missing = self._need - self._have
                if len(view) < missing:
                    self._chunks.append(view)
                    self._have += len(view)
                    return
                self._chunks.append(view[:missing])
                view = view[missing:]
                buf = memoryview(b"".join(self._chunks))
                self._chunks = []
                self._have = 0
                if self._need == 4:  # only the length prefix was incomplete
                    self._start(buf)
                else:
                    self._need = 4
                    self._dispatch(buf[4:])
            frames, used = split_frames(view, f"bookie {self.addr}")
            for f in frames:
                self._dispatch(f)
            if used < len(view):
                self._start(view[used:])
        except FormatError as exc:
            log.error("bookie %s sent bytes that do not parse (%s); dropping the connection",
                      self.addr, exc)
            self._fail(BookieError(self.addr, "protocol", str(exc)))
            if self.transport is not None:
                self.transport.abort()

    def _start(self, part: memoryview) -> None:
        """Keep the beginning of a frame until the rest arrives."""
        self._chunks = [part]
        self._have = len(part)
        if len(part) < 4:
            self._need = 4
            return
        (n,) = _U32.unpack_from(part)
        if n > MAX_FRAME:
            raise FormatError(f"bookie {self.addr}", 0, f"frame of {n} bytes exceeds the "
                              f"{MAX_FRAME} limit")
        self._need = 4 + n
        if self._have >= self._need:  # a whole frame after a completed length prefix
            self._chunks = []
            self._have = 0
            rest = part[self._need:]
            self._need = 4
            self._dispatch(part[4:4 + n])
            if rest:
                frames, used = split_frames(rest, f"bookie {self.addr}")
                for f in frames:
                    self._dispatch(f)
                if used < len(rest):
                    self._start(rest[used:])

    def _dispatch(self, payload: memoryview) -> None:
        resp = decode_response(payload, f"response from bookie {self.addr}")
        waiter = self.pending.pop(resp.txn_id, None)
        if waiter is not None:
            waiter[0].deliver(waiter[1], resp)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(BookieError(self.addr, "connection", f"connection lost ({exc or 'closed'})"))

    def _fail(self, err: BookieError) -> None:
        self.closed = True
        pending, self.pending = self.pending, {}
        for sink, slot in pending.values():
            sink.deliver(slot, err)

    def send(self, data: bytes, first_txn: int, sink: _Sink, n: int) -> None:
        if self.closed or self.transport is None or self.transport.is_closing():
            raise BookieError(self.addr, "connection", "connection is closed")
        for slot in range(n):
            self.pending[first_txn + slot] = (sink, slot)
        self.transport.write(data)

    def forget(self, first_txn: int, n: int) -> None:
        for txn in range(first_txn, first_txn + n):
            self.pending.pop(txn, None)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


def _split_addr(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise BookieError(addr, "address", "bookie ids must be host:port")
    return host.strip("[]"), int(port)


# ---- the client -------------------------------------------------------------------------------


@dataclass
class _Plan:
    by_bookie: dict[str, list[int]]  # bookie -> indexes (from the first entry), ascending
    assigned: set[int]


def _failure(addr: str, r: Response | BookieError | None) -> tuple[str, str]:
    """(reason, detail) of a read that did not return a good entry."""
    if isinstance(r, BookieError):
        return r.reason, str(r)
    if not isinstance(r, ReadResponse):
        return "protocol", f"{addr}: answer {r!r} to a read"
    status = r.status if r.status != Status.EOK else (r.read_status or 0)
    if status == Status.EOK:
        return "protocol", f"{addr}: EOK without a body"
    reason = "noentry" if status in _NOT_THERE else status_name(status).lower()
    return reason, f"{addr}: {status_name(status)}"


def _water_fill(n: int, bookies: Sequence[str], pend: Mapping[str, int]
                ) -> list[tuple[str, int]]:
    """Split ``n`` reads over equally good bookies so their reads in flight end up as even
    as possible (the least loaded get more)."""
    if len(bookies) == 1:
        return [(bookies[0], n)]
    loads = sorted((pend.get(b, 0), i, b) for i, b in enumerate(bookies))
    level, active, left = loads[0][0], 1, n
    while active < len(loads) and (loads[active][0] - level) * active < left:
        left -= (loads[active][0] - level) * active
        level = loads[active][0]
        active += 1
    q, r = divmod(left, active)
    out = []
    for j, (load, _, b) in enumerate(loads[:active]):
        out.append((b, level - load + q + (1 if j < r else 0)))
    return out


class BookieClient:
    """Connections to every bookie this process reads from, shared by all topics."""

    def __init__(self, options: ClientOptions | None = None,
                 metrics: BookKeeperMetrics | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.options = options or ClientOptions()
        self.metrics = metrics or BookKeeperMetrics()
        self._clock = clock
        self._conns: dict[str, _Connection] = {}
        self._connecting: dict[str, asyncio.Future[_Connection]] = {}
        self._next_txn = 1
        self.pending: defaultdict[str, int] = defaultdict(int)
        self.health: defaultdict[str, BookieHealth] = defaultdict(BookieHealth)
        self._closed = False

    # ---- connections ---------------------------------------------------------------------
    async def _connection(self, addr: str) -> _Connection:
        if self._closed:
            raise BookieError(addr, "closed", "the bookie client is closed")
        conn = self._conns.get(addr)
        if conn is not None and not conn.closed:
            return conn
        fut = self._connecting.get(addr)
        if fut is None:
            fut = asyncio.ensure_future(self._connect(addr))
            self._connecting[addr] = fut
            fut.add_done_callback(lambda _: self._connecting.pop(addr, None))
        return await asyncio.shield(fut)

    async def _connect(self, addr: str) -> _Connection:
        host, port = _split_addr(addr)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.options.connect_timeout_s):
                _, conn = await loop.create_connection(lambda: _Connection(addr), host, port)
        except (OSError, TimeoutError) as exc:
            self._mark_down(addr, "connect")
            raise BookieError(addr, "connect", str(exc) or type(exc).__name__) from None
        self._conns[addr] = conn
        return conn

    def _mark_down(self, addr: str, reason: str) -> None:
        """Ask ``addr`` last for ``quarantine_s``. A healthy bookie going into quarantine is
        counted and logged (a failure while already quarantined only extends it)."""
        h = self.health[addr]
        h.failures += 1
        now = self._clock()
        if h.down_until <= now and self.options.quarantine_s > 0:
            self.metrics.quarantine(addr, reason)
            log.warning("bookie %s quarantined for %gs (%s): other replicas are asked first",
                        addr, self.options.quarantine_s, reason)
        h.down_until = now + self.options.quarantine_s

    def is_down(self, addr: str) -> bool:
        """Failed (error, timeout, refused connection) within the last ``quarantine_s``."""
        h = self.health.get(addr)
        return h is not None and h.down_until > self._clock()

    def is_slow(self, addr: str) -> bool:
        h = self.health.get(addr)
        if h is None or h.ewma_s is None or h.ewma_s <= self.options.slow_floor_s:
            return False
        best = min((x.ewma_s for x in self.health.values() if x.ewma_s is not None),
                   default=h.ewma_s)
        return h.ewma_s > self.options.slow_factor * best

    def _observe(self, addr: str, latency: float) -> None:
        h = self.health[addr]
        h.ewma_s = latency if h.ewma_s is None else \
            h.ewma_s + _EWMA_ALPHA * (latency - h.ewma_s)
        if h.failures:
            h.failures = 0
        self.metrics.set_slow(addr, self.is_slow(addr))

    def order(self, candidates: Sequence[str], pending: Mapping[str, int] | None = None
              ) -> list[str]:
        o = self.options
        return order_replicas(candidates, now=self._clock(),
                              pending=self.pending if pending is None else pending,
                              health=self.health, slow=self.is_slow, local_zone=o.local_zone,
                              zones=o.zones)

    def _take_txns(self, n: int) -> int:
        first = self._next_txn
        self._next_txn += n
        return first

    # ---- raw requests --------------------------------------------------------------------
    async def _send(self, addr: str, data: bytes, n: int, first_txn: int,
                    timeout: float) -> list[Response | BookieError]:
        """Send ``n`` framed requests with txnIds ``first_txn..``; one result per request."""
        if n == 0:
            return []
        try:
            conn = await self._connection(addr)
        except BookieError as exc:
            return [exc] * n
        loop = asyncio.get_running_loop()
        sink = _Sink(n, loop.create_future())
        self.pending[addr] += n
        self.metrics.set_pending(addr, self.pending[addr])
        try:
            conn.send(data, first_txn, sink, n)
            try:
                async with asyncio.timeout(timeout):
                    await sink.future
            except TimeoutError:
                conn.forget(first_txn, n)
                late = sum(1 for r in sink.results if r is None)
                err = BookieError(addr, "timeout", f"{late} of {n} reads unanswered after "
                                  f"{timeout:g}s")
                for slot in range(n):
                    sink.deliver(slot, err)
                self._mark_down(addr, "timeout")
        except BookieError as exc:
            conn.forget(first_txn, n)
            for slot in range(n):
                sink.deliver(slot, exc)
        finally:
            if not sink.future.done():  # cancelled: late answers must find nobody
                conn.forget(first_txn, n)
            self.pending[addr] -= n
            self.metrics.set_pending(addr, self.pending[addr])
        results = [r for r in sink.results if r is not None]
        if any(isinstance(r, BookieError) and r.reason == "connection" for r in results):
            self._mark_down(addr, "connection")
        return results

    async def call(self, addr: str, request: Callable[[int], Request],
                   timeout: float | None = None) -> Response:
        """One request (built with the txnId given) and its response; ``BookieError`` on
        failure."""
        txn = self._take_txns(1)
        req = request(txn)
        data = encode_read_request(req) if isinstance(req, ReadRequest) else encode_request(req)
        (result,) = await self._send(addr, data, 1, txn,
                                     self.options.read_timeout_s if timeout is None else timeout)
        if isinstance(result, BookieError):
            raise result
        return result

    # ---- reads ---------------------------------------------------------------------------
    async def _read_on(self, addr: str, ctx: LedgerContext, entry_ids: list[int]
                       ) -> tuple[list[Entry | None], dict[int, tuple[str, str]], int]:
        """Read ``entry_ids`` from one bookie: the entries (None where it failed), the
        failures by position (reason, detail) and the best LAC hint."""
        n = len(entry_ids)
        if n == 0:
            return [], {}, -1
        first_txn = self._take_txns(n)
        data = encode_plain_reads(first_txn, ctx.ledger_id, entry_ids)
        t0 = self._clock()
        results = await self._send(addr, data, n, first_txn, self.options.read_timeout_s)
        elapsed = self._clock() - t0
        got: list[Entry | None] = [None] * n
        failed: dict[int, tuple[str, str]] = {}
        lac = -1
        ok_bytes = 0
        digest = ctx.digest
        ledger_id = ctx.ledger_id
        for k, r in enumerate(results):
            if r.__class__ is ReadResponse and r.status == 0 and r.read_status == 0 \
                    and r.body is not None:
                try:
                    entry = decode_entry(r.body, digest, ledger_id=ledger_id,
                                         entry_id=entry_ids[k])
                except DigestError as exc:
                    failed[k] = ("digest", f"{addr}: {exc}")
                    continue
                except FormatError as exc:
                    failed[k] = ("format", f"{addr}: {exc}")
                    continue
                got[k] = entry
                ok_bytes += len(entry.payload)
                if r.max_lac is not None and r.max_lac > lac:
                    lac = r.max_lac
            else:
                failed[k] = _failure(addr, r)
        if got and got[-1] is not None and got[-1].lac > lac:
            lac = got[-1].lac
        ok = n - len(failed)
        if ok:
            self.metrics.entries_read(addr, ok, ok_bytes, elapsed * ok)
            self._observe(addr, elapsed)
        return got, failed, lac

    async def read_entries(self, ctx: LedgerContext, first: int, last: int
                           ) -> tuple[list[Entry], int]:
        """Entries ``first..last`` (all must exist), verified; plus the highest LAC learnt
        from their headers and the bookies' ``maxLAC``."""
        n = last - first + 1
        out: list[Entry | None] = [None] * n
        tried: dict[int, set[str]] = {}  # only for entries that failed somewhere
        failures: dict[int, list[tuple[str, str, str]]] = {}
        refreshed = False
        lac = -1
        todo: list[int] | None = None  # None: first round, grouped by write set
        while True:
            plan = self._plan(ctx, first, last, todo, tried)
            exhausted = [i for i in (todo or []) if i not in plan.assigned]
            if exhausted:
                if not refreshed and all(r == "noentry" for i in exhausted
                                         for _, r, _ in failures.get(i, [])):
                    refreshed = True
                    if await ctx.refresh():  # an ensemble change: ask the new write sets
                        for i in todo or []:
                            tried.pop(i, None)
                        continue
                raise self._give_up(ctx, first, exhausted, failures)
            if not plan.by_bookie:
                break
            results = await asyncio.gather(*(self._read_on(b, ctx, [first + i for i in idxs])
                                             for b, idxs in plan.by_bookie.items()))
            todo = []
            for (b, idxs), (got, failed, hint) in zip(plan.by_bookie.items(), results,
                                                      strict=True):
                if hint > lac:
                    lac = hint
                if not failed:
                    for i, e in zip(idxs, got, strict=True):
                        out[i] = e
                    continue
                for k, i in enumerate(idxs):
                    if k not in failed:
                        out[i] = got[k]
                        continue
                    reason, detail = failed[k]
                    tried.setdefault(i, set()).add(b)
                    failures.setdefault(i, []).append((b, reason, detail))
                    self.metrics.failover(b, reason)
                    todo.append(i)
            if not todo:
                break
            self.metrics.retry(len(todo))
            log.debug("ledger %d: %d reads failed, trying other replicas", ctx.ledger_id,
                      len(todo))
        return out, lac  # type: ignore[return-value]

    def _plan(self, ctx: LedgerContext, first: int, last: int, todo: list[int] | None,
              tried: dict[int, set[str]]) -> _Plan:
        """Assign each entry to read (by index from ``first``) to a bookie."""
        pend = dict(self.pending)
        by_bookie: dict[str, list[int]] = defaultdict(list)
        assigned: set[int] = set()
        meta = ctx.meta
        if todo is None:
            for ws, ids in meta.write_set_groups(first, last).items():
                ranked = self.order(ws, pend)
                top = self._rank(ranked[0])
                best = [b for b in ranked if self._rank(b) == top]
                pos = 0
                for b, count in _water_fill(len(ids), best, pend):
                    if count == 0:
                        continue  # an empty read would wait for nothing (see _Sink)
                    by_bookie[b].extend(e - first for e in ids[pos:pos + count])
                    pend[b] = pend.get(b, 0) + count
                    pos += count
        else:
            for i in todo:
                cands = [b for b in meta.bookies_for(first + i) if b not in tried.get(i, ())]
                if not cands:
                    continue
                b = self.order(cands, pend)[0]
                by_bookie[b].append(i)
                pend[b] = pend.get(b, 0) + 1
                assigned.add(i)
        for idxs in by_bookie.values():
            idxs.sort()
        return _Plan(dict(by_bookie), assigned)

    def _rank(self, b: str) -> tuple[bool, bool, bool]:
        o = self.options
        return (self.is_down(b), self.is_slow(b),
                o.local_zone is not None and o.zones.get(b) != o.local_zone)

    def _give_up(self, ctx: LedgerContext, first: int, exhausted: list[int],
                 failures: dict[int, list[tuple[str, str, str]]]) -> Exception:
        i = exhausted[0]
        fails = failures.get(i, [])
        where = f"entry {ctx.ledger_id}:{first + i}"
        detail = "; ".join(d or f"{b}: {r}" for b, r, d in fails) or "no bookie to ask"
        reasons = {r for _, r, _ in fails}
        if reasons == {"noentry"}:
            return NotFound(f"{where} is on no bookie of its write set ({detail})")
        if reasons == {"digest"}:
            return DigestError(where, 0, f"every replica failed its digest check ({detail})")
        return Retriable(f"{where}: every replica failed ({detail})")

    # ---- the last-add-confirmed ----------------------------------------------------------
    async def read_last(self, addr: str, ctx: LedgerContext) -> tuple[int, Entry | None]:
        """Ask one bookie for its last entry of the ledger: (LAC hint, that entry or None)."""
        resp = await self.call(addr, lambda txn: ReadRequest(txn, ctx.ledger_id,
                                                             LAST_ADD_CONFIRMED))
        return self._lac_answer(addr, ctx, resp, None)

    async def long_poll(self, addr: str, ctx: LedgerContext, previous_lac: int,
                        timeout_s: float) -> tuple[int, Entry | None]:
        """Wait (at the bookie) until its LAC passes ``previous_lac`` or ``timeout_s`` ends:
        (LAC hint, entry ``previous_lac + 1`` when piggybacked)."""
        self.metrics.long_poll()
        timeout_ms = max(int(timeout_s * 1000), 1)
        resp = await self.call(
            addr, lambda txn: ReadRequest(txn, ctx.ledger_id, previous_lac + 1,
                                          previous_lac=previous_lac, timeout_ms=timeout_ms,
                                          flag=Flag.ENTRY_PIGGYBACK),
            timeout=timeout_s + self.options.read_timeout_s)
        return self._lac_answer(addr, ctx, resp, previous_lac + 1)

    def _lac_answer(self, addr: str, ctx: LedgerContext, resp: Response,
                    entry_id: int | None) -> tuple[int, Entry | None]:
        if not isinstance(resp, ReadResponse):
            raise BookieError(addr, "protocol", f"answer {resp!r} to a read")
        status = resp.status if resp.status != Status.EOK else (resp.read_status or 0)
        lac = resp.max_lac if resp.max_lac is not None else -1
        body = resp.body
        if status in _NOT_THERE or (status == Status.EOK and body is None):
            return lac, None
        if status != Status.EOK or body is None:
            raise BookieError(addr, status_name(status).lower())
        try:
            entry = decode_entry(body, ctx.digest, ledger_id=ctx.ledger_id, entry_id=entry_id,
                                 where=f"last entry of ledger {ctx.ledger_id} from {addr}")
        except DigestError:
            self.metrics.failover(addr, "digest")
            return lac, None
        return max(lac, entry.lac), entry

    async def close(self) -> None:
        self._closed = True
        for fut in list(self._connecting.values()):
            fut.cancel()
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
        await asyncio.sleep(0)
