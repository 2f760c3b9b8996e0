"""The sidecar daemon over many small Pulsar-style topics (issue 22, "Sidecar at scale").

Set-up: a real ZooKeeper (Debian's, as the tests start it) and, in a child process, three fake
bookies and a fake broker (``tests/bookkeeper/cluster.py``) that writes ``--topics`` topics of
one or two closed ledgers of three 100-byte entries each, spread over 10 namespaces. Then, in
this process, ``offloadd run``'s runtime with ``[source] kind = "bookkeeper"``, its catalog in
the same ZooKeeper (its own chroot), the filesystem driver, and one daemon owning every topic:

- ``startup_s``: from opening the runtime to every topic's last entry committed
  (``all_running_s``: to every topic's task started by discovery);
- ``zk_reads_per_topic_per_min``: ZooKeeper reads (get, children, exists; watch re-reads
  included) of both sessions, Pulsar's and offloadd's catalog, over ``--steady-s`` seconds once
  everything is offloaded and nothing new arrives, per topic per minute (by kind in ``zk_ops``);
- ``idle_cpu``: the daemon process's user + system CPU over the same window, in cores, and
  ``ledgers_calls_per_topic_per_min``: the source's ``ledgers()`` calls meanwhile (topic
  tasks and the lag loop: polling, if any);
- ``connections_per_bookie``: the BookKeeper client's connections to each bookie, and
  ``tcp_per_bookie``: the process's established TCP connections to each bookie's port as the
  kernel lists them (``/proc/self/net/tcp``: whatever opened them);
- ``long_polls_per_s``: the LAC long polls sent to the bookies meanwhile (``--open-ledger``
  gives each topic an empty open ledger after its closed ones, as a broker's topic always
  has: idle topics wait on it);
- ``stop_s``: from the stop request to the daemon's end, and ``close_s`` for closing the
  runtime (the source's watches and sessions) after it.

- ``stop_phases_s``: from the stop request to each of the stop's phase lines in the daemon's
  log (``stop: ...``: the topic tasks ended, the status records written, ownership given back);
- ``gc``: the cyclic garbage collector's wall time (``gc.callbacks``) and collections, per phase
  (``startup``, ``steady``, ``stop``; ``full_s``: the oldest generation's), and
  ``malloc_trim_s``: the daemon's quiet-time ``malloc_trim`` calls (``shell/memtrim.py``).

``--tier-dir /dev/shm`` puts the filesystem tier on tmpfs (its fsyncs out of the figures).
``--dump-after-s N`` writes every thread's Python stack N seconds after the runtime opens to
``--dump-file`` (faulthandler: where a slow start-up is at that moment).

``--profile FILE`` writes a cProfile of the daemon's process (start-up and steady state).
One JSON document on stdout.

    .venv/bin/python bench/sidecar_scale.py [--topics 5000] [--steady-s 60] [--settle-s 5]
        [--open-ledger] [--tier-dir DIR] [--profile FILE] [--dump-after-s N --dump-file F]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import dataclasses
import faulthandler
import gc
import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from offloadd import config  # noqa: E402
from offloadd.commit.ownership import Ownership  # noqa: E402
from offloadd.metadata.zookeeper import ZooKeeperMetadataStore  # noqa: E402
from offloadd.model import Position, TopicName  # noqa: E402
from offloadd.shell import daemon as daemon_mod  # noqa: E402
from offloadd.shell.runtime import Runtime  # noqa: E402
from tests.bookkeeper.cluster import FakePulsar  # noqa: E402
from tests.bookkeeper.scale import (  # noqa: E402
    SCALE_CONFIG,
    ZkOps,
    count_ledgers_calls,
    populate,
    topic_names,
)
from tests.fixtures.fake_bookie import FakeBookie  # noqa: E402
from tests.fixtures.zookeeper import ZooKeeperServer  # noqa: E402

CONFIG = SCALE_CONFIG + """[daemon]
log_level = "WARNING"
pid_file = "{tmp}/offloadd.pid"
"""


async def serve_cluster(pulsar_url: str, topics: int, open_ledger: bool) -> None:
    """The child: bookies and the broker's writes; serves until stdin closes."""
    writer = await ZooKeeperMetadataStore.open(pulsar_url, session_timeout_s=10.0,
                                               connect_timeout_s=20.0)
    bookies = [await FakeBookie().start() for _ in range(3)]
    pulsar = FakePulsar(writer, bookies)
    await pulsar.setup()
    t0 = time.perf_counter()
    ends = await populate(pulsar, topic_names(topics), open_ledger=open_ledger)
    await pulsar.close()  # the writer's connections to the bookies
    print(json.dumps({"bookies": [b.address for b in bookies],
                      "populate_s": round(time.perf_counter() - t0, 1),
                      "ends": {str(t): [p.ledger_id, p.entry_id] for t, p in ends.items()}}),
          flush=True)
    await asyncio.to_thread(sys.stdin.read)
    for b in bookies:
        await b.kill()
    await writer.close()


