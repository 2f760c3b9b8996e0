"""Reading entries from bookies, on asyncio: protocol v2 for bulk reads, v3 for the tail.

Per bookie, two connections at most, opened on first use and re-opened after a failure: a v2 one
for bulk reads (what Pulsar's brokers use: fixed binary headers, no protobuf) and a v3 one for
the reads v2 cannot express (the last entry with ``maxLAC``, the long poll). Which protocol a
bookie's bulk reads use is decided per bookie and shown in ``status``
(:meth:`BookieClient.status`): v2 unless ``[source] bookie_protocol = "v3"``, or unless the bookie
refused v2 (closed two fresh v2 connections in a row without an answer), then v3. Where a bookie
supports batched reads (BookKeeper 4.17+; found out once per bookie for the client's life by a
probe on a connection of its own, sent only when a read has a run batching would serve,
:meth:`BookieClient._start_probe`), each run of ``MIN_BATCH_RUN`` or more consecutive entries
it holds is one request; otherwise one request per entry.

Every wait on a bookie counts only time this process was running (:mod:`.pause`): after a
pause of our own (``SIGSTOP``, a stopped VM) the requests in flight get their timeout again
instead of quarantining the bookies that answered meanwhile.

A read of entries ``first..last`` (:meth:`BookieClient.read_entries`) is planned as runs over
the bookies (:mod:`.replicas`); each bookie's requests go out in one write and their answers land
in one :class:`~.connection.Sink` (one future per bookie, none per entry); the bodies are then
checked in one pass (:func:`~.codec.check_bodies`). An entry that failed (error status, timeout,
lost connection, digest mismatch) is re-sent to the next untried bookie of its write set. When
every bookie answered "no such entry" the caller's metadata may be stale (an ensemble change), so
it is re-read once before giving up with ``NotFound``; all digests wrong gives ``DigestError``
(a ``FormatError``); anything else ``Retriable``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from offloadd.errors import NotFound, Retriable
from offloadd.ledger.bookkeeper import v2
from offloadd.ledger.bookkeeper.codec import (
    LAST_ADD_CONFIRMED,
    Digest,
    DigestError,
    Entry,
    Status,
    check_bodies,
    decode_entry,
    status_name,
)
from offloadd.ledger.bookkeeper.connection import (
    LOST,
    REASONS,
    TIMEOUT,
    BookieError,
    Sink,
    V2Connection,
    V3Connection,
    short_runs,
    split_addr,
    with_slots,
)
from offloadd.ledger.bookkeeper.layout import LedgerMetadata
from offloadd.ledger.bookkeeper.metrics import BookKeeperMetrics
from offloadd.ledger.bookkeeper.pause import Stalls
from offloadd.ledger.bookkeeper.replicas import (
    ReplicaPolicy,
    Replicas,
    ids_of,
    plan_retry,
    plan_runs,
)
from offloadd.ledger.bookkeeper.shared import single_flight
from offloadd.ledger.bookkeeper.v3 import (
    Flag,
    ReadRequest,
    ReadResponse,
    encode_plain_reads,
    encode_read_request,
)

log = logging.getLogger(__name__)

__all__ = [
    "BookieClient",
    "BookieError",
    "ClientOptions",
    "Entries",
    "LedgerContext",
    "ReplicaPolicy",
]

_NOT_THERE = (Status.ENOENTRY, Status.ENOLEDGER)
_V2_REFUSALS = 2  # fresh v2 connections closed unanswered, in a row, before v3 is used
# Shorter runs go as plain reads: a batched answer costs this side more per entry than two
# plain ones (it is split entry by entry all the same), so on a ledger striped with write
# quorum 2 (runs of two) batching would only save the bookie work.
MIN_BATCH_RUN = 3
Protocol_ = Literal["auto", "v3"]


@dataclass(frozen=True)
class ClientOptions:
    read_timeout_s: float = 10.0
    """A bookie request unanswered this long fails (and its entries go to other replicas)."""
    connect_timeout_s: float = 5.0
    replicas: ReplicaPolicy = field(default_factory=ReplicaPolicy)
    protocol: Protocol_ = "auto"
    """"auto": bulk reads over v2, the tail over v3; "v3": everything over v3."""
    batch_reads: bool = True
    batch_max_bytes: int = 4 * 1024 * 1024
    """Batched reads where a bookie has them, of at most this many bytes each."""


@dataclass
class BookieProtocol:
    """How this client reads from one bookie."""

    reads: Literal["v2", "v3"] = "v2"
    batch: bool | None = None  # None: not known yet (or batched reads are off)
    refusals: int = 0  # fresh v2 connections closed without an answer since the last one read
    note: str = ""

    def batched(self, enabled: bool) -> str:
        if not enabled or self.reads == "v3":
            return "off"
        return {None: "unknown", True: "yes", False: "no"}[self.batch]


@dataclass(slots=True)
class Entries:
    """Entries ``first .. first + len(payloads) - 1`` of a ledger, verified: their payloads
    (views of what the bookies sent), the highest LAC learnt from their headers and the bookies'
    ``maxLAC``, and (entryId, lastAddConfirmed, ledger length) of the last one."""

    first: int
    payloads: list[memoryview]
    lac: int
    tail: tuple[int, int, int]


class LedgerContext(Protocol):
    """What a read needs to know about its ledger (the source's ledger state)."""

    ledger_id: int
    meta: LedgerMetadata
    digest: Digest

    async def refresh(self) -> bool:
        """Re-read the ledger's metadata; True if its ensembles changed."""
        ...


@dataclass(slots=True)
class _Got:
    """One bookie's share of a read: payload (or None) per entry, failures by position."""

    ids: list[int]
    payloads: list[memoryview | None]
    failed: dict[int, tuple[str, str]]
    lac: int
    tail: tuple[int, int, int] | None


class BookieClient:
    """Connections to every bookie this process reads from, shared by all topics."""

    def __init__(self, options: ClientOptions | None = None,
                 metrics: BookKeeperMetrics | None = None, *,
                 clock: Callable[[], float] = time.monotonic, probe: bool = True) -> None:
        """``probe`` False: never ask a bookie whether it has batched reads (read entry by
        entry), for short-lived read-only commands: the probe costs a bookie older than 4.17
        an ERROR in its log."""
        self.options = options or ClientOptions()
        self._may_probe = probe
        self.metrics = metrics or BookKeeperMetrics()
        self._clock = clock
        self._conns: dict[tuple[str, int], V2Connection | V3Connection] = {}
        self._connecting: dict[tuple[str, int], asyncio.Future[V2Connection | V3Connection]] = {}
        self._protocols: dict[str, BookieProtocol] = {}
        self._probes: dict[str, asyncio.Future[None]] = {}
        self._next_id = 1  # txnIds (v3) and requestIds (v2 batched reads)
        self.replicas = Replicas(self.options.replicas, clock=clock)
        self._stalls = Stalls(self.options.read_timeout_s, self.metrics.paused)
        self._closed = False

    # ---- protocol per bookie -------------------------------------------------------------
    def protocol(self, addr: str) -> BookieProtocol:
        p = self._protocols.get(addr)
        if p is None:
            p = BookieProtocol(reads="v3" if self.options.protocol == "v3" else "v2")
            if p.reads == "v3":
                p.note = "configured"
            self._protocols[addr] = p
            self._publish(addr, p)
        return p

    def _publish(self, addr: str, p: BookieProtocol) -> None:
        self.metrics.bookie_protocol(addr, p.reads, p.batched(self.options.batch_reads))

    def status(self) -> dict[str, dict[str, str]]:
        """Per bookie talked to so far: the protocol of its bulk reads (the tail is always v3),
        whether batched reads are used, and why when it is not the default."""
        return {addr: {"reads": p.reads, "tail": "v3",
                       "batched_reads": p.batched(self.options.batch_reads),
                       **({"note": p.note} if p.note else {})}
                for addr, p in sorted(self._protocols.items())}

    # ---- connections ---------------------------------------------------------------------
    async def _connection(self, addr: str, version: int) -> V2Connection | V3Connection:
        if self._closed:
            raise BookieError(addr, "closed", "the bookie client is closed")
        self.protocol(addr)  # every bookie talked to appears in status
        conn = self._conns.get((addr, version))
        if conn is not None and not conn.closed:
            return conn
        return await single_flight(self._connecting, (addr, version),
                                   lambda: self._connect(addr, version))

    async def _connect(self, addr: str, version: int, *, keep: bool = True
                       ) -> V2Connection | V3Connection:
        host, port = split_addr(addr)
        loop = asyncio.get_running_loop()
        factory = V2Connection if version == 2 else V3Connection
        connecting = asyncio.ensure_future(
            loop.create_connection(lambda: factory(addr), host, port))
        try:
            await self._answer(connecting, self.options.connect_timeout_s)
            _, conn = connecting.result()
        except (OSError, TimeoutError) as exc:
            self._mark_down(addr, "connect")
            raise BookieError(addr, "connect", str(exc) or type(exc).__name__) from None
        finally:
            connecting.cancel()  # a no-op once done; a connect given up on must not linger
        if keep:
            self._conns[(addr, version)] = conn
        return conn

    async def _v2(self, addr: str) -> V2Connection:
        conn = await self._connection(addr, 2)
        assert isinstance(conn, V2Connection)
        return conn

    async def _v3(self, addr: str) -> V3Connection:
        conn = await self._connection(addr, 3)
        assert isinstance(conn, V3Connection)
        return conn

    # ---- health ----------------------------------------------------------------------------
    def _mark_down(self, addr: str, reason: str) -> None:
        if self.replicas.mark_down(addr):
            self.metrics.quarantine(addr, reason)
            log.warning("bookie %s quarantined for %gs (%s): other replicas are asked first",
                        addr, self.options.replicas.quarantine_s, reason)

    async def _answer(self, fut: asyncio.Future[Any], timeout: float) -> bool:
        """Wait for ``fut`` up to ``timeout`` seconds of this process running (see
        :mod:`.pause`); True if the process was seen stalled meanwhile. ``TimeoutError``."""
        return await self._stalls.wait(fut, timeout) > 0

    def _observe(self, addr: str, latency: float) -> None:
        self.replicas.observe(addr, latency)
        self.metrics.set_slow(addr, self.replicas.is_slow(addr))

    def _take_ids(self, n: int) -> int:
        first = self._next_id
        self._next_id += n
        return first

    # ---- one bookie's share of a read ----------------------------------------------------
    async def _read_on(self, addr: str, ctx: LedgerContext, runs: Sequence[tuple[int, int]]
                       ) -> _Got:
        """Read the entries of ``runs`` from one bookie and check them."""
        ids = ids_of(runs)
        n = len(ids)
        sink = Sink(n, asyncio.get_running_loop().create_future())
        t0 = self._clock()
        self.replicas.pending[addr] += n
        self.metrics.set_pending(addr, self.replicas.pending[addr])
        try:
            if self.protocol(addr).reads == "v3":
                paused = await self._ask_v3(addr, ctx.ledger_id, ids, sink)
            else:
                paused = await self._ask_v2(addr, ctx.ledger_id, runs, ids, sink)
        finally:
            self.replicas.pending[addr] -= n
            self.metrics.set_pending(addr, self.replicas.pending[addr])
        # a wait stretched by our own stall says nothing of the bookie's latency
        return self._check(addr, ctx, ids, sink, self._clock() - t0, observe=not paused)

    async def _ask_v2(self, addr: str, ledger_id: int, runs: Sequence[tuple[int, int]],
                      ids: list[int], sink: Sink) -> bool:
        """Send and await one bookie's share over v2; True if this process stalled meanwhile."""
        paused = False
        try:
            conn = await self._v2(addr)
        except BookieError as exc:
            sink.fail(LOST, str(exc))
            return paused
        known = self.protocol(addr).batch
        run = next((first for first, n in runs if n >= MIN_BATCH_RUN), None)
        if run is not None and known is None and self.options.batch_reads:
            # only a read that batching would serve asks: a striped ledger's runs of two
            # never do, so a cluster of those never probes at all
            self._start_probe(addr, ledger_id, run)
        batched = self.options.batch_reads and known is True and run is not None
        timeout = self.options.read_timeout_s
        try:
            if not batched:
                conn.expect(ledger_id, ids, range(len(ids)), sink)
                conn.send(v2.encode_reads(ledger_id, ids))
                paused |= await self._answer(sink.future, timeout)
            slots = with_slots(runs) if batched else []
            while slots:
                conn.send_runs(ledger_id, slots, sink, self._take_ids,
                               self.options.batch_max_bytes, MIN_BATCH_RUN)
                paused |= await self._answer(sink.future, timeout)
                slots = short_runs(sink, ids)
                sink.reopen([s for _, n, slot in slots for s in range(slot, slot + n)])
        except TimeoutError:
            conn.forget(sink, ledger_id, ids)
            late = sink.remaining
            sink.fail(TIMEOUT, f"{late} of {len(ids)} reads unanswered after "
                      f"{self.options.read_timeout_s:g}s")
            self._mark_down(addr, "timeout")
        except BookieError as exc:  # the connection closed before the requests went out
            conn.forget(sink, ledger_id, ids)
            sink.fail(LOST, str(exc))
        finally:
            if not sink.future.done() or sink.remaining:  # cancelled
                conn.forget(sink, ledger_id, ids)
        if LOST in sink.codes:
            self._lost_v2(addr, conn)
        return paused

    def _lost_v2(self, addr: str, conn: V2Connection) -> None:
        """A v2 connection failed. Closed fresh without a word, twice: the bookie refuses v2."""
        p = self.protocol(addr)
        if conn.answers == 0 and conn.sent > 0 and p.reads == "v2":
            p.refusals += 1
            if p.refusals >= _V2_REFUSALS:
                p.reads, p.note = "v3", "closed v2 connections unanswered: reads over v3"
                log.warning("bookie %s: %s", addr, p.note)
                self._publish(addr, p)
        else:
            self._mark_down(addr, "connection")

    async def _ask_v3(self, addr: str, ledger_id: int, ids: list[int], sink: Sink) -> bool:
        """Send and await one bookie's share over v3; True if this process stalled meanwhile."""
        n = len(ids)
        paused = False
        try:
            conn = await self._v3(addr)
        except BookieError as exc:
            sink.fail(LOST, str(exc))
            return paused
        first_txn = self._take_ids(n)
        try:
            conn.expect(first_txn, sink, n)
            conn.send(encode_plain_reads(first_txn, ledger_id, ids))
            paused = await self._answer(sink.future, self.options.read_timeout_s)
        except TimeoutError:
            conn.forget(first_txn, n)
            sink.fail(TIMEOUT, f"{sink.remaining} of {n} reads unanswered after "
                      f"{self.options.read_timeout_s:g}s")
            self._mark_down(addr, "timeout")
        except BookieError as exc:
            conn.forget(first_txn, n)
            sink.fail(LOST, str(exc))
        finally:
            if sink.remaining:  # cancelled: late answers must find nobody
                conn.forget(first_txn, n)
        if LOST in sink.codes:
            self._mark_down(addr, "connection")
        return paused

    def _check(self, addr: str, ctx: LedgerContext, ids: list[int], sink: Sink,
               elapsed: float, *, observe: bool = True) -> _Got:
        codes = sink.codes
        bodies = sink.bodies
        failed: dict[int, tuple[str, str]] = {}
        if codes.count(0) != len(codes):
            bodies = list(bodies)
            for k, code in enumerate(codes):
                if code == 0 and bodies[k] is not None:
                    continue
                bodies[k] = None
                failed[k] = self._failure(addr, code, sink.detail)
        checked = check_bodies(bodies, ids, ctx.ledger_id, ctx.digest, f"bookie {addr}")
        failed.update(checked.failed)
        ok = len(ids) - len(failed)
        if ok and self.protocol(addr).refusals:
            self.protocol(addr).refusals = 0  # it answers v2: only refusals in a row count
        if ok:
            nbytes = sum(map(len, filter(None, checked.payloads)))
            self.metrics.entries_read(addr, ok, nbytes, elapsed * ok)
            if observe:
                self._observe(addr, elapsed)
        tail = checked.tail
        lac = max(sink.max_lac, tail[1] if tail is not None else -1)
        return _Got(ids, checked.payloads, failed, lac, tail)

    @staticmethod
    def _failure(addr: str, code: int, detail: str) -> tuple[str, str]:
        """(reason, detail) of a read that did not return a body."""
        if code < 0:
            return REASONS.get(code, "protocol"), f"bookie {addr}: {detail}"
        if code == Status.EOK:
            return "protocol", f"bookie {addr}: EOK without a body"
        reason = "noentry" if code in _NOT_THERE else status_name(code).lower()
        return reason, f"bookie {addr}: {status_name(code)}"

    # ---- batched reads: supported? -------------------------------------------------------
    def _start_probe(self, addr: str, ledger_id: int, entry_id: int) -> None:
        """Ask ``addr`` once for the life of this client (the answer is kept per bookie
        address, whatever becomes of its connections): a bookie older than 4.17 logs an ERROR
        with a stack trace for the unknown opcode, and no request it would refuse quietly
        tells the versions apart (any v2 frame with an opcode it lacks throws in its decoder),
        so the only quiet probe is the one not sent."""
        if addr in self._probes or self._closed or not self._may_probe:
            return
        fut = asyncio.ensure_future(self._probe(addr, ledger_id, entry_id))
        self._probes[addr] = fut

    async def _probe(self, addr: str, ledger_id: int, entry_id: int) -> None:
        """One batched read on a connection of its own: any batched answer but ``EBADREQ``
        means the bookie supports them; ``EBADREQ``, a closed connection or silence that it
        does not. The connection is closed after, so the probe can disturb nothing else."""
        p = self.protocol(addr)
        try:
            conn = await self._connect(addr, 2, keep=False)
        except BookieError:
            del self._probes[addr]  # asked again on the next read
            return
        assert isinstance(conn, V2Connection)
        sink = Sink(2, asyncio.get_running_loop().create_future())
        rid = self._take_ids(1)
        try:
            conn.expect_batch(rid, sink, 0, 2)
            conn.send(v2.encode_batch_read(ledger_id, entry_id, rid, 2, 1024 * 1024))
            await self._answer(sink.future, self.options.read_timeout_s)
        except (TimeoutError, BookieError):
            pass
        finally:
            conn.close()
        p.batch = conn.batch_answers > 0 and not conn.batch_refused
        how = "refused with EBADREQ" if conn.batch_refused else \
            "connection closed" if LOST in sink.codes else "no answer"
        log.info("bookie %s: batched reads %s", addr,
                 "supported" if p.batch else f"not supported ({how}): one read per entry")
        self._publish(addr, p)

    # ---- reads ---------------------------------------------------------------------------
    async def read_entries(self, ctx: LedgerContext, first: int, last: int) -> Entries:
        """Entries ``first..last`` (all must exist), verified."""
        n = last - first + 1
        out: list[memoryview | None] = [None] * n
        tried: dict[int, set[str]] = {}  # only for entries that failed somewhere
        failures: dict[int, list[tuple[str, str, str]]] = {}
        refreshed = False
        lac = -1
        tail: tuple[int, int, int] | None = None
        todo: list[int] | None = None  # entry ids to ask again; None: the first round
        while True:
            if todo is None:
                plan = plan_runs(ctx.meta, first, last, self.replicas.rank,
                                 self.replicas.pending)
            else:
                plan, exhausted = plan_retry(ctx.meta, todo, tried, self.replicas.order,
                                             self.replicas.pending)
                if exhausted:
                    if not refreshed and all(r == "noentry" for e in exhausted
                                             for _, r, _ in failures.get(e, [])):
                        refreshed = True
                        if await ctx.refresh():  # an ensemble change: ask the new write sets
                            for e in todo:
                                tried.pop(e, None)
                            todo = sorted(todo)
                            continue
                    raise self._give_up(ctx, exhausted, failures)
            if not plan:
                break
            results = await asyncio.gather(*(self._read_on(b, ctx, runs)
                                             for b, runs in plan.items()))
            todo = []
            for b, got in zip(plan, results, strict=True):
                lac = max(lac, got.lac)
                if got.tail is not None and (tail is None or got.tail[0] > tail[0]):
                    tail = got.tail
                if not got.failed:
                    for e, p in zip(got.ids, got.payloads, strict=True):
                        out[e - first] = p
                    continue
                for k, e in enumerate(got.ids):
                    if k not in got.failed:
                        out[e - first] = got.payloads[k]
                        continue
                    reason, detail = got.failed[k]
                    tried.setdefault(e, set()).add(b)
                    failures.setdefault(e, []).append((b, reason, detail))
                    self.metrics.failover(b, reason)
                    todo.append(e)
            if not todo:
                break
            self.metrics.retry(len(todo))
            log.debug("ledger %d: %d reads failed, trying other replicas", ctx.ledger_id,
                      len(todo))
        assert tail is not None  # every entry was read, so the last one too
        return Entries(first, out, lac, tail)  # type: ignore[arg-type]  # every slot is set

    def _give_up(self, ctx: LedgerContext, exhausted: list[int],
                 failures: dict[int, list[tuple[str, str, str]]]) -> Exception:
        e = exhausted[0]
        fails = failures.get(e, [])
        where = f"entry {ctx.ledger_id}:{e}"
        detail = "; ".join(d or f"{b}: {r}" for b, r, d in fails) or "no bookie to ask"
        reasons = {r for _, r, _ in fails}
        if reasons == {"noentry"}:
            return NotFound(f"{where} is on no bookie of its write set ({detail})")
        if reasons == {"digest"}:
            return DigestError(where, 0, f"every replica failed its digest check ({detail})")
        return Retriable(f"{where}: every replica failed ({detail})")

    # ---- the last-add-confirmed (v3) -----------------------------------------------------
    async def _call(self, addr: str, req: Callable[[int], ReadRequest],
                    timeout: float) -> ReadResponse:
        """One v3 read request and its answer; ``BookieError`` on failure."""
        conn = await self._v3(addr)
        txn = self._take_ids(1)
        sink = Sink(1, asyncio.get_running_loop().create_future(), keep=True)
        try:
            conn.expect(txn, sink, 1)
            conn.send(encode_read_request(req(txn)))
            await self._answer(sink.future, timeout)
        except TimeoutError:
            self._mark_down(addr, "timeout")
            raise BookieError(addr, "timeout", f"no answer after {timeout:g}s") from None
        finally:
            conn.forget(txn, 1)
        assert sink.responses is not None
        resp = sink.responses[0]
        if resp is None:
            if sink.codes[0] == LOST:
                self._mark_down(addr, "connection")
            raise BookieError(addr, REASONS.get(sink.codes[0], "protocol"), sink.detail)
        return resp

    async def read_last(self, addr: str, ctx: LedgerContext) -> tuple[int, Entry | None]:
        """Ask one bookie for its last entry of the ledger: (LAC hint, that entry or None)."""
        resp = await self._call(addr, lambda txn: ReadRequest(txn, ctx.ledger_id,
                                                              LAST_ADD_CONFIRMED),
                                self.options.read_timeout_s)
        return self._lac_answer(addr, ctx, resp, None)

    async def long_poll(self, addr: str, ctx: LedgerContext, previous_lac: int,
                        timeout_s: float) -> tuple[int, Entry | None]:
        """Wait (at the bookie) until its LAC passes ``previous_lac`` or ``timeout_s`` ends:
        (LAC hint, entry ``previous_lac + 1`` when piggybacked).

        Sent as BookKeeper's own client sends it (``ReadLastConfirmedAndEntryOp``): entryId
        ``-1`` with ``previousLAC``, ``timeOut`` and ``ENTRY_PIGGYBACK``. A bookie answers any
        other entryId ``EBADREQ`` (and logs an ERROR); the entry it piggybacks is
        ``previousLAC + 1``, named in the answer's entryId."""
        self.metrics.long_poll()
        timeout_ms = max(int(timeout_s * 1000), 1)
        resp = await self._call(
            addr, lambda txn: ReadRequest(txn, ctx.ledger_id, LAST_ADD_CONFIRMED,
                                          previous_lac=previous_lac, timeout_ms=timeout_ms,
                                          flag=Flag.ENTRY_PIGGYBACK),
            timeout_s + self.options.read_timeout_s)
        if resp.body is not None and resp.entry_id != previous_lac + 1:
            raise BookieError(addr, "protocol", f"long poll after LAC {previous_lac} "
                              f"piggybacked entry {resp.entry_id}")
        return self._lac_answer(addr, ctx, resp, previous_lac + 1)

    def _lac_answer(self, addr: str, ctx: LedgerContext, resp: ReadResponse,
                    entry_id: int | None) -> tuple[int, Entry | None]:
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
        for fut in self._connecting.values():
            fut.cancel()
        for probe in self._probes.values():
            probe.cancel()
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
        await asyncio.sleep(0)
