"""Just enough of a pcap reader to get the BookKeeper conversations out of the captures.

Classic libpcap files (little-endian magic ``d4 c3 b2 a1``), Ethernet link type, IPv4, TCP. Each
direction of each TCP connection is reassembled by sequence number (retransmissions dropped) and
cut into BookKeeper frames (``[uint32 length][payload]``).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

_SHARED = os.environ.get("OFFLOADD_SHARED")
CAPTURES = (Path(_SHARED) if _SHARED else Path(__file__).resolve().parents[3] / "shared") \
    / "conformance" / "bookkeeper"
BOOKIE_PORT = 3181


@dataclass(frozen=True)
class Flow:
    src_port: int
    dst_port: int
    data: bytes

    @property
    def to_bookie(self) -> bool:
        return self.dst_port == BOOKIE_PORT

    def frames(self) -> list[bytes]:
        """Payloads without the length prefix; asserts the stream is whole frames."""
        out = []
        pos = 0
        while pos < len(self.data):
            (n,) = struct.unpack_from(">I", self.data, pos)
            out.append(self.data[pos + 4:pos + 4 + n])
            pos += 4 + n
        assert pos == len(self.data), "capture ends inside a frame"
        return out


def flows(path: Path) -> list[Flow]:
    raw = path.read_bytes()
    magic, _, _, _, _, _, link = struct.unpack_from("<IHHiIII", raw)
    assert magic == 0xA1B2C3D4, "only little-endian microsecond pcap files"
    assert link == 1, "only Ethernet captures"
    pos = 24
    segments: dict[tuple[int, int], list[tuple[int, int, bytes]]] = {}
    while pos < len(raw):
        _, _, incl, _ = struct.unpack_from("<IIII", raw, pos)
        pkt = raw[pos + 16:pos + 16 + incl]
        pos += 16 + incl
        ip = pkt[14:]
        if (ip[0] >> 4) != 4 or ip[9] != 6:  # IPv4 + TCP only
            continue
        ihl = (ip[0] & 0xF) * 4
        total = struct.unpack_from(">H", ip, 2)[0]
        tcp = ip[ihl:total]
        sport, dport, seq = struct.unpack_from(">HHI", tcp)
        flags = tcp[13]
        payload = tcp[(tcp[12] >> 4) * 4:]
        segments.setdefault((sport, dport), []).append((seq, flags, payload))
    out = []
    for (sport, dport), segs in segments.items():
        syn = [seq for seq, flags, _ in segs if flags & 0x02]
        data = {seq: p for seq, _, p in segs if p}
        nxt = syn[0] + 1 if syn else min(data, default=0)
        buf = bytearray()
        for seq in sorted(data):
            p = data[seq]
            if seq + len(p) <= nxt:
                continue  # retransmission
            assert seq <= nxt, "capture lost a segment"
            buf += p[nxt - seq:]
            nxt = seq + len(p)
        if buf:
            out.append(Flow(sport, dport, bytes(buf)))
    return out


def conversation(name: str) -> tuple[list[bytes], list[bytes]]:
    """(requests, responses) frames of the one connection in capture ``name``."""
    fl = flows(CAPTURES / name)
    requests = [f for f in fl if f.to_bookie]
    responses = [f for f in fl if not f.to_bookie]
    assert len(requests) == 1 and len(responses) == 1
    return requests[0].frames(), responses[0].frames()


def raw_streams(name: str) -> tuple[bytes, bytes]:
    fl = flows(CAPTURES / name)
    (req,) = [f for f in fl if f.to_bookie]
    (resp,) = [f for f in fl if not f.to_bookie]
    return req.data, resp.data
