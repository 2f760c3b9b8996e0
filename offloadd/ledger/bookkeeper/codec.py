"""BookKeeper's wire protocol and entry bodies (pure: no sockets, no asyncio).

Facts from ``../shared/BOOKKEEPER.md``, checked byte for byte against the captures in
``../shared/conformance/bookkeeper/``. All integers are big-endian.

Framing (both versions)::

    [uint32 length of what follows][payload]

Protocol v3 (what offloadd speaks): the payload is a ``Request`` or ``Response`` protobuf
(``proto/bookkeeper_protocol.proto``). The header carries ``txnId``, which the bookie echoes, so
many requests may be in flight on one connection. A read request looks like this on the wire
(txnId 101, ledger 1, entry 0)::

    0000000f                    frame length 15
    0a 06 08 03 10 01 18 65     header {version 3, operation READ_ENTRY, txnId 101}
    a2 06 04 08 01 10 00        readRequest (field 100) {ledgerId 1, entryId 0}

A plain read sends no master key (only fencing needs it). ``entryId = -1`` asks for the last
entry the bookie holds (its body carries the writer's last-add-confirmed). A long poll adds
``previousLAC``, ``timeOut`` (ms) and flag ``ENTRY_PIGGYBACK``: the bookie answers once its LAC
passes ``previousLAC`` (or the time is up) with ``maxLAC`` and, when it has it, the body of entry
``previousLAC + 1``.

Protocol v2 (legacy; decoded and encoded here only so the conformance captures can be checked)::

    header int32 = version(2) << 24 | opcode << 16 | flags
    read request   header, int64 ledgerId, int64 entryId [, 20-byte master key if flags & 1]
    read response  header, int32 rc, int64 ledgerId, int64 entryId, body
    add request    header, 20-byte master key, body (which starts with ledgerId and entryId)
    add response   header, int32 rc, int64 ledgerId, int64 entryId

Entry body, as stored on the bookies and returned by reads::

    [int64 ledgerId][int64 entryId][int64 lastAddConfirmed][int64 ledger length incl. this entry]
    [digest][payload]

The digest covers the 32 header bytes followed by the payload: CRC32C (4 bytes), CRC32 (8 bytes:
the CRC in the low half of a long), HMAC-SHA1 (20 bytes, keyed by SHA-1(``b"mac"`` + password)),
or nothing (DUMMY). The master key is SHA-1(``b"ledger"`` + password).

Hot paths are hand-written and tested against the generated protobuf code: encoding read
requests (:func:`encode_read_request`) and read responses (:func:`read_response_parts`, which
never copies the body), and decoding large read responses (:func:`decode_response` hands out the
body as a slice of the frame instead of a protobuf copy).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import crc32c

from offloadd._proto import bookkeeper_protocol_pb2 as pb
from offloadd.errors import FormatError
from offloadd.format.varint import encode_varint as _varint_slow

__all__ = [
    "ENTRY_HEADER_LEN",
    "LAST_ADD_CONFIRMED",
    "AddRequest",
    "AddResponse",
    "Digest",
    "DigestError",
    "DigestType",
    "Entry",
    "Flag",
    "Op",
    "ReadLacRequest",
    "ReadLacResponse",
    "ReadRequest",
    "ReadResponse",
    "Request",
    "Response",
    "Status",
    "V2AddRequest",
    "V2AddResponse",
    "V2ReadRequest",
    "V2ReadResponse",
    "decode_entry",
    "decode_request",
    "decode_response",
    "decode_v2_request",
    "decode_v2_response",
    "digest_for",
    "encode_entry",
    "encode_plain_reads",
    "encode_read_request",
    "encode_request",
    "encode_response",
    "encode_v2",
    "frame",
    "mac_key",
    "master_key",
    "read_response_parts",
    "split_frames",
]

PROTOCOL_VERSION = 3
LAST_ADD_CONFIRMED = -1  # entryId of a read asking for the bookie's last entry
ENTRY_HEADER_LEN = 32
MAX_FRAME = 64 * 1024 * 1024  # larger than any entry Pulsar writes (5 MiB by default)
_FAST_DECODE_MIN = 4096  # below this the protobuf parser beats the Python one

_U32 = struct.Struct(">I")
_ENTRY_HEADER = struct.Struct(">qqqq")
_V2_READ_REQ = struct.Struct(">iqq")
_V2_RESP = struct.Struct(">iiqq")
_CRC32 = struct.Struct(">q")
_CRC32C = struct.Struct(">I")


class Op(enum.IntEnum):
    READ_ENTRY = 1
    ADD_ENTRY = 2
    AUTH = 5
    WRITE_LAC = 6
    READ_LAC = 7
    GET_BOOKIE_INFO = 8
    START_TLS = 9
    FORCE_LEDGER = 10


class Status(enum.IntEnum):
    EOK = 0
    ENOLEDGER = 402
    ENOENTRY = 403
    EBADREQ = 404
    EIO = 501
    EUA = 502
    EBADVERSION = 503
    EFENCED = 504
    EREADONLY = 505
    ETOOMANYREQUESTS = 506
    EUNKNOWNLEDGERSTATE = 507


class Flag(enum.IntEnum):
    """``ReadRequest.flag``."""

    FENCE_LEDGER = 1
    ENTRY_PIGGYBACK = 2


class DigestType(enum.IntEnum):
    CRC32 = 1
    HMAC = 2
    CRC32C = 3
    DUMMY = 4


class DigestError(FormatError):
    """An entry body whose digest does not match: corrupt on that bookie, or a wrong password."""


def status_name(code: int) -> str:
    try:
        return Status(code).name
    except ValueError:
        return f"status {code}"


# ---- frames -----------------------------------------------------------------------------------


def frame(payload: bytes) -> bytes:
    return _U32.pack(len(payload)) + payload


def split_frames(buf: bytes | bytearray | memoryview, where: str = "stream"
                 ) -> tuple[list[memoryview], int]:
    """Complete frames at the start of ``buf`` (views, not copies) and the bytes consumed."""
    view = memoryview(buf)
    out: list[memoryview] = []
    pos = 0
    end = len(view)
    while end - pos >= 4:
        (n,) = _U32.unpack_from(view, pos)
        if n > MAX_FRAME:
            raise FormatError(where, pos, f"frame of {n} bytes exceeds the {MAX_FRAME} limit")
        if end - pos - 4 < n:
            break
        out.append(view[pos + 4:pos + 4 + n])
        pos += 4 + n
    return out, pos


# ---- digests and entry bodies -----------------------------------------------------------------


def master_key(password: bytes) -> bytes:
    return hashlib.sha1(b"ledger" + password).digest()


def mac_key(password: bytes) -> bytes:
    return hashlib.sha1(b"mac" + password).digest()


class Digest:
    """One ledger's digest: ``size`` bytes after the 32-byte header, over header + payload."""

    kind: DigestType
    size: int

    def sign(self, header: bytes | memoryview, payload: bytes | memoryview) -> bytes:
        raise NotImplementedError

    def matches(self, header: memoryview, stored: memoryview, payload: memoryview) -> bool:
        return hmac.compare_digest(self.sign(header, payload), stored)


