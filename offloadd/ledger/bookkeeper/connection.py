"""Connections to one bookie, on asyncio: :class:`V2Connection` for bulk reads,
:class:`V3Connection` for the tail of open ledgers (and bulk reads from a bookie that refuses v2).

A bookie picks the protocol per connection from its first request, so the two never share one.
Many requests are in flight on a connection at once; answers land in a :class:`Sink` — one per
group of reads sent together, a status code and a body view per read, one future for the whole
group — matched by (ledgerId, entryId) on v2, by ``requestId`` for a batched read and by
``txnId`` on v3. A late answer to a read already given up is dropped. Frames are handed on as
views of what the socket delivered; a frame split across reads is joined alone, at its exact
size (joining whole reads would allocate, and page-fault in, buffers above malloc's mmap
threshold for every large entry).

Codes of a slot are :class:`~offloadd.ledger.bookkeeper.codec.Status` numbers (v2's mapped onto
v3's) or, for what the client found itself, the negative codes below.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from itertools import accumulate, count, repeat
from typing import cast

from offloadd.errors import FormatError, Retriable
from offloadd.ledger.bookkeeper import v2
from offloadd.ledger.bookkeeper.codec import MAX_FRAME, U32, Status, split_frames
from offloadd.ledger.bookkeeper.v3 import ReadResponse, Response, decode_response
from offloadd.model.hostport import HostPort

log = logging.getLogger(__name__)

__all__ = [
    "LOST",
    "PENDING",
    "PROTOCOL",
    "SHORT",
    "TIMEOUT",
    "BookieError",
    "Sink",
    "V2Connection",
    "V3Connection",
    "short_runs",
    "split_addr",
    "with_slots",
]

PENDING = -1  # no answer yet
SHORT = -2  # a batched read answered fewer entries than asked: ask again from there
TIMEOUT = -3
LOST = -4  # the connection failed (or could not be opened)
PROTOCOL = -5  # an answer that makes no sense for the request

REASONS = {TIMEOUT: "timeout", LOST: "connection", PROTOCOL: "protocol"}


class BookieError(Retriable):
    """A request to one bookie failed; ``reason`` is a short label (metrics, decisions)."""

    def __init__(self, bookie: str, reason: str, detail: str = "") -> None:
        self.bookie = bookie
        self.reason = reason
        super().__init__(f"bookie {bookie}: {reason}{': ' + detail if detail else ''}")


def split_addr(addr: str) -> tuple[str, int]:
    """(host, port) of a ``host:port`` bookie id; ``BookieError`` for anything else."""
    try:
        hp = HostPort.parse(addr)
    except ValueError:
        raise BookieError(addr, "address", "bookie ids must be host:port") from None
    return hp.host, hp.port


class Sink:
    """The answers to one group of reads sent to one bookie: a code and a body per slot.
    ``future`` completes once every slot has an answer (at once for a group of none)."""

    __slots__ = ("bodies", "codes", "detail", "future", "max_lac", "remaining", "responses")

    def __init__(self, n: int, future: asyncio.Future[None], *, keep: bool = False) -> None:
        self.codes = [PENDING] * n
        self.bodies: list[memoryview | None] = [None] * n
        self.remaining = n
        self.future = future
        self.max_lac = -1  # the highest maxLAC a v3 answer reported
        self.detail = ""  # why slots failed, when the client says so
        self.responses: list[ReadResponse | None] | None = [None] * n if keep else None
        if n == 0:  # nothing to wait for: a sink of no requests must never hang its waiter
            future.set_result(None)

    def put(self, slot: int, code: int, body: memoryview | None) -> None:
        codes = self.codes
        if codes[slot] != PENDING:
            return
        codes[slot] = code
        self.bodies[slot] = body
        self.remaining -= 1
        if not self.remaining and not self.future.done():
            self.future.set_result(None)

    def fail(self, code: int, detail: str) -> None:
        """Every slot without an answer gets ``code``."""
        if not self.detail:
            self.detail = detail
        for slot, c in enumerate(self.codes):
            if c == PENDING:
                self.put(slot, code, None)

    def reopen(self, slots: Sequence[int]) -> None:
        """Make ``slots`` wait for an answer again (asked again after a short batch)."""
        if not slots:
            return
        if self.future.done():
            self.future = asyncio.get_running_loop().create_future()
        for slot in slots:
            self.codes[slot] = PENDING
            self.bodies[slot] = None
        self.remaining += len(slots)


class _Framed(asyncio.Protocol):
    """Cuts the byte stream into frames; subclasses route complete ones (:meth:`_consume`)."""

    def __init__(self, addr: str) -> None:
        self.addr = addr
        self.where = f"answer from bookie {addr}"
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.answers = 0  # frames received on this connection
        self.sent = 0  # writes made on it
        self._part: list[memoryview] = []
        self._have = 0
        self._need = 0  # bytes of the frame begun in an earlier read; 0: none

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            if self._need:
                rest = self._finish(view)
                if rest is None:
                    return
                view = rest
            used = self._consume(view)
            if used < len(view):
                self._begin(view[used:])
        except FormatError as exc:
            log.error("bookie %s sent bytes that do not parse (%s); dropping the connection",
                      self.addr, exc)
            self._fail(PROTOCOL, str(exc))
            if self.transport is not None:
                self.transport.abort()

    def _begin(self, part: memoryview) -> None:
        self._part = [part]
        self._have = len(part)
        if self._have < 4:
            self._need = 4
            return
        (n,) = U32.unpack_from(part)
        if n > MAX_FRAME:
            raise FormatError(self.where, 0, f"frame of {n} bytes exceeds the {MAX_FRAME} "
                              "limit")
        self._need = 4 + n
        if self._have >= self._need:  # whole, yet not taken: too short for what it claims
            raise FormatError(self.where, 0, f"a frame of {n} bytes is too short")

    def _finish(self, view: memoryview) -> memoryview | None:
        """Complete the frame begun earlier with the start of ``view``; the rest of ``view``
        (None: the frame is still incomplete)."""
        while True:
            missing = self._need - self._have
            if len(view) < missing:
                self._part.append(view)
                self._have += len(view)
                return None
            self._part.append(view[:missing])
            view = view[missing:]
            self._have = self._need
            whole = memoryview(b"".join(self._part))
            if self._need == 4:  # only the length prefix was incomplete
                self._begin(whole)
                continue
            self._part, self._have, self._need = [], 0, 0
            if self._consume(whole) != len(whole):
                raise FormatError(self.where, 0, f"a frame of {len(whole) - 4} bytes is too "
                                  "short")
            return view

    def _consume(self, view: memoryview) -> int:
        """Route the complete frames at the start of ``view``; the bytes they took."""
        raise NotImplementedError

    def _fail(self, code: int, detail: str) -> None:
        raise NotImplementedError

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(LOST, f"connection lost ({exc or 'closed'})")

    def send(self, data: bytes) -> None:
        if self.closed or self.transport is None or self.transport.is_closing():
            raise BookieError(self.addr, "connection", "connection is closed")
        self.sent += 1
        self.transport.write(data)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class V2Connection(_Framed):
    """Plain reads matched by (ledgerId, entryId), batched reads by ``requestId``."""

    def __init__(self, addr: str) -> None:
        super().__init__(addr)
        self.reads: dict[int, dict[int, tuple[Sink, int]]] = {}  # ledger → entry → (sink, slot)
        # a second read of an entry already asked for on this connection: answered in turn
        self.again: dict[tuple[int, int], list[tuple[Sink, int]]] = {}
        self.batches: dict[int, tuple[Sink, int, int]] = {}  # requestId → (sink, slot, count)
        self.batch_answers = 0
        self.batch_refused = False  # a batched read was answered EBADREQ

    def expect(self, ledger_id: int, entry_ids: Sequence[int], slots: Sequence[int],
               sink: Sink) -> None:
        """Plain reads of ``entry_ids`` answer into ``slots`` of ``sink``."""
        w = self.reads.setdefault(ledger_id, {})
        if w.keys().isdisjoint(entry_ids):
            w.update(zip(entry_ids, zip(repeat(sink), slots, strict=False), strict=True))
            return
        for e, slot in zip(entry_ids, slots, strict=True):
            if e in w:
                self.again.setdefault((ledger_id, e), []).append((sink, slot))
            else:
                w[e] = (sink, slot)

    def expect_batch(self, request_id: int, sink: Sink, slot: int, n: int) -> None:
        self.batches[request_id] = (sink, slot, n)

    def send_runs(self, ledger_id: int, runs: Sequence[tuple[int, int, int]], sink: Sink,
                  take_ids: Callable[[int], int], max_bytes: int, min_batch: int) -> None:
        """Ask for ``runs`` (first entry, count, first slot) in one write: runs of ``min_batch``
        entries or more as batched reads of ``max_bytes`` at most, the others as plain reads
        (``take_ids(1)`` hands out request ids)."""
        singles: list[int] = []
        single_slots: list[int] = []
        parts: list[bytes] = []
        for first, n, slot in runs:
            if n < min_batch:
                singles.extend(range(first, first + n))
                single_slots.extend(range(slot, slot + n))
                continue
            rid = take_ids(1)
            self.expect_batch(rid, sink, slot, n)
            parts.append(v2.encode_batch_read(ledger_id, first, rid, n, max_bytes))
        if singles:
            self.expect(ledger_id, singles, single_slots, sink)
            parts.append(v2.encode_reads(ledger_id, singles))
        self.send(b"".join(parts))

    def _consume(self, view: memoryview) -> int:
        used = 0
        reads = self.reads
        for stop, op, status, ledger_id, entry_id, rid, body in v2.iter_responses(view,
                                                                                 self.where):
            used = stop
            self.answers += 1
            if op == v2.READ:
                w = reads.get(ledger_id)
                hit = w.pop(entry_id, None) if w is not None else None
                if hit is None:
                    continue  # given up on already
                if self.again:
                    self._next_in_line(ledger_id, entry_id)
                hit[0].put(hit[1], status, body)
            else:
                self._batch_answer(status, rid, body)
        return used

    def _next_in_line(self, ledger_id: int, entry_id: int) -> None:
        waiting = self.again.get((ledger_id, entry_id))
        if waiting:
            self.reads[ledger_id][entry_id] = waiting.pop(0)
            if not waiting:
                del self.again[(ledger_id, entry_id)]

    def _batch_answer(self, status: int, rid: int, body: memoryview | None) -> None:
        self.batch_answers += 1
        hit = self.batches.pop(rid, None)
        if hit is None:
            return
        sink, slot, n = hit
        if status != Status.EOK or body is None:
            if status == Status.EBADREQ:
                self.batch_refused = True
            for k in range(n):
                sink.put(slot + k, status, None)
            return
        bodies = v2.split_batch(body, self.where)
        if len(bodies) > n:
            raise FormatError(self.where, 0, f"batched read {rid} answered {len(bodies)} "
                              f"entries, {n} were asked for")
        for k, b in enumerate(bodies):
            sink.put(slot + k, Status.EOK, b)
        for k in range(len(bodies), n):
            sink.put(slot + k, SHORT, None)

    def forget(self, sink: Sink, ledger_id: int, entry_ids: Sequence[int]) -> None:
        """Stop waiting for ``sink``'s reads (given up on: timeout, cancellation)."""
        w = self.reads.get(ledger_id)
        if w is not None:
            for e in entry_ids:
                hit = w.get(e)
                if hit is not None and hit[0] is sink:
                    del w[e]
                    self._next_in_line(ledger_id, e)
            if not w:
                del self.reads[ledger_id]
        for key in [k for k, v in self.again.items() if any(s is sink for s, _ in v)]:
            self.again[key] = [x for x in self.again[key] if x[0] is not sink]
            if not self.again[key]:
                del self.again[key]
        for rid in [r for r, v in self.batches.items() if v[0] is sink]:
            del self.batches[rid]

    def _fail(self, code: int, detail: str) -> None:
        self.closed = True
        reads, self.reads = self.reads, {}
        again, self.again = self.again, {}
        batches, self.batches = self.batches, {}
        hits = [h for w in reads.values() for h in w.values()]
        hits += [h for v in again.values() for h in v]
        hits += [(s, slot + k) for s, slot, n in batches.values() for k in range(n)]
        for sink, slot in hits:
            if not sink.detail:
                sink.detail = detail
            sink.put(slot, code, None)


