"""A fake bookie for benchmarks: one generated, closed CRC32C ledger served from answers encoded
before it starts listening, so that the bookie is not what a benchmark measures.

Unlike ``tests/fixtures/fake_bookie.py`` (a hostile bookie for tests) it only reads: v2 plain
and batched reads (BookKeeper 4.17+; ``--batch no`` plays an older bookie and drops the
connection) and v3 plain reads of the shape offloadd sends, the protocol picked per connection
from the first request as a bookie does. A v2 answer is one pre-encoded frame per entry; a v3
answer or a batched one is a few pre-encoded pieces around a view of the entry body. Every
answer to what one read of the socket brought leaves in one ``writelines``, ``--latency-ms``
later. With ``--stripe POS:E:WQ`` it holds only the entries a bookie at ensemble position
``POS`` of an ensemble of ``E`` with write quorum ``WQ`` holds (entry ``e`` when
``(POS - e) mod E < WQ``), as BookKeeper stripes them.

    python bench/bookie_server.py --ledger 7 --entries N --size S [--stripe POS:E:WQ]
        [--latency-ms 0.2] [--batch yes|no] [--cpu K]

prints ``ready host:port`` once listening.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import struct
import sys
from pathlib import Path
from typing import cast

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from offloadd.ledger.bookkeeper import v2  # noqa: E402
from offloadd.ledger.bookkeeper.codec import DigestType, digest_for  # noqa: E402
from offloadd.ledger.bookkeeper.v3 import header_bytes, varint  # noqa: E402
from tests.fixtures.bookie_wire import encode_entry  # noqa: E402

_REQ = struct.Struct(">Ii")
_V2_READ = struct.Struct(">qq")
_V2_BATCH = struct.Struct(">qqqiq")
_RESP = struct.Struct(">Iiiqq")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_RID = struct.Struct(">q")


def payload_of(entry_id: int, size: int) -> bytes:
    """Entry ``entry_id``'s payload: its id, then a byte pattern (readers can check it)."""
    pattern = bytes(range(256)) * (size // 256 + 1)
    return (entry_id.to_bytes(8, "big") + pattern)[:size]


class Ledger:
    """The answers, encoded once."""

    def __init__(self, ledger_id: int, entries: int, size: int,
                 stripe: tuple[int, int, int] | None) -> None:
        self.ledger_id = ledger_id
        digest = digest_for(DigestType.CRC32C, b"")
        self.v2: dict[int, bytes] = {}  # whole v2 answer frames
        self.bodies: dict[int, memoryview] = {}  # views into them
        self.v3: dict[int, tuple[bytes, bytes]] = {}  # readResponse before / after the body
        length = 0
        lac = entries - 1
        for e in range(entries):
            payload = payload_of(e, size)
            length += len(payload)
            if stripe is not None and (stripe[0] - e) % stripe[1] >= stripe[2]:
                continue
            body = encode_entry(digest, ledger_id, e, e - 1, length, payload)
            frame = _RESP.pack(24 + len(body), v2.READ_HEADER, 0, ledger_id, e) + body
            self.v2[e] = frame
            self.bodies[e] = memoryview(frame)[28:]
            self.v3[e] = (b"\x08\x00\x10" + varint(ledger_id) + b"\x18" + varint(e) + b"\x22"
                          + varint(len(body)), b"\x28" + varint(lac))

    def v2_answer(self, ledger_id: int, entry_id: int) -> bytes:
        frame = self.v2.get(entry_id) if ledger_id == self.ledger_id else None
        if frame is None:
            rc = 2 if ledger_id == self.ledger_id else 1  # ENOENTRY, ENOLEDGER
            return _RESP.pack(24, v2.READ_HEADER, rc, ledger_id, entry_id)
        return frame

    def batch_answer(self, ledger_id: int, first: int, rid: int, count: int,
                     max_size: int) -> list[bytes | memoryview]:
        bodies = self.bodies if ledger_id == self.ledger_id else {}
        parts: list[bytes | memoryview] = []
        size = v2.BATCH_OVERHEAD
        e = first
        limit = count if count > 0 else 1 << 62
        while e in bodies and e - first < limit:
            b = bodies[e]
            if parts and size + 4 + len(b) > max_size:
                break
            size += 4 + len(b)
            parts += [_I32.pack(len(b)), b]
            e += 1
        rc = 0 if parts else (2 if ledger_id == self.ledger_id else 1)
        head = _RESP.pack(32 + size - v2.BATCH_OVERHEAD, v2.BATCH_HEADER, rc, ledger_id,
                          first) + _RID.pack(rid)
        return [head, *parts]

    def v3_answer(self, txn: int, ledger_id: int, entry_id: int) -> list[bytes | memoryview]:
        if ledger_id != self.ledger_id or entry_id not in self.v3:
            inner = b"\x08\x93\x03\x10" + varint(ledger_id) + b"\x18" + varint(entry_id)
            msg = header_bytes(1, txn, None) + b"\x10\x93\x03\xa2\x06" + varint(len(inner)) \
                + inner
            return [_U32.pack(len(msg)) + msg]
        before, after = self.v3[entry_id]
        body = self.bodies[entry_id]
        n = len(before) + len(body) + len(after)
        msg = header_bytes(1, txn, None) + b"\x10\x00\xa2\x06" + varint(n) + before
        return [_U32.pack(len(msg) + len(body) + len(after)) + msg, body, after]


def _varint_at(buf: bytes | bytearray, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result - (1 << 64) if result >= 1 << 63 else result, pos
        shift += 7


def _v3_read(frame: bytes | bytearray, pos: int) -> tuple[int, int, int]:
    """(txnId, ledgerId, entryId) of a plain v3 read as offloadd encodes it."""
    pos += 2  # 0a LEN
    _, pos = _varint_at(frame, pos + 1)  # 08 version
    _, pos = _varint_at(frame, pos + 1)  # 10 operation
    txn, pos = _varint_at(frame, pos + 1)  # 18 txnId
    _, pos = _varint_at(frame, pos + 2)  # a2 06 LEN
    ledger, pos = _varint_at(frame, pos + 1)  # 08 ledgerId
    entry, pos = _varint_at(frame, pos + 1)  # 10 entryId
    return txn, ledger, entry


class _Conn(asyncio.Protocol):
    def __init__(self, ledger: Ledger, latency_s: float, batch: bool) -> None:
        self.ledger = ledger
        self.latency_s = latency_s
        self.batch = batch
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.version: int | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.buf:
            self.buf += data
            buf: bytes | bytearray = self.buf
        else:
            buf = data
        out: list[bytes | memoryview] = []
        pos = 0
        end = len(buf)
        led = self.ledger
        while end - pos >= 8:
            n, header = _REQ.unpack_from(buf, pos)
            if end - pos - 4 < n:
                break
            if self.version is None:
                self.version = 2 if buf[pos + 4] == v2.VERSION else 3
            if self.version == 3:
                out += led.v3_answer(*_v3_read(buf, pos + 4))
            elif header == v2.READ_HEADER:
                out.append(led.v2_answer(*_V2_READ.unpack_from(buf, pos + 8)))
            elif header == v2.BATCH_HEADER and self.batch:
                ledger_id, first, rid, count, size = _V2_BATCH.unpack_from(buf, pos + 8)
                out += led.batch_answer(ledger_id, first, rid, count, size)
            else:  # an older bookie does not know the opcode: its decoder gives up
                assert self.transport is not None
                self.transport.abort()
                return
            pos += 4 + n
        if buf is self.buf:
            del self.buf[:pos]
        elif pos < end:
            self.buf = bytearray(buf[pos:])
        if not out or self.transport is None:
            return
        if self.latency_s > 0:
            asyncio.get_running_loop().call_later(self.latency_s, self._write, out)
        else:
            self._write(out)

    def _write(self, out: list[bytes | memoryview]) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(out)


async def _main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="bookie_server")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--ledger", type=int, default=7)
    ap.add_argument("--entries", type=int, required=True)
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--stripe", default=None, help="POS:E:WQ")
    ap.add_argument("--latency-ms", type=float, default=0.0)
    ap.add_argument("--batch", choices=["yes", "no"], default="yes")
    ap.add_argument("--cpu", type=int, default=None, help="pin to this CPU")
    args = ap.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    stripe = None
    if args.stripe:
        pos, ens, wq = (int(x) for x in args.stripe.split(":"))
        stripe = (pos, ens, wq)
    ledger = Ledger(args.ledger, args.entries, args.size, stripe)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: _Conn(ledger, args.latency_ms / 1000, args.batch == "yes"), args.host,
        args.port)
    port = server.sockets[0].getsockname()[1]
    print(f"ready {args.host}:{port}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    import contextlib

    import uvloop

    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(_main(sys.argv[1:]))