class _Crc32c(Digest):
    kind = DigestType.CRC32C
    size = 4

    def sign(self, header: bytes | memoryview, payload: bytes | memoryview) -> bytes:
        return _CRC32C.pack(crc32c.crc32c(payload, crc32c.crc32c(header)))

    def matches(self, header: memoryview, stored: memoryview, payload: memoryview) -> bool:
        return bool(crc32c.crc32c(payload, crc32c.crc32c(header))
                    == _CRC32C.unpack_from(stored)[0])


class _Crc32(Digest):
    kind = DigestType.CRC32
    size = 8

    def sign(self, header: bytes | memoryview, payload: bytes | memoryview) -> bytes:
        return _CRC32.pack(zlib.crc32(payload, zlib.crc32(header)))


class _Hmac(Digest):
    kind = DigestType.HMAC
    size = 20

    def __init__(self, password: bytes) -> None:
        self._key = mac_key(password)

    def sign(self, header: bytes | memoryview, payload: bytes | memoryview) -> bytes:
        mac = hmac.new(self._key, header, hashlib.sha1)
        mac.update(payload)
        return mac.digest()


class _Dummy(Digest):
    kind = DigestType.DUMMY
    size = 0

    def sign(self, header: bytes | memoryview, payload: bytes | memoryview) -> bytes:
        return b""

    def matches(self, header: memoryview, stored: memoryview, payload: memoryview) -> bool:
        return True