def tcp_connections(ports: set[int]) -> dict[int, int]:
    """This process's established TCP connections to each of ``ports`` (any local address),
    from the kernel's table, matched to the process's own sockets by inode."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    out: dict[int, int] = {}
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            port = int(f[2].rsplit(":", 1)[1], 16)
            if f[3] == "01" and port in ports and f[9] in inodes:  # 01: ESTABLISHED
                out[port] = out.get(port, 0) + 1
    return out


class GcClock:
    """The collector's wall time and collections (all, and of the oldest generation) since the
    last :meth:`take`, from ``gc.callbacks``."""

    def __init__(self) -> None:
        self._t0 = 0.0
        self.reset()
        gc.callbacks.append(self._cb)

    def reset(self) -> None:
        self.s = self.full_s = 0.0
        self.n = self.full_n = 0

    def _cb(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        d = time.perf_counter() - self._t0
        self.s += d
        self.n += 1
        if info["generation"] == 2:
            self.full_s += d
            self.full_n += 1

    def take(self) -> dict[str, float]:
        out = {"s": round(self.s, 2), "collections": self.n, "full_s": round(self.full_s, 2),
               "full_collections": self.full_n}
        self.reset()
        return out


class StopLines(logging.Handler):
    """The time of each ``stop: ...`` line the daemon logs, from :meth:`start`."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.t0: float | None = None
        self.lines: list[tuple[float, str]] = []

    def start(self) -> None:
        self.t0 = time.perf_counter()

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if self.t0 is not None and msg.startswith("stop"):
            self.lines.append((round(time.perf_counter() - self.t0, 2), msg))


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def run_daemon(args: argparse.Namespace, zk: str, ends: dict[TopicName, Position],
                     bookies: list[str], tmp: Path, out: dict[str, Any]) -> None:
    cfg = tmp / "offloadd.toml"
    tier = args.tier_root / "tier"
    cfg.write_text(CONFIG.format(offloadd_url=f"zk://{zk}/offloadd", tier=tier,
                                 pulsar_url=f"zk://{zk}/pulsar", tmp=tmp))
    ops = ZkOps()
    gcc = GcClock()
    stops = StopLines()
    for name in ("offloadd.shell.daemon", "offloadd.offload.scheduler"):
        lg = logging.getLogger(name)
        lg.addHandler(stops)
        lg.setLevel(logging.INFO)  # the phase lines only; the root's WARNING level stays
        lg.propagate = False
    trims: list[float] = []
    real_trim = getattr(daemon_mod, "malloc_trim")  # noqa: B009 (imported by name there)

    def timed_trim() -> bool:
        c = time.perf_counter()
        try:
            return bool(real_trim())
        finally:
            trims.append(time.perf_counter() - c)

    setattr(daemon_mod, "malloc_trim", timed_trim)  # noqa: B010
    if args.dump_after_s is not None:
        faulthandler.dump_traceback_later(args.dump_after_s, file=args.dump)
    t0 = time.perf_counter()
    rt = await Runtime.open(config.load(cfg), ownership=Ownership())
    src = await ops.attach_runtime(rt)
    if args.long_poll_s is not None:  # the former bound, to compare in one session
        src.options = dataclasses.replace(src.options, long_poll_max_s=args.long_poll_s)
    out["long_poll_max_s"] = src.options.long_poll_max_s
    daemon = asyncio.ensure_future(rt.daemon.run(install_signals=False))
    try:
        while True:
            await asyncio.sleep(0.5)
            done = sum(1 for t, r in rt.daemon.topics.items()
                       if r.offloader.last_committed == ends.get(t))
            if "all_running_s" not in out and len(rt.daemon.topics) == len(ends):
                out["all_running_s"] = round(time.perf_counter() - t0, 1)  # discovery's part
            if done == len(ends):
                break
            now = time.perf_counter() - t0
            if int(now) % 10 == 0:
                print(f"{now:.0f}s: {done} of {len(ends)} offloaded", file=sys.stderr, flush=True)
            if time.perf_counter() - t0 > args.startup_limit_s:
                out["offloaded_at_limit"] = done
                break
        out["startup_s"] = round(time.perf_counter() - t0, 1)
        out["startup_zk_ops"] = ops.snapshot()
        out["startup_cpu_s"] = round(cpu_s(), 1)
        out["gc"] = {"startup": gcc.take()}
        await asyncio.sleep(args.settle_s)  # the last segments' status writes, the lag loop
        asked = count_ledgers_calls(src)
        ops.reset()
        polls0 = src.metrics.long_polls
        c0, w0 = cpu_s(), time.perf_counter()
        await asyncio.sleep(args.steady_s)
        wall = time.perf_counter() - w0
        out["idle_cpu"] = round((cpu_s() - c0) / wall, 4)
        out["gc"]["steady"] = gcc.take()
        out["long_polls_per_s"] = round((src.metrics.long_polls - polls0) / wall, 2)
        out["ledgers_calls_per_topic_per_min"] = round(asked[0] / len(ends) / (wall / 60), 3)
        out["zk_ops"] = ops.snapshot()
        out["zk_ops_by_tree"] = dict(sorted(ops.by_tree.items()))
        out["pulsar_zk_reads_per_topic_per_min"] = round(
            ops.reads_of("pulsar") / len(ends) / (wall / 60), 3)
        out["zk_reads_per_topic_per_min"] = round(ops.reads / len(ends) / (wall / 60), 3)
        per: dict[str, int] = {}
        for addr, _version in src.client._conns:
            per[addr] = per.get(addr, 0) + 1
        out["connections_per_bookie"] = per
        ports = {int(b.rsplit(":", 1)[1]): b for b in bookies}
        out["tcp_per_bookie"] = {ports[p]: n for p, n in tcp_connections(set(ports)).items()}
    finally:
        gcc.take()
        s0 = time.perf_counter()
        stops.start()
        rt.daemon.request_stop()
        await daemon
        out["stop_s"] = round(time.perf_counter() - s0, 2)
        out["stop_phases_s"] = stops.lines
        out.setdefault("gc", {})["stop"] = gcc.take()
        out["malloc_trim_s"] = [round(t, 3) for t in trims]
        c0 = time.perf_counter()
        await rt.close()
        out["close_s"] = round(time.perf_counter() - c0, 2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--topics", type=int, default=5000)
    ap.add_argument("--steady-s", type=float, default=60.0)
    ap.add_argument("--settle-s", type=float, default=5.0)
    ap.add_argument("--startup-limit-s", type=float, default=600.0)
    ap.add_argument("--profile", type=Path)
    ap.add_argument("--open-ledger", action="store_true",
                    help="each topic ends with an empty open ledger, as a broker's topics do: "
                         "idle topics wait on it (long polls)")
    ap.add_argument("--long-poll-s", type=float,
                    help="bound each long poll to this many seconds (the source's default "
                         "otherwise; 10 before issue 22's third pass)")
    ap.add_argument("--tier-dir", type=Path,
                    help="put the filesystem tier under this directory (default: the run's "
                         "temporary directory, on the disk): e.g. /dev/shm to take the disk's "
                         "fsyncs out of the measurement")
    ap.add_argument("--dump-after-s", type=float,
                    help="dump every thread's stack this long after the runtime opens")
    ap.add_argument("--dump-file", type=Path, default=Path("sidecar_scale-stacks.txt"))
    ap.add_argument("--serve-cluster", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_cluster:
        import uvloop

        uvloop.run(serve_cluster(args.serve_cluster, args.topics, args.open_ledger))
        return
    with tempfile.TemporaryDirectory(prefix="sidecar-scale-") as d, \
            tempfile.TemporaryDirectory(prefix="sidecar-scale-tier-", dir=args.tier_dir) as t:
        tmp = Path(d)
        args.tier_root = Path(t) if args.tier_dir else tmp
        server = ZooKeeperServer(tmp / "zk")
        server.start()
        server.wait_serving()
        child = subprocess.Popen([sys.executable, __file__, "--topics", str(args.topics),
                                  "--serve-cluster", f"zk://{server.address}/pulsar",
                                  *(["--open-ledger"] if args.open_ledger else [])],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout is not None
            ready = json.loads(child.stdout.readline())
            ends = {TopicName.parse(t): Position(*p) for t, p in ready["ends"].items()}
            out: dict[str, Any] = {"topics": args.topics, "populate_s": ready["populate_s"],
                                   "tier": str(args.tier_dir or "disk (the run's directory)"),
                                   "open_ledger": args.open_ledger,
                                   "entries": 3 * sum(1 + i % 2 for i in range(args.topics))}
            # (faulthandler writes to it from its own thread, until the process ends)
            args.dump = open(args.dump_file, "w") if args.dump_after_s else None  # noqa: SIM115
            prof = cProfile.Profile() if args.profile else None
            if prof is not None:
                prof.enable()
            import uvloop

            uvloop.run(run_daemon(args, server.address, ends, ready["bookies"], tmp, out))
            if prof is not None:
                prof.disable()
                prof.dump_stats(args.profile)
            out["load_avg"] = os.getloadavg()
            print(json.dumps(out, indent=1))
        finally:
            if child.stdin is not None:
                child.stdin.close()
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
            server.stop()


if __name__ == "__main__":
    main()
