"""BookKeeper's protocol v3 for reads (pure): protobuf ``Request``/``Response`` frames.

offloadd speaks v3 where v2 cannot do the job — the tail of an open ledger: a read of entry
``-1`` (the bookie's last entry, answered with ``maxLAC``) and the long poll (entry ``-1`` too,
with ``previousLAC``, ``timeOut`` and flag ``ENTRY_PIGGYBACK``, as BookKeeper's Java client
sends it — a bookie answers any other entryId ``EBADREQ``: it answers once its LAC passes
``previousLAC``, or when the time is up, with the body of entry ``previousLAC + 1`` when it has
it); and for bulk reads from a bookie that refuses v2 (see :mod:`.client`).

The payload is a ``Request`` or ``Response`` protobuf (``proto/bookkeeper_protocol.proto``). The
header carries ``txnId``, which the bookie echoes, so many requests may be in flight on one
connection. A read request on the wire (txnId 101, ledger 1, entry 0)::

    0000000f                    frame length 15
    0a 06 08 03 10 01 18 65     header {version 3, operation READ_ENTRY, txnId 101}
    a2 06 04 08 01 10 00        readRequest (field 100) {ledgerId 1, entryId 0}

A plain read sends no master key (only fencing needs it). Requests are encoded by hand (tested
against the generated code); responses of ``fast_min`` bytes or more are parsed by hand so that
their body stays a view of the frame, the rest by the protobuf runtime.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from offloadd._proto import bookkeeper_protocol_pb2 as pb
from offloadd.errors import FormatError
from offloadd.format.varint import encode_varint as _varint_slow
from offloadd.ledger.bookkeeper.codec import missing_fields

__all__ = [
    "PROTOCOL_VERSION",
    "Flag",
    "Op",
    "OtherResponse",
    "ReadRequest",
    "ReadResponse",
    "Response",
    "decode_response",
    "encode_plain_reads",
    "encode_read_request",
    "header_bytes",
    "varint",
]

PROTOCOL_VERSION = 3
_FAST_DECODE_MIN = 4096  # below this the protobuf parser beats the Python one
_U32 = struct.Struct(">I")


class Op(enum.IntEnum):
    """The operations offloadd or its tests' writer send (``OperationType`` has more)."""

    READ_ENTRY = 1
    ADD_ENTRY = 2
    READ_LAC = 7


class Flag(enum.IntEnum):
    """``ReadRequest.flag``."""

    FENCE_LEDGER = 1
    ENTRY_PIGGYBACK = 2


# ---- varints (protobuf wire format) -----------------------------------------------------------


_VARINTS = [_varint_slow(v) for v in range(1 << 14)]  # every one- and two-byte varint
_MINUS_ONE = _varint_slow(-1)  # the LAC of an empty ledger, everywhere


def varint(v: int) -> bytes:
    """``v`` as a protobuf varint (int64 negatives take ten bytes)."""
    if 0 <= v < 16384:
        return _VARINTS[v]
    if v == -1:
        return _MINUS_ONE
    return _varint_slow(v)


def _read_varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while pos < end:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            break
    raise ValueError("bad varint")


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


# ---- requests ---------------------------------------------------------------------------------


@dataclass(slots=True)
class ReadRequest:
    op: ClassVar[Op] = Op.READ_ENTRY
    txn_id: int
    ledger_id: int
    entry_id: int
    master_key: bytes | None = None
    previous_lac: int | None = None
    timeout_ms: int | None = None
    flag: int | None = None
    priority: int | None = None


def header_bytes(op: int, txn_id: int, priority: int | None) -> bytes:
    """The ``header`` field (field 1, length-delimited) of a request or response."""
    h = b"\x08\x03\x10" + varint(op) + b"\x18" + varint(txn_id)
    if priority is not None:
        h += b"\x20" + varint(priority)
    return b"\x0a" + varint(len(h)) + h


def encode_read_request(req: ReadRequest) -> bytes:
    """A framed read request."""
    body = b"\x08" + varint(req.ledger_id) + b"\x10" + varint(req.entry_id)
    if req.master_key is not None:
        body += b"\x1a" + varint(len(req.master_key)) + req.master_key
    if req.previous_lac is not None:
        body += b"\x20" + varint(req.previous_lac)
    if req.timeout_ms is not None:
        body += b"\x28" + varint(req.timeout_ms)
    if req.flag is not None:
        body += b"\xa0\x06" + varint(req.flag)
    msg = header_bytes(Op.READ_ENTRY, req.txn_id, req.priority) + b"\xa2\x06" + \
        varint(len(body)) + body
    return _U32.pack(len(msg)) + msg


def encode_plain_reads(first_txn: int, ledger_id: int, entry_ids: Sequence[int]) -> bytes:
    """Framed plain read requests for ``entry_ids`` with txnIds ``first_txn, first_txn + 1,
    ...``, back to back: what :func:`encode_read_request` gives one by one, built faster."""
    led = b"\x08" + varint(ledger_id) + b"\x10"
    out: list[bytes] = []
    txn = first_txn
    for entry_id in entry_ids:
        body = led + varint(entry_id)
        head = b"\x08\x03\x10\x01\x18" + varint(txn)
        txn += 1
        n = 2 + len(head) + 3 + len(body)  # both lengths fit one varint byte
        out.append(_U32.pack(n) + b"\x0a" + bytes((len(head),)) + head + b"\xa2\x06"
                   + bytes((len(body),)) + body)
    return b"".join(out)