_CRC32C_DIGEST = _Crc32c()
_CRC32_DIGEST = _Crc32()
_DUMMY_DIGEST = _Dummy()


def digest_for(kind: int, password: bytes) -> Digest:
    """The digest of a ledger of this ``digestType``; ``FormatError`` for an unknown type."""
    if kind == DigestType.CRC32C:
        return _CRC32C_DIGEST
    if kind == DigestType.CRC32:
        return _CRC32_DIGEST
    if kind == DigestType.HMAC:
        return _Hmac(password)
    if kind == DigestType.DUMMY:
        return _DUMMY_DIGEST
    raise FormatError("ledger metadata", 0, f"unknown BookKeeper digest type {kind}")


@dataclass(slots=True)
class Entry:
    """A verified entry: its header fields and the payload (a view into the body)."""

    ledger_id: int
    entry_id: int
    lac: int
    length: int
    payload: memoryview


def encode_entry(digest: Digest, ledger_id: int, entry_id: int, lac: int, length: int,
                 payload: bytes | memoryview) -> bytes:
    """The body a writer sends in an add: header, digest, payload. ``length`` is the ledger's
    payload bytes up to and including this entry."""
    header = _ENTRY_HEADER.pack(ledger_id, entry_id, lac, length)
    return b"".join((header, digest.sign(header, payload), payload))


def decode_entry(body: bytes | memoryview, digest: Digest, *, ledger_id: int | None = None,
                 entry_id: int | None = None, where: str = "entry") -> Entry:
    """Check the digest (and the ids, when given) and return the entry without copying.

    ``DigestError`` if the digest does not match, ``FormatError`` for a body too short or
    naming another entry.
    """
    view = memoryview(body)
    start = ENTRY_HEADER_LEN + digest.size
    if len(view) < start:
        raise FormatError(where, len(view), f"entry body of {len(view)} bytes is shorter than "
                          f"its {start}-byte header and digest")
    lid, eid, lac, length = _ENTRY_HEADER.unpack_from(view)
    if (ledger_id is not None and lid != ledger_id) or (entry_id is not None and eid != entry_id):
        raise FormatError(where, 0, f"body is entry {lid}:{eid}, expected {ledger_id}:{entry_id}")
    payload = view[start:]
    if not digest.matches(view[:ENTRY_HEADER_LEN], view[ENTRY_HEADER_LEN:start], payload):
        raise DigestError(where, ENTRY_HEADER_LEN,
                          f"{digest.kind.name} digest of entry {lid}:{eid} does not match "
                          "(corrupt replica, or the wrong digest password)")
    return Entry(lid, eid, lac, length, payload)


# ---- varints (protobuf wire format) -----------------------------------------------------------


_VARINTS = [_varint_slow(v) for v in range(1 << 14)]  # every one- and two-byte varint
_MINUS_ONE = _varint_slow(-1)  # the LAC of an empty ledger, everywhere


def _varint(v: int) -> bytes:
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


# ---- v3 messages ------------------------------------------------------------------------------


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


@dataclass(slots=True)
class AddRequest:
    op: ClassVar[Op] = Op.ADD_ENTRY
    txn_id: int
    ledger_id: int
    entry_id: int
    master_key: bytes
    body: bytes | memoryview
    flag: int | None = None
    write_flags: int | None = None
    priority: int | None = None


@dataclass(slots=True)
class ReadLacRequest:
    op: ClassVar[Op] = Op.READ_LAC
    txn_id: int
    ledger_id: int
    priority: int | None = None


