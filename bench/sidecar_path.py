"""The whole sidecar path (bookies → BookKeeper source → offload → filesystem tier) in CPU-s/GiB,
beside the BookKeeper source's read alone, at 1 KiB entries.

Set-up: a real ZooKeeper (Debian's, as the tests start it) holds Pulsar's metadata for one topic
whose one closed ledger (CRC32C, ensemble 3, write quorum 2, ``--mib`` MiB of ``--size``-byte
entries) lives on three fake bookies in their own processes (``bench/bookie_server.py``, answers
encoded before they start, ``--latency-ms`` added). Then, alternating, ``--repeats`` times each,
in fresh processes:

- **source alone**: a read-only ``BookKeeperLedgerSource`` (as ``offloadd`` builds it from the
  configuration) reads the whole ledger with ``read()`` in block-sized runs into one recycled
  buffer, as the offloader calls it;
- **sidecar path**: ``offloadd run``'s runtime with ``[source] kind = "bookkeeper"`` and the
  filesystem driver offloads the topic until every entry is committed (segments of 128 MiB,
  16 MiB blocks, 4 blocks in flight, embedded metadata store).

- **raw tier write**: the same number of bytes written with ``os.pwritev`` in block-sized
  pieces into one new file beside the tier, then ``fsync`` — what the kernel charges the writer
  for putting the bytes into that file system, with no offloadd in it.

Each child reports its own user + system CPU seconds (``getrusage``) from when its work starts
(imports and opening the stores are not counted), pinned to one core while the bookies have
another (``--no-pin`` not to). The figure is the ratio of the medians (goal ≤ 1.5);
``cpu_ratio_less_raw_write`` takes the raw write's CPU out of the sidecar path's, to tell
offloadd's own cost from the file system's. The tier lives under ``--tier-root`` (default: the
run's temporary directory; ``/dev/shm`` to take the disk's file system out), each run's tier is
deleted once checked. ``--drop-written-pages`` is an experiment on the file system's side: every
``fsync`` in the children is followed by ``posix_fadvise(DONTNEED)`` on the file, so the page
cache reuses the written pages rather than growing (offloadd does not do this). One JSON
document; the load average before and after.

    .venv/bin/python bench/sidecar_path.py [--mib 256] [--size 1024] [--repeats 3]
        [--tier-root DIR] [--drop-written-pages]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bookkeeper_read import LEDGER, _start_bookies  # noqa: E402
from offloadd.ledger.bookkeeper.layout import (  # noqa: E402
    HIERARCHICAL_FACTORY,
    LedgerMetadata,
    LedgerStateBK,
    ledger_path,
)
from offloadd.metadata import managed_ledger  # noqa: E402
from offloadd.metadata.zookeeper import ZooKeeperMetadataStore  # noqa: E402
from offloadd.model import TopicName  # noqa: E402
from tests.fixtures.bookie_wire import encode_ledger_metadata  # noqa: E402
from tests.fixtures.zookeeper import ZooKeeperServer  # noqa: E402

GiB = 1024**3
MiB = 1024**2
TOPIC = "persistent://public/default/sidecar"

CONFIG = """
[metadata]
url = "embedded:./md"
[source]
kind = "bookkeeper"
pulsar_zk = "{zk}"
topics = ["{topic}"]
[blobstore]
driver = "filesystem"
path = "{tier}"
[offload]
max_size_per_segment_mbytes = 128
max_segment_rollover_time_minutes = 60
max_block_size_bytes = {block}
buffer_max_bytes = 268435456
blocks_in_flight = 4
[retention]
orphan_grace_s = 7200
[metrics]
enabled = false
[daemon]
log_level = "WARNING"
"""

SOURCE = """
import asyncio, json, os, resource, time
{pin}
from offloadd import config, wiring
from offloadd.model import TopicName

async def main():
    settings = config.load("bench.toml")
    md = await wiring.open_metadata(settings)
    src = wiring.open_source(settings, md, read_only=True)
    topic = TopicName.parse("{topic}")
    (led,) = await src.ledgers(topic)
    into = bytearray({block})
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    pos, got = 0, 0
    while pos <= led.last_entry_id:
        run = await src.read(topic, led.ledger_id, pos, led.last_entry_id, {block}, into=into)
        got += run.payload_bytes
        pos = run.last_entry_id + 1
    wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    assert got == led.size, (got, led.size)
    await src.close()
    await md.close()
    print(json.dumps({{"wall_s": wall, "bytes": got, "user_s": r1.ru_utime - r0.ru_utime,
                      "sys_s": r1.ru_stime - r0.ru_stime}}))