# ---- responses --------------------------------------------------------------------------------


@dataclass(slots=True)
class ReadResponse:
    """``read_status`` is the inner ``readResponse.status``; None when that message is absent."""

    op: ClassVar[Op] = Op.READ_ENTRY
    txn_id: int
    status: int
    read_status: int | None = None
    ledger_id: int = 0
    entry_id: int = 0
    body: bytes | memoryview | None = None
    max_lac: int | None = None
    lac_update_ts: int | None = None
    priority: int | None = None


@dataclass(slots=True)
class OtherResponse:
    """A response to an operation offloadd does not send (kept for the error message)."""

    op_code: int
    txn_id: int
    status: int
    priority: int | None = None


Response = ReadResponse | OtherResponse


def parse_message(message: pb.Request | pb.Response, data: bytes | memoryview,
                  where: str) -> None:
    """Parse ``data`` into ``message``; ``FormatError`` for junk, a message lacking required
    fields, or another protocol version."""
    try:
        message.ParseFromString(bytes(data))
    except Exception as exc:  # protobuf raises DecodeError and friends
        raise FormatError(where, 0, f"not a BookKeeper v3 {type(message).__name__} ({exc})"
                          ) from exc
    missing = missing_fields(message)
    if missing:
        raise FormatError(where, 0, f"v3 {type(message).__name__} lacks required fields: "
                          f"{', '.join(missing)}")
    if message.header.version != PROTOCOL_VERSION:
        raise FormatError(where, 0, f"protocol version {message.header.version}, expected 3")


_HEADER_TAGS = frozenset((0x08, 0x10, 0x18, 0x20))  # version, operation, txnId, priority
_READ_TAGS = frozenset((0x08, 0x10, 0x18, 0x28, 0x30))  # status, ids, maxLAC, timestamp


def _fast_read_response(view: memoryview) -> ReadResponse | None:
    """Parse a read response without copying its body; None when it holds anything unusual
    (the protobuf parser then decides). Fields are kept by tag (the last one wins, as in
    protobuf)."""
    end = len(view)
    pos = 0
    head: dict[int, int] = {}
    inner: dict[int, int] = {}
    status: int | None = None
    body: memoryview | None = None
    seen_inner = False
    while pos < end:
        tag, pos = _read_varint(view, pos, end)
        if tag == 0x0A:
            n, pos = _read_varint(view, pos, end)
            stop = pos + n
            while pos < stop:
                t, pos = _read_varint(view, pos, stop)
                if t not in _HEADER_TAGS:
                    return None
                head[t], pos = _read_varint(view, pos, stop)
            if pos != stop:
                return None
        elif tag == 0x10:
            status, pos = _read_varint(view, pos, end)
        elif tag == 0x322 and not seen_inner:
            seen_inner = True
            n, pos = _read_varint(view, pos, end)
            stop = pos + n
            if stop > end:
                return None
            while pos < stop:
                t, pos = _read_varint(view, pos, stop)
                if t == 0x22:
                    n2, pos = _read_varint(view, pos, stop)
                    if pos + n2 > stop:
                        return None
                    body = view[pos:pos + n2]
                    pos += n2
                elif t in _READ_TAGS:
                    inner[t], pos = _read_varint(view, pos, stop)
                else:
                    return None
            if pos != stop or not {0x08, 0x10, 0x18} <= inner.keys():
                return None
        else:
            return None
    if (head.get(0x08) != PROTOCOL_VERSION or head.get(0x10) != Op.READ_ENTRY
            or 0x18 not in head or status is None or not seen_inner):
        return None
    lac, ts = inner.get(0x28), inner.get(0x30)
    return ReadResponse(head[0x18], status, inner[0x08], _signed(inner[0x10]),
                        _signed(inner[0x18]), body, None if lac is None else _signed(lac),
                        None if ts is None else _signed(ts), head.get(0x20))


def decode_response(data: bytes | memoryview, where: str = "response", *,
                    fast_min: int = _FAST_DECODE_MIN) -> Response:
    """A response frame's payload (without the length): a :class:`ReadResponse`, or an
    :class:`OtherResponse` for any other operation. Read responses of ``fast_min`` bytes or more
    are parsed by hand so that their body stays a view into ``data``."""
    view = memoryview(data)
    if len(view) >= fast_min:
        try:
            fast = _fast_read_response(view)
        except (ValueError, IndexError):
            fast = None
        if fast is not None:
            return fast
    msg = pb.Response()
    parse_message(msg, view, where)
    h = msg.header
    prio = h.priority if h.HasField("priority") else None
    if int(h.operation) != Op.READ_ENTRY:
        return OtherResponse(int(h.operation), h.txnId, msg.status, prio)
    if not msg.HasField("readResponse"):
        return ReadResponse(h.txnId, msg.status, priority=prio)
    r = msg.readResponse
    return ReadResponse(h.txnId, msg.status, r.status, r.ledgerId, r.entryId,
                        r.body if r.HasField("body") else None,
                        r.maxLAC if r.HasField("maxLAC") else None,
                        r.lacUpdateTimestamp if r.HasField("lacUpdateTimestamp") else None, prio)