Request = ReadRequest | AddRequest | ReadLacRequest


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
class AddResponse:
    op: ClassVar[Op] = Op.ADD_ENTRY
    txn_id: int
    status: int
    add_status: int | None = None
    ledger_id: int = 0
    entry_id: int = 0
    priority: int | None = None


@dataclass(slots=True)
class ReadLacResponse:
    op: ClassVar[Op] = Op.READ_LAC
    txn_id: int
    status: int
    lac_status: int | None = None
    ledger_id: int = 0
    lac_body: bytes | None = None
    last_entry_body: bytes | None = None
    priority: int | None = None


@dataclass(slots=True)
class OtherResponse:
    """A response to an operation offloadd does not send (kept for the error message)."""

    op_code: int
    txn_id: int
    status: int
    priority: int | None = None


Response = ReadResponse | AddResponse | ReadLacResponse | OtherResponse


def _header_bytes(op: int, txn_id: int, priority: int | None) -> bytes:
    h = b"\x08\x03\x10" + _varint(op) + b"\x18" + _varint(txn_id)
    if priority is not None:
        h += b"\x20" + _varint(priority)
    return b"\x0a" + _varint(len(h)) + h


def encode_read_request(req: ReadRequest) -> bytes:
    """A framed v3 read request, written by hand (the client's hot path)."""
    body = b"\x08" + _varint(req.ledger_id) + b"\x10" + _varint(req.entry_id)
    if req.master_key is not None:
        body += b"\x1a" + _varint(len(req.master_key)) + req.master_key
    if req.previous_lac is not None:
        body += b"\x20" + _varint(req.previous_lac)
    if req.timeout_ms is not None:
        body += b"\x28" + _varint(req.timeout_ms)
    if req.flag is not None:
        body += b"\xa0\x06" + _varint(req.flag)
    msg = _header_bytes(Op.READ_ENTRY, req.txn_id, req.priority) + b"\xa2\x06" + \
        _varint(len(body)) + body
    return _U32.pack(len(msg)) + msg


def encode_plain_reads(first_txn: int, ledger_id: int, entry_ids: Sequence[int]) -> bytes:
    """Framed plain read requests for ``entry_ids`` with txnIds ``first_txn, first_txn + 1,
    ...``, back to back: what :func:`encode_read_request` gives one by one, built faster."""
    led = b"\x08" + _varint(ledger_id) + b"\x10"
    out: list[bytes] = []
    txn = first_txn
    for entry_id in entry_ids:
        body = led + _varint(entry_id)
        head = b"\x08\x03\x10\x01\x18" + _varint(txn)
        txn += 1
        n = 2 + len(head) + 3 + len(body)  # both lengths fit one varint byte
        out.append(_U32.pack(n) + b"\x0a" + bytes((len(head),)) + head + b"\xa2\x06"
                   + bytes((len(body),)) + body)
    return b"".join(out)


def _pb_header(h: pb.BKPacketHeader, op: int, txn_id: int, priority: int | None) -> None:
    h.version = pb.VERSION_THREE
    h.operation = op  # type: ignore[assignment]
    h.txnId = txn_id
    if priority is not None:
        h.priority = priority


def encode_request(req: Request) -> bytes:
    """Any v3 request, framed."""
    if isinstance(req, ReadRequest):
        return encode_read_request(req)
    msg = pb.Request()
    _pb_header(msg.header, req.op, req.txn_id, req.priority)
    if isinstance(req, AddRequest):
        a = msg.addRequest
        a.ledgerId, a.entryId, a.masterKey, a.body = (req.ledger_id, req.entry_id,
                                                      req.master_key, bytes(req.body))
        if req.flag is not None:
            a.flag = req.flag  # type: ignore[assignment]
        if req.write_flags is not None:
            a.writeFlags = req.write_flags
    else:
        msg.readLacRequest.ledgerId = req.ledger_id
    return frame(msg.SerializeToString())


