"""BookKeeper's protocol v2 for reads (pure): fixed binary headers, what Pulsar's brokers speak.

Facts from ``../shared/BOOKKEEPER.md`` and the v2 capture in ``conformance/bookkeeper/`` (a real
bookie and BookKeeper's Java client), and for batched reads from BookKeeper 4.17's BP-62. All
integers big-endian. Every frame is ``[uint32 length][payload]``; the payload opens with a
packet header ``int32 = version(2) << 24 | opcode << 16 | flags``::

    read request (opcode 2), 24 bytes with the length:
        00000014 02020000 [int64 ledgerId] [int64 entryId]        flags 0: a plain read
    read response:
        [header] [int32 rc] [int64 ledgerId] [int64 entryId] [entry body, only when rc = EOK]

    batched read request (opcode 7, bookies of BookKeeper 4.17 and later):
        [header] [int64 ledgerId] [int64 firstEntryId] [int64 requestId] [int32 maxCount]
        [int64 maxSize]
    batched read response:
        [header] [int32 rc] [int64 ledgerId] [int64 firstEntryId] [int64 requestId]
        then, for entries firstEntryId, firstEntryId + 1, ...: [int32 size] [entry body]

A v2 read carries no transaction id: answers are matched by (ledgerId, entryId), batched answers
by ``requestId``. A batched read answers *at most* ``maxCount`` entries, and fewer when the next
would make the response larger than ``maxSize`` (the bookie counts 36 bytes of headers plus
4 + body per entry, and always answers at least one) or the bookie lacks it; on a striped
ledger (ensemble larger than write quorum) a bookie holds runs of at most write-quorum
consecutive entries. A bookie that predates batched reads answers opcode 7 with ``EBADREQ`` or
drops the connection (its decoder does not know the opcode).

v2 cannot express a long poll (no ``previousLAC``/``timeOut``) nor report ``maxLAC``: the tail of
an open ledger is read over v3 (:mod:`.v3`). Its status codes have their own numbers, mapped here
onto :class:`~offloadd.ledger.bookkeeper.codec.Status`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence

from offloadd.errors import FormatError
from offloadd.ledger.bookkeeper.codec import MAX_FRAME, Status

__all__ = [
    "BATCH_READ",
    "READ",
    "encode_batch_read",
    "encode_reads",
    "iter_responses",
    "split_batch",
    "status_of",
]

VERSION = 2
READ = 2
BATCH_READ = 7
READ_HEADER = (VERSION << 24) | (READ << 16)
BATCH_HEADER = (VERSION << 24) | (BATCH_READ << 16)
BATCH_OVERHEAD = 36  # what a bookie counts against maxSize before the first entry

_READ_REQ = struct.Struct(">Iiq")  # length, header, ledgerId (the entryId follows)
_BATCH_REQ = struct.Struct(">Iiqqqiq")
_RESP = struct.Struct(">Iiiqq")  # length, header, rc, ledgerId, entryId
_RID = struct.Struct(">q")
_SIZE = struct.Struct(">i")

# v2 numbers → v3's (BookieProtocol.java)
_STATUS = {0: Status.EOK, 1: Status.ENOLEDGER, 2: Status.ENOENTRY, 100: Status.EBADREQ,
           101: Status.EIO, 102: Status.EUA, 103: Status.EBADVERSION, 104: Status.EFENCED,
           105: Status.EREADONLY, 106: Status.ETOOMANYREQUESTS,
           107: Status.EUNKNOWNLEDGERSTATE}


def status_of(rc: int) -> int:
    """A v2 rc as a v3 :class:`Status` number (an unknown one is a server error, ``EIO``)."""
    return _STATUS.get(rc, Status.EIO)


def encode_reads(ledger_id: int, entry_ids: Sequence[int]) -> bytes:
    """Framed plain read requests of ``entry_ids``, back to back, built without a loop: the
    16-byte prefix repeated, then the big-endian ids written into every 24-byte slot by eight
    strided copies."""
    n = len(entry_ids)
    out = bytearray((_READ_REQ.pack(20, READ_HEADER, ledger_id) + bytes(8)) * n)
    ids = struct.pack(f">{n}q", *entry_ids)
    for k in range(8):
        out[16 + k::24] = ids[k::8]
    return bytes(out)


def encode_batch_read(ledger_id: int, first_entry_id: int, request_id: int, max_count: int,
                      max_size: int) -> bytes:
    """A framed batched read request (BookKeeper 4.17+)."""
    return _BATCH_REQ.pack(_BATCH_REQ.size - 4, BATCH_HEADER, ledger_id, first_entry_id,
                           request_id, max_count, max_size)


def iter_responses(view: memoryview, where: str
                   ) -> Iterator[tuple[int, int, int, int, int, int, memoryview | None]]:
    """Walk the complete response frames at the start of ``view``, one tuple per frame::

        (end of the frame in view, opcode, status as v3 numbers it, ledgerId, entryId or
         firstEntryId, requestId (0 for a plain read), body)

    ``body`` is a view of the entry body of a read (None when the rc is not EOK), or of the
    sized bodies of a batched read (see :func:`split_batch`). It stops before a frame that is not
    all there yet. ``FormatError`` for a frame that is not a v2 read or batched read answer."""
    pos = 0
    end = len(view)
    unpack = _RESP.unpack_from
    while end - pos >= 28:
        n, header, rc, ledger_id, entry_id = unpack(view, pos)
        stop = pos + 4 + n
        if n > MAX_FRAME:
            raise FormatError(where, pos, f"frame of {n} bytes exceeds the {MAX_FRAME} limit")
        if stop > end:
            return
        if header == READ_HEADER:
            if n < 24:
                raise FormatError(where, pos, f"v2 read response of {n} bytes is truncated")
            yield (stop, READ, _STATUS.get(rc, Status.EIO), ledger_id, entry_id, 0,
                   view[pos + 28:stop] if rc == 0 else None)
        elif header == BATCH_HEADER:
            if n < 32:
                raise FormatError(where, pos, f"v2 batched read response of {n} bytes is "
                                  "truncated")
            (rid,) = _RID.unpack_from(view, pos + 28)
            yield (stop, BATCH_READ, _STATUS.get(rc, Status.EIO), ledger_id, entry_id, rid,
                   view[pos + 36:stop] if rc == 0 else None)
        else:
            raise FormatError(where, pos, f"v2 header {header & 0xFFFFFFFF:08x} is not an "
                              "answer to a read")
        pos = stop


def split_batch(sized: memoryview, where: str) -> list[memoryview]:
    """The entry bodies of a batched read answer (``[int32 size][body]`` each, in order)."""
    out: list[memoryview] = []
    pos = 0
    end = len(sized)
    unpack = _SIZE.unpack_from
    while pos < end:
        if end - pos < 4:
            raise FormatError(where, pos, "batched read answer ends inside an entry size")
        (size,) = unpack(sized, pos)
        if size < 0 or pos + 4 + size > end:
            raise FormatError(where, pos, f"batched read answer names an entry of {size} "
                              f"bytes; {end - pos - 4} are left")
        out.append(sized[pos + 4:pos + 4 + size])
        pos += 4 + size
    return out