def with_slots(runs: Sequence[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(first entry, count) runs as (first entry, count, first slot): slots count on."""
    starts = accumulate((n for _, n in runs), initial=0)
    return [(f, n, slot) for (f, n), slot in zip(runs, starts, strict=False)]


def short_runs(sink: Sink, ids: Sequence[int]) -> list[tuple[int, int, int]]:
    """The entries batched reads did not answer (``SHORT``), as (first entry, count, first
    slot) runs, to ask for again."""
    if SHORT not in sink.codes:
        return []
    out: list[tuple[int, int, int]] = []
    for slot, code in enumerate(sink.codes):
        if code != SHORT:
            continue
        if out and out[-1][2] + out[-1][1] == slot and out[-1][0] + out[-1][1] == ids[slot]:
            first, n, s = out[-1]
            out[-1] = (first, n + 1, s)
        else:
            out.append((ids[slot], 1, slot))
    return out


class V3Connection(_Framed):
    """Requests matched by ``txnId``."""

    def __init__(self, addr: str) -> None:
        super().__init__(addr)
        self.pending: dict[int, tuple[Sink, int]] = {}

    def expect(self, first_txn: int, sink: Sink, n: int) -> None:
        """Requests with txnIds ``first_txn ..`` answer into slots ``0 .. n - 1`` of ``sink``."""
        self.pending.update(zip(range(first_txn, first_txn + n),
                                zip(repeat(sink), count(), strict=False), strict=False))

    def _consume(self, view: memoryview) -> int:
        frames, used = split_frames(view, self.where)
        for f in frames:
            self.answers += 1
            self._dispatch(decode_response(f, self.where))
        return used

    def _dispatch(self, resp: Response) -> None:
        hit = self.pending.pop(resp.txn_id, None)
        if hit is None:
            return
        sink, slot = hit
        if not isinstance(resp, ReadResponse):
            sink.detail = sink.detail or f"answer {resp!r} to a read"
            sink.put(slot, PROTOCOL, None)
            return
        if sink.responses is not None:
            sink.responses[slot] = resp
        if resp.max_lac is not None and resp.max_lac > sink.max_lac:
            sink.max_lac = resp.max_lac
        code = resp.status if resp.status != Status.EOK else (resp.read_status or 0)
        body = resp.body
        sink.put(slot, code, None if body is None else memoryview(body))

    def forget(self, first_txn: int, n: int) -> None:
        for txn in range(first_txn, first_txn + n):
            self.pending.pop(txn, None)

    def _fail(self, code: int, detail: str) -> None:
        self.closed = True
        pending, self.pending = self.pending, {}
        for sink, slot in pending.values():
            if not sink.detail:
                sink.detail = detail
            sink.put(slot, code, None)