def _parse(message: pb.Request | pb.Response, data: bytes | memoryview, where: str) -> None:
    try:
        message.ParseFromString(bytes(data))
    except Exception as exc:  # protobuf raises DecodeError and friends
        raise FormatError(where, 0, f"not a BookKeeper v3 {type(message).__name__} ({exc})"
                          ) from exc
    if not message.IsInitialized():
        missing: list[str] = getattr(message, "FindInitializationErrors", list)()
        raise FormatError(where, 0, f"v3 {type(message).__name__} lacks required fields: "
                          f"{', '.join(missing)}")
    if message.header.version != PROTOCOL_VERSION:
        raise FormatError(where, 0, f"protocol version {message.header.version}, expected 3")


def _opt(msg: object, name: str) -> int | None:
    return getattr(msg, name) if msg.HasField(name) else None  # type: ignore[attr-defined]


def decode_request(data: bytes | memoryview, where: str = "request") -> Request:
    """A v3 request frame's payload (without the length). ``FormatError`` for junk, and for
    operations other than read, add and read-LAC."""
    msg = pb.Request()
    _parse(msg, data, where)
    h = msg.header
    prio = _opt(h, "priority")
    op = int(h.operation)
    if op == Op.READ_ENTRY and msg.HasField("readRequest"):
        r = msg.readRequest
        return ReadRequest(h.txnId, r.ledgerId, r.entryId,
                           r.masterKey if r.HasField("masterKey") else None,
                           _opt(r, "previousLAC"), _opt(r, "timeOut"), _opt(r, "flag"), prio)
    if op == Op.ADD_ENTRY and msg.HasField("addRequest"):
        a = msg.addRequest
        return AddRequest(h.txnId, a.ledgerId, a.entryId, a.masterKey, a.body, _opt(a, "flag"),
                          _opt(a, "writeFlags"), prio)
    if op == Op.READ_LAC and msg.HasField("readLacRequest"):
        return ReadLacRequest(h.txnId, msg.readLacRequest.ledgerId, prio)
    raise FormatError(where, 0, f"unsupported v3 request: operation {h.operation} "
                      f"(txnId {h.txnId})")


def read_response_parts(resp: ReadResponse) -> list[bytes | memoryview]:
    """A framed read response as pieces for ``writelines``: the body is not copied."""
    head = (_header_bytes(Op.READ_ENTRY, resp.txn_id, resp.priority) + b"\x10"
            + _varint(resp.status))
    if resp.read_status is None:
        return [_U32.pack(len(head)) + head]
    inner = (b"\x08" + _varint(resp.read_status) + b"\x10" + _varint(resp.ledger_id)
             + b"\x18" + _varint(resp.entry_id))
    body = resp.body
    blen = 0 if body is None else len(body)
    if body is not None:
        inner += b"\x22" + _varint(blen)
    tail = b""
    if resp.max_lac is not None:
        tail += b"\x28" + _varint(resp.max_lac)
    if resp.lac_update_ts is not None:
        tail += b"\x30" + _varint(resp.lac_update_ts)
    head += b"\xa2\x06" + _varint(len(inner) + blen + len(tail)) + inner
    parts: list[bytes | memoryview] = [_U32.pack(len(head) + blen + len(tail)) + head]
    if blen:
        assert body is not None
        parts.append(body)
    if tail:
        parts.append(tail)
    return parts


def encode_response(resp: Response) -> bytes:
    """Any v3 response, framed."""
    if isinstance(resp, ReadResponse):
        return b"".join(read_response_parts(resp))
    msg = pb.Response()
    if isinstance(resp, OtherResponse):
        _pb_header(msg.header, resp.op_code, resp.txn_id, resp.priority)
        msg.status = resp.status  # type: ignore[assignment]
        return frame(msg.SerializeToString())
    _pb_header(msg.header, resp.op, resp.txn_id, resp.priority)
    msg.status = resp.status  # type: ignore[assignment]
    if isinstance(resp, AddResponse):
        if resp.add_status is not None:
            a = msg.addResponse
            a.status = resp.add_status  # type: ignore[assignment]
            a.ledgerId, a.entryId = resp.ledger_id, resp.entry_id
    elif resp.lac_status is not None:
        r = msg.readLacResponse
        r.status = resp.lac_status  # type: ignore[assignment]
        r.ledgerId = resp.ledger_id
        if resp.lac_body is not None:
            r.lacBody = resp.lac_body
        if resp.last_entry_body is not None:
            r.lastEntryBody = resp.last_entry_body
    return frame(msg.SerializeToString())