import uvloop
uvloop.run(main())
"""

SIDECAR = """
import asyncio, json, os, resource, time
{pin}
from offloadd.model import catalog
from offloadd import config
from offloadd.metadata import managed_ledger
from offloadd.shell.runtime import Runtime

async def main():
    settings = config.load("bench.toml")
    rt = await Runtime.open(settings)
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    task = asyncio.create_task(rt.daemon.run(install_signals=False))
    done = 0
    while done < {entries}:
        await asyncio.sleep(0.05)
        try:
            info, _ = await managed_ledger.load(rt.metadata, "{ml}")
        except Exception:
            continue  # the mirror is not there yet
        done = sum(s.entries for s in catalog.segments(info) if s.complete)
        for r in rt.daemon.topics.values():  # close the tail segment as soon as it is read
            if r.offloader.position is not None:
                r.offloader.trigger()
    wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    rt.daemon.request_stop()
    await task
    await rt.close()
    print(json.dumps({{"wall_s": wall, "user_s": r1.ru_utime - r0.ru_utime,
                      "sys_s": r1.ru_stime - r0.ru_stime}}))

import uvloop
uvloop.run(main())
"""


RAW_WRITE = """
import json, os, resource, time
{pin}
block = bytearray(os.urandom(1 << 20)) * ({block} >> 20)
view = memoryview(block)
fd = os.open("{path}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
offset = 0
while offset < {data}:
    n = os.pwritev(fd, [view[:min(len(view), {data} - offset)]], offset)
    offset += n
os.fsync(fd)
os.close(fd)
wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
os.unlink("{path}")
print(json.dumps({{"wall_s": wall, "user_s": r1.ru_utime - r0.ru_utime,
                  "sys_s": r1.ru_stime - r0.ru_stime}}))
"""


# An experiment, not offloadd's behaviour: every os.fsync in the children also tells the kernel
# the file's pages are not needed (the filesystem driver fsyncs each object once, complete), so
# the page cache recycles them instead of growing into fresh pages.
DROP_WRITTEN = """
import os as _os
_fsync = _os.fsync
def _fsync_and_drop(fd):
    _fsync(fd)
    try:
        _os.posix_fadvise(fd, 0, 0, _os.POSIX_FADV_DONTNEED)
    except OSError:  # a directory
        pass
_os.fsync = _fsync_and_drop
"""


def _fs_type(path: Path) -> str:
    p = subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True)
    return p.stdout.strip() or "unknown"


def _child(code: str, cwd: Path) -> dict[str, float]:
    wrap = os.environ.get("SIDECAR_BENCH_WRAP", "").split()  # e.g. "strace -c -f" to look in
    p = subprocess.run([*wrap, sys.executable, "-c", code], cwd=cwd, capture_output=True,
                       text=True,
                       timeout=1800, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if p.returncode != 0:
        raise SystemExit(f"child failed:\n{p.stderr[-4000:]}")
    if wrap:
        print(p.stderr[-6000:], file=sys.stderr)
    out: dict[str, float] = json.loads(p.stdout.strip().splitlines()[-1])
    return out


async def _pulsar(zk: str, addrs: list[str], entries: int, size: int) -> None:
    """Pulsar's metadata for the topic: the layout, the closed ledger, the managed ledger."""
    store = await ZooKeeperMetadataStore.open(f"zk://{zk}/pulsar")
    try:
        await store.create("/ledgers/LAYOUT", f"2\n{HIERARCHICAL_FACTORY}:1\n".encode())
        meta = LedgerMetadata(LEDGER, 3, 2, 2, LedgerStateBK.CLOSED, entries - 1,
                              entries * size, 3, b"", int(time.time() * 1000),
                              ((0, tuple(addrs)),))
        await store.create(ledger_path(LEDGER), encode_ledger_metadata(meta))
        topic = TopicName.parse(TOPIC)

        def edit(info: managed_ledger.ManagedLedgerInfo) -> bool:
            info.ledgerInfo.add(ledgerId=LEDGER, entries=entries, size=entries * size,
                                timestamp=int(time.time() * 1000))
            return True

        await managed_ledger.update(store, topic.managed_ledger, edit, create=True)
    finally:
        await store.close()


def _per_gib(runs: list[dict[str, float]], data: int) -> dict[str, Any]:
    cpu = [(r["user_s"] + r["sys_s"]) / (data / GiB) for r in runs]
    return {"cpu_s_per_gib": statistics.median(cpu),
            "user_s_per_gib": statistics.median(r["user_s"] / (data / GiB) for r in runs),
            "mib_s": statistics.median(data / MiB / r["wall_s"] for r in runs),
            "runs_cpu_s_per_gib": [round(c, 3) for c in cpu]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--block-mib", type=int, default=16)
    ap.add_argument("--latency-ms", type=float, default=0.2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-pin", action="store_true")
    ap.add_argument("--drop-written-pages", action="store_true",
                    help="experiment: posix_fadvise(DONTNEED) after every fsync in the children")
    ap.add_argument("--tier-root", type=Path, default=None,
                    help="where the tier directories go (default: the run's temporary dir)")
    args = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    pin = not args.no_pin and len(cpus) >= 2
    entries = args.mib * MiB // args.size
    data = entries * args.size
    block = args.block_mib * MiB
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="offloadd-sidecar-") as d:
        base = Path(d)
        tier_root = args.tier_root or base
        tier_root.mkdir(parents=True, exist_ok=True)
        zk = ZooKeeperServer(base / "zk")
        zk.start()
        bookies = _start_bookies(entries, args.size, args.latency_ms, cpus[1] if pin else None)
        try:
            zk.wait_serving()
            addrs = [a for _, a in bookies]
            asyncio.run(_pulsar(zk.address, addrs, entries, args.size))
            pin_code = f"os.sched_setaffinity(0, {{{cpus[0]}}})" if pin else ""
            pin_code += "\n" + os.environ.get("SIDECAR_BENCH_PRELUDE", "")
            if args.drop_written_pages:
                pin_code += DROP_WRITTEN
            ml = TopicName.parse(TOPIC).managed_ledger
            runs: dict[str, list[dict[str, float]]] = {"source": [], "sidecar": [], "raw": []}
            for k in range(args.repeats):
                for kind in ("source", "sidecar", "raw"):
                    cwd = base / f"{kind}-{k}"
                    cwd.mkdir()
                    tier_dir = tier_root / f"offloadd-sidecar-tier-{os.getpid()}-{k}"
                    (cwd / "bench.toml").write_text(CONFIG.format(
                        zk=f"zk://{zk.address}/pulsar", topic=TOPIC, block=block,
                        tier=tier_dir))
                    code = {"source": SOURCE, "sidecar": SIDECAR, "raw": RAW_WRITE}[kind].format(
                        pin=pin_code, topic=TOPIC, block=block, entries=entries, ml=ml,
                        data=data, path=tier_root / f"offloadd-sidecar-raw-{os.getpid()}-{k}")
                    runs[kind].append(_child(code, cwd))
                    if kind == "sidecar":
                        tier = sum(f.stat().st_size for f in tier_dir.rglob("*") if f.is_file())
                        shutil.rmtree(tier_dir)
                        assert tier >= data, (tier, data)
            fs_type = _fs_type(tier_root)
        finally:
            for proc, _ in bookies:
                proc.kill()
                proc.wait()
            zk.stop()
    source, sidecar = _per_gib(runs["source"], data), _per_gib(runs["sidecar"], data)
    raw = _per_gib(runs["raw"], data)
    own = sidecar["cpu_s_per_gib"] - raw["cpu_s_per_gib"]  # the file system's cost taken out
    print(json.dumps({"benchmark": "sidecar_path", "mib": args.mib, "entry_bytes": args.size,
                      "latency_ms": args.latency_ms, "repeats": args.repeats, "pinned": pin,
                      "source_alone": source, "sidecar_path": sidecar,
                      "tier_fs": fs_type, "drop_written_pages": args.drop_written_pages,
                      "raw_tier_write": raw,
                      "cpu_ratio": sidecar["cpu_s_per_gib"] / source["cpu_s_per_gib"],
                      "cpu_ratio_less_raw_write": own / source["cpu_s_per_gib"],
                      "loadavg_before": load0, "loadavg_after": os.getloadavg()}, indent=2))


if __name__ == "__main__":
    main()
