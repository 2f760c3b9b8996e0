"""The standalone scenario on ZooKeeper, and what it leaves in ZooKeeper read back independently
of the code that wrote it: once with a module freshly generated from ``proto/`` (in a separate
interpreter that never imports offloadd), once by parsing the protobuf wire format by hand against
the field numbers of Pulsar's MLDataFormats.proto."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
OFFLOADD = [sys.executable, "-m", "offloadd"]
DOMAIN = "public/default/persistent"

VARINT, I64, LEN, I32 = 0, 1, 2, 5
# MLDataFormats.proto, message by message: field number -> (wire type, nested message or None)
SCHEMA: dict[str, dict[int, tuple[int, str | None]]] = {
    "ManagedLedgerInfo": {1: (LEN, "LedgerInfo"), 2: (LEN, "NestedPositionInfo"),
                          3: (LEN, "KeyValue")},
    "LedgerInfo": {1: (VARINT, None), 2: (VARINT, None), 3: (VARINT, None), 4: (VARINT, None),
                   5: (LEN, "OffloadContext")},
    "OffloadContext": {1: (VARINT, None), 2: (VARINT, None), 3: (VARINT, None),
                       4: (VARINT, None), 5: (VARINT, None), 6: (LEN, "OffloadDriverMetadata"),
                       7: (LEN, "OffloadSegment")},
    "OffloadSegment": {1: (VARINT, None), 2: (VARINT, None), 3: (VARINT, None),
                       4: (VARINT, None), 5: (VARINT, None), 6: (VARINT, None),
                       7: (LEN, "OffloadDriverMetadata")},
    "OffloadDriverMetadata": {1: (LEN, None), 2: (LEN, "KeyValue")},
    "KeyValue": {1: (LEN, None), 2: (LEN, None)},
    "NestedPositionInfo": {1: (VARINT, None), 2: (VARINT, None)},
}


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


def parse(buf: bytes, message: str) -> dict[int, list[Any]]:
    """One message: field number -> values (ints, or nested dicts), checked against SCHEMA."""
    out: dict[int, list[Any]] = {}
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wire = key >> 3, key & 7
        assert num in SCHEMA[message], f"{message} has no field {num} in MLDataFormats.proto"
        want, nested = SCHEMA[message][num]
        assert wire == want, f"{message}.{num}: wire type {wire}, MLDataFormats.proto says {want}"
        value: Any
        if wire == VARINT:
            value, i = _varint(buf, i)
            value = value - (1 << 64) if value >= 1 << 63 else value  # int64 two's complement
        else:
            n, i = _varint(buf, i)
            raw = buf[i:i + n]
            i += n
            value = parse(raw, nested) if nested else raw.decode()
        out.setdefault(num, []).append(value)
    assert i == len(buf)
    return out


def by_hand(buf: bytes) -> list[list[Any]]:
    """[ledgerId, entries, size, [[msb, lsb, complete, assigned, offloaded, end, driver]...]]"""
    out = []
    for li in parse(buf, "ManagedLedgerInfo").get(1, []):
        ctx = li.get(5, [{}])[0]
        segs = [[s[1][0], s[2][0], bool(s[3][0]), s[4][0], s[5][0], s[6][0], s[7][0][1][0]]
                for s in ctx.get(7, [])]
        out.append([li[1][0], li[2][0], li[3][0], segs])
    return out


FRESH = """
import json, sys
sys.path.insert(0, sys.argv[1])
import mldataformats_pb2 as pb
out = {}
for name, path in json.load(open(sys.argv[2])).items():
    info = pb.ManagedLedgerInfo()
    info.ParseFromString(open(path, "rb").read())
    out[name] = [[li.ledgerId, li.entries, li.size,
                  [[s.uidMsb, s.uidLsb, s.complete, s.assignedTimestamp, s.offloadedTimestamp,
                    s.endEntryId, s.driverMetadata.name]
                   for s in li.offloadContext.offloadSegment]]
                 for li in info.ledgerInfo]
print(json.dumps(out))
"""


@pytest.mark.timeout(150)
def test_standalone_on_zookeeper_verifies_and_writes_the_design_format(
        tmp_path: Path, zk_server: str) -> None:
    chroot = f"/standalone-{uuid.uuid4().hex[:10]}"
    cfg = tmp_path / "zk.toml"
    cfg.write_text(f"""
[metadata]
url = "zk://{zk_server}{chroot}"
session_timeout_s = 4
[offload]
max_size_per_segment_mbytes = 1
max_segment_rollover_time_minutes = 0.05
max_block_size_bytes = 262144
[source]
rollover_bytes = 400000
rollover_minutes = 0.25
[metrics]
enabled = false
""")
    out = subprocess.run([*OFFLOADD, "standalone", "--json", "--config", str(cfg), "--duration",
                          "8",
                          "--rate", "1500000", "--topics", "3"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr[-3000:]
    ver = subprocess.run([*OFFLOADD, "verify", "--config", str(cfg), "--json",
                          "--orphan-grace", "0"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    rep = json.loads(ver.stdout)
    assert ver.returncode == 0 and rep["ok"], rep
    assert len(rep["topics"]) == 3 and rep["orphans"] == []
    for t in rep["topics"]:
        assert t["segments"] >= 2 and t["source_checked"] == t["entries"] > 0

    # What ZooKeeper holds, by hand ...
    zk = KazooClient(hosts=zk_server, timeout=10)
    zk.start(timeout=15)
    try:
        raw = {t: bytes(zk.get(f"{chroot}/managed-ledgers/{DOMAIN}/{t}")[0])
               for t in zk.get_children(f"{chroot}/managed-ledgers/{DOMAIN}")}
    finally:
        zk.stop()
        zk.close()
    assert len(raw) == 3
    hand = {t: by_hand(b) for t, b in raw.items()}

    # ... and with a module generated from proto/ just now, in an interpreter without offloadd
    gen = tmp_path / "gen"
    subprocess.run([str(ROOT / "scripts" / "gen-proto"), str(gen)], check=True,
                   capture_output=True, timeout=100)
    dump = {}
    for t, b in raw.items():
        (tmp_path / f"{t}.pb").write_bytes(b)
        dump[t] = str(tmp_path / f"{t}.pb")
    (tmp_path / "dump.json").write_text(json.dumps(dump))
    fresh = subprocess.run([sys.executable, "-c", FRESH, str(gen), str(tmp_path / "dump.json")],
                           cwd=gen, capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(fresh.stdout) == hand

    tier = tmp_path / "data" / "tier"
    spanning = 0
    for ledgers in hand.values():
        where: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
        for lid, entries, size, segs in ledgers:
            assert entries > 0 and size > 0
            for msb, lsb, complete, assigned, offloaded, end, driver in segs:
                assert complete and 0 < assigned <= offloaded and driver == "filesystem"
                where.setdefault((msb, lsb), []).append((lid, entries, end))
        for (msb, lsb), recs in where.items():
            uid = uuid.UUID(int=((msb & (2**64 - 1)) << 64) | (lsb & (2**64 - 1)))
            assert (tier / str(uid)).is_file() and (tier / f"{uid}-index").is_file()
            # one record per ledger the segment touches; all but the last end at the
            # ledger's last entry
            for lid, entries, end in recs[:-1]:
                assert end == entries - 1, (uid, lid)
            spanning += len(recs) > 1
    assert spanning > 0  # the scenario makes segments that cross ledgers