def _fast_read_response(view: memoryview) -> ReadResponse | None:
    """Parse a read response without copying its body; None when it holds anything unusual
    (the protobuf parser then decides)."""
    end = len(view)
    pos = 0
    op = txn = status = version = None
    prio: int | None = None
    rstatus: int | None = None
    ledger: int | None = None
    entry: int | None = None
    body: memoryview | None = None
    max_lac: int | None = None
    lac_ts: int | None = None
    seen_inner = False
    while pos < end:
        tag, pos = _read_varint(view, pos, end)
        if tag == 0x0A:
            n, pos = _read_varint(view, pos, end)
            stop = pos + n
            while pos < stop:
                t, pos = _read_varint(view, pos, stop)
                v, pos = _read_varint(view, pos, stop)
                if t == 0x08:
                    version = v
                elif t == 0x10:
                    op = v
                elif t == 0x18:
                    txn = v
                elif t == 0x20:
                    prio = v
                else:
                    return None
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
                    continue
                v, pos = _read_varint(view, pos, stop)
                if t == 0x08:
                    rstatus = v
                elif t == 0x10:
                    ledger = _signed(v)
                elif t == 0x18:
                    entry = _signed(v)
                elif t == 0x28:
                    max_lac = _signed(v)
                elif t == 0x30:
                    lac_ts = _signed(v)
                else:
                    return None
            if pos != stop or rstatus is None or ledger is None or entry is None:
                return None
        else:
            return None
    if (version != PROTOCOL_VERSION or op != Op.READ_ENTRY or txn is None or status is None
            or not seen_inner or ledger is None or entry is None):
        return None
    return ReadResponse(txn, status, rstatus, ledger, entry, body, max_lac, lac_ts, prio)


def decode_response(data: bytes | memoryview, where: str = "response", *,
                    fast_min: int = _FAST_DECODE_MIN) -> Response:
    """A v3 response frame's payload (without the length). Read responses of ``fast_min``
    bytes or more are parsed by hand so that their body stays a view into ``data``."""
    view = memoryview(data)
    if len(view) >= fast_min:
        try:
            fast = _fast_read_response(view)
        except (ValueError, IndexError):
            fast = None
        if fast is not None:
            return fast
    msg = pb.Response()
    _parse(msg, view, where)
    h = msg.header
    prio = _opt(h, "priority")
    op = int(h.operation)
    if op == Op.READ_ENTRY:
        if not msg.HasField("readResponse"):
            return ReadResponse(h.txnId, msg.status, priority=prio)
        r = msg.readResponse
        return ReadResponse(h.txnId, msg.status, r.status, r.ledgerId, r.entryId,
                            r.body if r.HasField("body") else None, _opt(r, "maxLAC"),
                            _opt(r, "lacUpdateTimestamp"), prio)
    if op == Op.ADD_ENTRY:
        if not msg.HasField("addResponse"):
            return AddResponse(h.txnId, msg.status, priority=prio)
        a = msg.addResponse
        return AddResponse(h.txnId, msg.status, a.status, a.ledgerId, a.entryId, prio)
    if op == Op.READ_LAC:
        if not msg.HasField("readLacResponse"):
            return ReadLacResponse(h.txnId, msg.status, priority=prio)
        rl = msg.readLacResponse
        return ReadLacResponse(h.txnId, msg.status, rl.status, rl.ledgerId,
                               rl.lacBody if rl.HasField("lacBody") else None,
                               rl.lastEntryBody if rl.HasField("lastEntryBody") else None, prio)
    return OtherResponse(op, h.txnId, msg.status, prio)


