"""BookKeeper's framing, status codes and entry bodies, shared by both protocol versions (pure:
no sockets, no asyncio).

Facts from ``../shared/BOOKKEEPER.md``, checked byte for byte against the captures in
``../shared/conformance/bookkeeper/``. All integers are big-endian. The two request/response
formats have a module each: :mod:`.v2` (fixed binary headers: bulk reads) and :mod:`.v3`
(protobuf: the tail of open ledgers).

Framing (both versions)::

    [uint32 length of what follows][payload]

A bookie decides per connection which protocol it speaks: it tries to parse the first request as
a v3 ``Request`` protobuf, and if that fails the connection speaks v2 from then on.

Entry body, as stored on the bookies and returned by reads::

    [int64 ledgerId][int64 entryId][int64 lastAddConfirmed][int64 ledger length incl. this entry]
    [digest][payload]

The digest covers the 32 header bytes followed by the payload: CRC32C (4 bytes), CRC32 (8 bytes:
the CRC in the low half of a long), HMAC-SHA1 (20 bytes, keyed by SHA-1(``b"mac"`` + password)),
or nothing (DUMMY).

:func:`check_bodies` checks a whole batch of bodies in one pass (the read path's hot loop: one
``unpack_from`` and CRC32C over two slices per entry, no object per entry but the payload view);
:func:`decode_entry` checks one body and describes it (LAC reads, long polls).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, cast

import crc32c

from offloadd.errors import FormatError

__all__ = [
    "ENTRY_HEADER_LEN",
    "LAST_ADD_CONFIRMED",
    "MAX_FRAME",
    "Checked",
    "Digest",
    "DigestError",
    "DigestType",
    "Entry",
    "Status",
    "check_bodies",
    "decode_entry",
    "digest_for",
    "frame",
    "missing_fields",
    "split_frames",
    "status_name",
]

LAST_ADD_CONFIRMED = -1  # entryId of a read asking for the bookie's last entry
ENTRY_HEADER_LEN = 32
MAX_FRAME = 64 * 1024 * 1024  # larger than any entry Pulsar writes (5 MiB by default)

U32 = struct.Struct(">I")
ENTRY_HEADER = struct.Struct(">qqqq")
_CRC32C_BODY = struct.Struct(">qqqqI")  # the header and a CRC32C digest: 36 bytes
_CRC32 = struct.Struct(">q")
_CRC32C = struct.Struct(">I")


class Status(enum.IntEnum):
    """Status codes as protocol v3 numbers them (v2's numbers are mapped onto these)."""

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


class _Message(Protocol):
    # what protobuf's Python runtime offers (its stubs leave the argument out)
    def IsInitialized(self, errors: list[str]) -> bool: ...


def missing_fields(message: object) -> list[str]:
    """The required fields a parsed protobuf message lacks (empty when it is complete)."""
    errors: list[str] = []
    cast(_Message, message).IsInitialized(errors)
    return errors


# ---- frames -----------------------------------------------------------------------------------


def frame(payload: bytes) -> bytes:
    return U32.pack(len(payload)) + payload


def split_frames(buf: bytes | bytearray | memoryview, where: str = "stream"
                 ) -> tuple[list[memoryview], int]:
    """Complete frames at the start of ``buf`` (views, not copies) and the bytes consumed."""
    view = memoryview(buf)
    out: list[memoryview] = []
    pos = 0
    end = len(view)
    while end - pos >= 4:
        (n,) = U32.unpack_from(view, pos)
        if n > MAX_FRAME:
            raise FormatError(where, pos, f"frame of {n} bytes exceeds the {MAX_FRAME} limit")
        if end - pos - 4 < n:
            break
        out.append(view[pos + 4:pos + 4 + n])
        pos += 4 + n
    return out, pos


# ---- digests ----------------------------------------------------------------------------------


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
        self._key = hashlib.sha1(b"mac" + password).digest()

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


# ---- entry bodies -----------------------------------------------------------------------------


@dataclass(slots=True)
class Entry:
    """A verified entry: its header fields and the payload (a view into the body)."""

    ledger_id: int
    entry_id: int
    lac: int
    length: int
    payload: memoryview


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
    lid, eid, lac, length = ENTRY_HEADER.unpack_from(view)
    if (ledger_id is not None and lid != ledger_id) or (entry_id is not None and eid != entry_id):
        raise FormatError(where, 0, f"body is entry {lid}:{eid}, expected {ledger_id}:{entry_id}")
    payload = view[start:]
    if not digest.matches(view[:ENTRY_HEADER_LEN], view[ENTRY_HEADER_LEN:start], payload):
        raise DigestError(where, ENTRY_HEADER_LEN,
                          f"{digest.kind.name} digest of entry {lid}:{eid} does not match "
                          "(corrupt replica, or the wrong digest password)")
    return Entry(lid, eid, lac, length, payload)


@dataclass(slots=True)
class Checked:
    """What :func:`check_bodies` found: ``payloads[k]`` is the payload of body ``k`` (a view),
    or None where ``failed[k]`` says why not (``"digest"`` or ``"format"``, and a detail);
    ``tail`` is (entryId, lastAddConfirmed, ledger length) of the last good body."""

    payloads: list[memoryview | None]
    failed: dict[int, tuple[str, str]]
    tail: tuple[int, int, int] | None


def check_bodies(bodies: Sequence[memoryview | None], ids: Sequence[int], ledger_id: int,
                 digest: Digest, where: str) -> Checked:
    """Check each body (``None`` entries are skipped) against its expected entry id ``ids[k]``
    and the digest, in one pass."""
    if digest is _CRC32C_DIGEST:
        return _check_crc32c(bodies, ids, ledger_id, where)
    payloads: list[memoryview | None] = [None] * len(bodies)
    failed: dict[int, tuple[str, str]] = {}
    tail: tuple[int, int, int] | None = None
    for k, body in enumerate(bodies):
        if body is None:
            continue
        try:
            e = decode_entry(body, digest, ledger_id=ledger_id, entry_id=ids[k], where=where)
        except DigestError as exc:
            failed[k] = ("digest", str(exc))
            continue
        except FormatError as exc:
            failed[k] = ("format", str(exc))
            continue
        payloads[k] = e.payload
        tail = (e.entry_id, e.lac, e.length)
    return Checked(payloads, failed, tail)


def _check_crc32c(bodies: Sequence[memoryview | None], ids: Sequence[int], ledger_id: int,
                  where: str) -> Checked:
    # the hot loop of every bulk read: keep it to one unpack and two CRC calls per entry
    n = len(bodies)
    payloads: list[memoryview | None] = [None] * n
    failed: dict[int, tuple[str, str]] = {}
    unpack = _CRC32C_BODY.unpack_from
    crc = crc32c.crc32c
    last = -1
    for k in range(n):
        body = bodies[k]
        if body is None:
            continue
        if len(body) < 36:
            failed[k] = ("format", f"{where}: entry body of {len(body)} bytes is shorter than "
                         "its 36-byte header and digest")
            continue
        lid, eid, _, _, stored = unpack(body)
        if lid != ledger_id or eid != ids[k]:
            failed[k] = ("format", f"{where}: body is entry {lid}:{eid}, expected "
                         f"{ledger_id}:{ids[k]}")
            continue
        payload = body[36:]
        if crc(payload, crc(body[:32])) != stored:
            failed[k] = ("digest", f"{where}: CRC32C digest of entry {lid}:{eid} does not "
                         "match (corrupt replica)")
            continue
        payloads[k] = payload
        last = k
    tail = None
    if last >= 0:
        body = bodies[last]
        assert body is not None
        eid, lac, length = unpack(body)[1:4]
        tail = (eid, lac, length)
    return Checked(payloads, failed, tail)