# ---- v2 (legacy) ------------------------------------------------------------------------------

_V2 = 2
_V2_ADD = 1
_V2_READ = 2
_V2_FENCE = 0x1
_MASTER_KEY_LEN = 20


@dataclass(slots=True)
class V2ReadRequest:
    ledger_id: int
    entry_id: int
    flags: int = 0
    master_key: bytes | None = None


@dataclass(slots=True)
class V2AddRequest:
    master_key: bytes
    body: bytes
    flags: int = 0


@dataclass(slots=True)
class V2ReadResponse:
    rc: int
    ledger_id: int
    entry_id: int
    body: bytes
    flags: int = 0


@dataclass(slots=True)
class V2AddResponse:
    rc: int
    ledger_id: int
    entry_id: int
    flags: int = 0


V2Message = V2ReadRequest | V2AddRequest | V2ReadResponse | V2AddResponse


def _v2_header(op: int, flags: int) -> int:
    return (_V2 << 24) | (op << 16) | flags


def encode_v2(msg: V2Message) -> bytes:
    """Any v2 message, framed."""
    if isinstance(msg, V2ReadRequest):
        out = _V2_READ_REQ.pack(_v2_header(_V2_READ, msg.flags), msg.ledger_id, msg.entry_id)
        if msg.flags & _V2_FENCE:
            out += msg.master_key or b""
    elif isinstance(msg, V2AddRequest):
        out = struct.pack(">i", _v2_header(_V2_ADD, msg.flags)) + msg.master_key + msg.body
    elif isinstance(msg, V2ReadResponse):
        out = _V2_RESP.pack(_v2_header(_V2_READ, msg.flags), msg.rc, msg.ledger_id,
                            msg.entry_id) + msg.body
    else:
        out = _V2_RESP.pack(_v2_header(_V2_ADD, msg.flags), msg.rc, msg.ledger_id, msg.entry_id)
    return frame(out)


def _v2_split(data: bytes, where: str) -> tuple[int, int]:
    if len(data) < 4:
        raise FormatError(where, 0, "v2 message shorter than its header")
    (header,) = struct.unpack_from(">i", data)
    version, op, flags = (header >> 24) & 0xFF, (header >> 16) & 0xFF, header & 0xFFFF
    if version != _V2:
        raise FormatError(where, 0, f"v2 header names protocol version {version}")
    return op, flags


def decode_v2_request(data: bytes, where: str = "v2 request") -> V2ReadRequest | V2AddRequest:
    op, flags = _v2_split(data, where)
    if op == _V2_READ:
        if len(data) < _V2_READ_REQ.size:
            raise FormatError(where, len(data), "v2 read request is truncated")
        _, ledger, entry = _V2_READ_REQ.unpack_from(data)
        key = data[_V2_READ_REQ.size:] if flags & _V2_FENCE else None
        return V2ReadRequest(ledger, entry, flags, key)
    if op == _V2_ADD:
        if len(data) < 4 + _MASTER_KEY_LEN:
            raise FormatError(where, len(data), "v2 add request is truncated")
        return V2AddRequest(data[4:4 + _MASTER_KEY_LEN], data[4 + _MASTER_KEY_LEN:], flags)
    raise FormatError(where, 0, f"unsupported v2 opcode {op}")


def decode_v2_response(data: bytes, where: str = "v2 response"
                       ) -> V2ReadResponse | V2AddResponse:
    op, flags = _v2_split(data, where)
    if len(data) < _V2_RESP.size:
        raise FormatError(where, len(data), "v2 response is truncated")
    _, rc, ledger, entry = _V2_RESP.unpack_from(data)
    if op == _V2_READ:
        return V2ReadResponse(rc, ledger, entry, data[_V2_RESP.size:], flags)
    if op == _V2_ADD:
        if len(data) != _V2_RESP.size:
            raise FormatError(where, _V2_RESP.size, "v2 add response has trailing bytes")
        return V2AddResponse(rc, ledger, entry, flags)
    raise FormatError(where, 0, f"unsupported v2 opcode {op}")
