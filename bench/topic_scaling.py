"""What a topic costs the daemon when it has no traffic: 10 to 10,000 topics on one daemon.

For each topic count N (``--topics``, default 10,100,1000,10000), on the embedded store with the
filesystem tier (and with ``--zk-topics N``, also on a real ZooKeeper with an S3 server, moto,
both on loopback):

1. history: ``--bytes-per-topic`` (20 KB) on every topic, ``--entry-size`` (1 KiB) entries, by
   the embedded writer (the code behind ``offloadd produce``; run here in a child process with
   one batch per topic: ``offloadd produce --topics N`` round-robins batches of 256 KiB, or of
   50 ms of ``--rate``, so it cannot give every one of 10,000 topics 20 KB in reasonable time);
2. ``offloadd run`` on a config in a temporary directory (segments roll after 10 minutes, the
   default: nothing commits by itself while measured); wait until every topic has read all of
   its history (each topic's ``position`` in the daemon's ``/status``);
3. **idle with open segments** (what issue 22's table measured): CPU % of one core over
   ``--idle-seconds`` (``utime + stime`` from ``/proc/PID/stat``), RSS (``VmRSS``), one
   ``/metrics`` scrape (bytes, series);
4. **commits**: ``offloadd offload-now --wait --json`` closes and commits the N open segments:
   commits counted from its answer, over the slowest topic's time in that answer (the daemon's
   side, ``commits_per_s_daemon``) and over the command's wall time (its start-up included);
5. **idle with everything committed**: CPU %, RSS, scrape again (every topic now has had a
   commit, so its per-topic series exist), and ``offloadd status`` wall time (text and
   ``--json``), and apart from it the command's start-up (interpreter and imports,
   ``status_startup``); the commands run with compiled bytecode kept (``--bytecode-cache``,
   the default), as an installed package has it;
6. **commits again**: a few more entries on every topic (the writer beside the running
   daemon), wait until read, ``offload-now --wait`` again;
7. **stop**: a few more entries on every topic, wait until read (N open segments), SIGTERM, and
   the time until the process exits (killed after ``--stop-timeout``);
8. **metric modes**: for each of ``--metric-modes`` (``[metrics] topic_level``, default
   ``true,false``), the config with that key is checked first (``offloadd config check``); a
   daemon that refuses the key is recorded as ``skipped`` with its error, otherwise the daemon is
   started again in that mode, catches up, commits one segment per topic (offload-now), and its
   scrape is measured.

``--block-bytes`` sets ``[offload] max_block_size_bytes``: before issue 22 every open segment
held a zero-filled array of a whole block (64 MiB by default), so the default runs out of memory
long before 1,000 topics.

Runs are bounded: each waits at most ``--run-timeout`` seconds for the daemon, and a daemon
whose RSS passes ``--max-rss-mib`` is killed; the run is then recorded as ``aborted``, with why,
its peak RSS and ``read_progress`` (topics read up to their end, every ~30 s). All servers listen on
127.0.0.1; every process started here is stopped on exit. Prints one JSON document (also written
to ``--out``).

``--only commits,stop`` runs only those steps (of idle, commits, status, stop, metric-modes):
the commit rate (with the window after the first commits) and the stop, without the idle
windows, scrapes and restarts. ``--profile DIR`` runs the daemon under ``bench/profiled.py``
and profiles its event loop's thread in each commits step, the window after it and the stop
(``DIR/<run>/<step>.prof`` and ``.samples.txt``); ``commit_*`` give the loop thread's CPU
(``daemon_loop_cpu_s``) beside the process's: the rest is worker threads (file writes and
fsyncs, SQLite).

    .venv/bin/python bench/topic_scaling.py [--topics 10,100,1000] [--zk-topics 1000] [--quick]
        [--only commits,stop] [--profile DIR] [--out bench/results/topic_scaling.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.procstat import cpu_ticks, main_thread_ticks, rss_bytes  # noqa: E402

MiB = 1024 * 1024
PY = [sys.executable, "-m", "offloadd"]
TICK = os.sysconf("SC_CLK_TCK")
TOPIC_PREFIX = "persistent://public/default/topic-"
# The environment of every offloadd child (see --bytecode-cache): None = this process's
CHILD_ENV: dict[str, str] | None = None
# what --only may name: the idle windows and scrapes, the two offload-now rounds (and the
# window after the first), status, the stop with every segment open, the metric modes
STEPS = ("idle", "commits", "status", "stop", "metric-modes")
# --profile: where the daemons' profiles go (None: not profiled)
PROFILE: Path | None = None


# ---- the writer, in a child process --------------------------------------------------------

WRITER_TOPICS = 2000

async def _write(config_path: str, topics: int, entries: int, entry_size: int) -> dict[str, str]:
    """``entries`` Pulsar-format entries on each of ``topics`` topics, one batch per topic;
    returns each topic's next position ("ledger:entry", the daemon's ``position`` once it has
    read everything)."""
    sys.path.insert(0, str(ROOT))
    from offloadd import config, wiring
    from offloadd.ledger.local import LocalLedgerWriter, StoreLock
    from offloadd.shell.produce import PulsarEntries, topic_names

    settings = config.load(config_path)
    lock = StoreLock.acquire(settings.source.path, StoreLock.WRITER, holder="topic_scaling")
    try:
        md = await wiring.open_metadata(settings)
        try:
            source = PulsarEntries(entry_size)
            ends: dict[str, str] = {}
            names = topic_names(topics)
            # the writer holds 5 descriptors per open ledger: a writer per WRITER_TOPICS topics
            # keeps 10,000 topics under the usual 20,000-descriptor hard limit
            for start in range(0, len(names), WRITER_TOPICS):
                writer = LocalLedgerWriter(settings.source.path, md,
                                           wiring.rollover_policy(settings),
                                           max_entry_bytes=settings.source.max_entry_bytes)
                try:
                    for t in names[start:start + WRITER_TOPICS]:
                        batch, _ = source.take(t, entries)
                        last = await writer.append(t, batch)  # type: ignore[arg-type]
                        ends[str(t)] = f"{last.ledger_id}:{last.entry_id + 1}"
                finally:
                    await writer.close()
            return ends
        finally:
            await md.close()
    finally:
        lock.release()


def write(config_path: Path, topics: int, entries: int, entry_size: int,
          timeout: float) -> tuple[dict[str, str], float]:
    """Run :func:`_write` in a child process: (next position per topic, seconds)."""
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, __file__, "write", "--config", str(config_path),
                        "--topics", str(topics), "--entries", str(entries),
                        "--entry-size", str(entry_size)],
                       cwd=config_path.parent, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"writing history failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout), time.monotonic() - t0


# ---- processes and /proc -------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Aborted(Exception):
    """The daemon went past a bound (RSS, time) or died: the run stops here."""


@dataclass
class Daemon:
    """One ``offloadd run`` child; ``bound`` checks it on every poll."""

    config: Path
    port: int
    max_rss: int
    proc: subprocess.Popen[bytes] | None = None
    peak_rss: int = 0
    log: Path | None = None
    # (seconds since start, topics read up to their end), every ~30 s of a wait: how start-up
    # goes when it does not finish
    progress: list[tuple[float, int]] = field(default_factory=list)
    started: float = 0.0
    profiling: str | None = None  # the profile running (--profile)
    profile_names: list[str] = field(default_factory=list)  # in the order they were started
    profile_dir: Path | None = None

    def name_profiles(self) -> None:
        """bench/profiled.py numbers its profiles: give them the names of their steps."""
        if self.profile_dir is None:
            return
        for i, name in enumerate(self.profile_names):
            for suffix in (".prof", ".samples.txt"):
                f = self.profile_dir / f"{i}{suffix}"
                if f.exists():
                    f.rename(self.profile_dir / f"{name}{suffix}")

    def start(self) -> None:
        self.log = self.config.with_suffix(f".{uuid.uuid4().hex[:6]}.log")
        self.started = time.monotonic()
        with self.log.open("wb") as out:
            run, env = PY, CHILD_ENV
            if PROFILE is not None:
                run = [sys.executable, str(ROOT / "bench" / "profiled.py")]
                self.profile_dir = PROFILE / self.config.parent.name
                self.profile_dir.mkdir(parents=True, exist_ok=True)
                env = {**(CHILD_ENV or os.environ),
                       "OFFLOADD_BENCH_PROFILE": str(self.profile_dir)}
            self.proc = subprocess.Popen([*run, "run", "--config", str(self.config)],
                                         cwd=self.config.parent, stdout=subprocess.DEVNULL,
                                         stderr=out, stdin=subprocess.DEVNULL, env=env)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def check(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[-2000:] if self.log else ""
            raise Aborted(f"offloadd run exited {self.proc.returncode}: {tail}")
        rss = rss_bytes(self.pid)
        self.peak_rss = max(self.peak_rss, rss)
        if rss > self.max_rss:
            self.kill()
            raise Aborted(f"RSS {rss / MiB:.0f} MiB over the --max-rss-mib bound "
                          f"{self.max_rss / MiB:.0f}: killed")

    def get(self, path: str, timeout: float = 60) -> bytes:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}",
                                    timeout=timeout) as r:
            body: bytes = r.read()
            return body

    def status(self) -> dict[str, Any] | None:
        try:
            doc: dict[str, Any] = json.loads(self.get("/status"))
            return doc
        except (OSError, ValueError):
            return None

    def wait_read(self, ends: dict[str, str], deadline: float) -> float:
        """Until every topic's position is its end in ``ends``; seconds waited."""
        t0 = noted = time.monotonic()
        while True:
            self.check()
            st = self.status()
            topics = (st or {}).get("topics") or {}
            behind = sum(1 for t, end in ends.items()
                         if (topics.get(t) or {}).get("position") != end)
            if st is not None and time.monotonic() - noted >= 30:
                noted = time.monotonic()
                self.progress.append((round(noted - self.started), len(ends) - behind))
            if st is not None and behind == 0:
                return time.monotonic() - t0
            if time.monotonic() > deadline:
                raise Aborted(f"{behind} of {len(ends)} topics not read up to their end "
                              "before the run's deadline")
            time.sleep(1.0)

    def idle(self, seconds: float) -> dict[str, Any]:
        """CPU % of one core and RSS over ``seconds`` of nothing asked of the daemon."""
        self.check()
        c0, t0 = cpu_ticks(self.pid), time.monotonic()
        end = t0 + seconds
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(left, 1.0))
            self.check()  # /proc only: the daemon is not asked anything
        c1, t1 = cpu_ticks(self.pid), time.monotonic()
        rss = rss_bytes(self.pid)
        return {"seconds": round(t1 - t0, 1),
                "cpu_pct_of_core": round(100 * (c1 - c0) / TICK / (t1 - t0), 2),
                "rss_mib": round(rss / MiB, 1)}

    def scrape(self) -> dict[str, Any]:
        t0 = time.monotonic()
        body = self.get("/metrics")
        took = time.monotonic() - t0
        lines = body.decode(errors="replace").splitlines()
        series = [ln for ln in lines if ln and not ln.startswith("#")]
        return {"bytes": len(body), "series": len(series),
                "families": sum(1 for ln in lines if ln.startswith("# TYPE")),
                "seconds": round(took, 3)}

    def offload_now(self, timeout: float) -> dict[str, Any]:
        """``offloadd offload-now --wait --json``: wall time, commits, commits/s."""
        t0, c0, m0 = time.monotonic(), cpu_ticks(self.pid), main_thread_ticks(self.pid)
        p = subprocess.run([*PY, "offload-now", "--config", str(self.config), "--wait",
                            "--json", "--timeout", str(int(timeout))], cwd=self.config.parent,
                           capture_output=True, text=True, timeout=timeout + 60, env=CHILD_ENV)
        wall = time.monotonic() - t0
        # the daemon's CPU time over the command: on a machine shared with other work the
        # rate follows the CPU the daemon was given; CPU per commit does not
        cpu_s = (cpu_ticks(self.pid) - c0) / TICK
        loop_s = (main_thread_ticks(self.pid) - m0) / TICK  # the event loop's thread alone
        self.check()
        try:
            answer = json.loads(p.stdout)
        except ValueError:
            raise Aborted(f"offload-now answered no JSON (exit {p.returncode}): "
                          f"{p.stderr[-1000:]}") from None
        results = answer.get("results", [])
        done = [r for r in results if r.get("result") == "committed"]
        slowest = max((float(r.get("seconds") or 0) for r in done), default=0.0)
        out: dict[str, Any] = {"exit": p.returncode, "topics": len(results), "commits": len(done),
                               "wall_s": round(wall, 2), "daemon_s": round(slowest, 2),
                               "commits_per_s": round(len(done) / wall, 1) if wall else None,
                               "commits_per_s_daemon": round(len(done) / slowest, 1)
                               if slowest else None,
                               "daemon_cpu_s": round(cpu_s, 2),
                               "daemon_cpu_ms_per_commit": round(1000 * cpu_s / len(done), 2)
                               if done else None,
                               "daemon_loop_cpu_s": round(loop_s, 2)}
        others = sorted({str(r.get("result")) for r in results} - {"committed"})
        if others:
            out["other_results"] = others
        return out

    def stop(self, timeout: float) -> dict[str, Any]:
        """SIGTERM; seconds until exit (SIGKILL after ``timeout``), and what the stop left
        unfinished by its rule (``stop_left``: the count in the daemon's "shutdown deadline"
        warning; None when every open segment was committed)."""
        assert self.proc is not None
        mark = self.log.stat().st_size if self.log is not None else 0
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
            out = {"seconds": round(time.monotonic() - t0, 2), "exit": code, "killed": False}
        except subprocess.TimeoutExpired:
            self.kill()
            out = {"seconds": round(time.monotonic() - t0, 2), "exit": None, "killed": True}
        out["stop_left"] = self._stop_left(mark)
        return out

    def _stop_left(self, mark: int) -> int | None:
        if self.log is None:
            return None
        with self.log.open("rb") as f:
            f.seek(mark)
            text = f.read().decode(errors="replace")
        for line in text.splitlines():
            if "shutdown deadline" not in line:
                continue
            # "... abandoning A close(s) under way, leaving L open segment(s) ..." (or before
            # the close budget: "... leaving (...) N in-flight segment(s)")
            nums = [int(n) for n in re.findall(r"(\d+) (?:close|open segment|in-flight)",
                                               line)]
            return sum(nums)
        return None

    def profile_toggle(self, name: str) -> None:
        """With ``--profile``: start the daemon's profile (``name``), or write the running one
        (bench/profiled.py)."""
        if PROFILE is None:
            return
        if self.profiling is None:
            self.profiling = name
            self.profile_names.append(name)
        else:
            self.profiling = None
        assert self.proc is not None
        self.proc.send_signal(signal.SIGUSR2)

    def profiled(self, name: str, step: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """``step()`` with the daemon profiled (``--profile``), written as ``<name>.prof``."""
        self.profile_toggle(name)
        try:
            return step()
        finally:
            self.profile_toggle(name)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


def timed(args: list[str], cwd: Path, timeout: float) -> dict[str, Any]:
    t0 = time.monotonic()
    p = subprocess.run([*PY, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                       env=CHILD_ENV)
    return {"seconds": round(time.monotonic() - t0, 2), "exit": p.returncode,
            "bytes": len(p.stdout)}


def startup(cwd: Path, timeout: float) -> dict[str, Any]:
    """What a one-shot command costs before it does anything: the interpreter and the imports
    of ``offloadd status`` (its parser, the configuration, the status module), apart from the
    command's own work."""
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", "import offloadd.shell.cli, offloadd.shell.commands, "
                        "offloadd.shell.status, offloadd.config; "
                        "offloadd.shell.cli.build_parser()"],
                       cwd=cwd, capture_output=True, text=True, timeout=timeout, env=CHILD_ENV)
    return {"seconds": round(time.monotonic() - t0, 2), "exit": p.returncode}


# ---- configurations ------------------------------------------------------------------------

@dataclass
class Store:
    """Where a run's metadata and tier live: the config sections that name them."""

    name: str
    sections: str
    notes: dict[str, Any] = field(default_factory=dict)


def config_text(work: Path, store: Store, port: int, topic_level: str | None,
                block_bytes: int | None) -> str:
    metrics = f'bind = "127.0.0.1:{port}"\n'
    offload = "" if block_bytes is None else f"[offload]\nmax_block_size_bytes = {block_bytes}\n"
    if topic_level is not None:
        metrics += f"topic_level = {topic_level}\n"
    return f"""{store.sections}
[source]
path = "{work / 'ledgers'}"
{offload}[metrics]
{metrics}
[daemon]
pid_file = "{work / 'offloadd.pid'}"
log_level = "WARNING"
"""


def embedded(work: Path) -> Store:
    return Store("embedded", f"""[metadata]
url = "embedded:{work / 'metadata'}"
[blobstore]
driver = "filesystem"
path = "{work / 'tier'}"
""")


@contextmanager
def zk_and_s3(stack_dir: Path) -> Iterator[Callable[[Path], Store]]:
    """A ZooKeeper and a moto server for the whole benchmark; each run gets a chroot and a
    bucket of its own."""
    sys.path.insert(0, str(ROOT))
    import boto3  # type: ignore[import-untyped]  # moto's dependency (dev extra)

    from tests.fixtures.s3 import running_moto
    from tests.fixtures.zookeeper import ZooKeeperServer

    server = ZooKeeperServer(stack_dir / "zk")
    server.start()
    try:
        server.wait_serving()
        with running_moto() as endpoint:
            s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=endpoint,
                              aws_access_key_id="testing", aws_secret_access_key="testing")

            def make(work: Path) -> Store:
                name = f"topic-scaling-{uuid.uuid4().hex[:8]}"
                s3.create_bucket(Bucket=name)
                return Store("zookeeper+s3", f"""[metadata]
url = "zk://{server.address}/{name}"
[blobstore]
driver = "aws-s3"
endpoint = "{endpoint}"
bucket = "{name}"
access_key_id = "testing"
secret_access_key = "testing"
""", {"zookeeper": "Debian's zookeeper 3.8, standalone, loopback",
      "s3": "moto_server, loopback"})

            yield make
    finally:
        server.stop()


def key_refused(config_path: Path) -> str | None:
    """``offloadd config check``'s complaint about the file, or None if it loads."""
    p = subprocess.run([*PY, "config", "check", "--config", str(config_path)],
                       cwd=config_path.parent, capture_output=True, text=True, timeout=60,
                       env=CHILD_ENV)
    return None if p.returncode == 0 else (p.stderr.strip().splitlines() or ["refused"])[-1]


# ---- one run -------------------------------------------------------------------------------

def one_run(store_factory: Callable[[Path], Store], topics: int, a: argparse.Namespace,
            base: Path) -> dict[str, Any]:
    work = base / f"run-{topics}-{uuid.uuid4().hex[:6]}"
    work.mkdir()
    store = store_factory(work)
    port = free_port()
    cfg = work / "offloadd.toml"
    cfg.write_text(config_text(work, store, port, None, a.block_bytes))
    entries = max(1, a.bytes_per_topic // a.entry_size)
    out: dict[str, Any] = {"store": store.name, "topics": topics, **store.notes,
                           "max_block_size_bytes": a.block_bytes or "default",
                           "entries_per_topic": entries, "entry_size": a.entry_size}
    deadline = time.monotonic() + a.run_timeout
    daemon = Daemon(cfg, port, a.max_rss_mib * MiB)
    try:
        ends, took = write(cfg, topics, entries, a.entry_size, a.run_timeout)
        out["write_s"] = round(took, 1)
        daemon.start()
        out["catch_up_s"] = round(daemon.wait_read(ends, deadline), 1)
        out["catch_up_cpu_s"] = round(cpu_ticks(daemon.pid) / TICK, 1)
        time.sleep(a.settle)
        if "idle" in a.only:
            out["idle_open"] = daemon.idle(a.idle_seconds)
            out["idle_open"]["scrape"] = daemon.scrape()
        if "commits" in a.only:
            out["commit_history"] = daemon.profiled("commit_history",
                                                    lambda: daemon.offload_now(a.run_timeout))
            time.sleep(a.settle)
            # what follows the commits (status records, read-back checks) while nothing new
            # arrives, profiled when asked
            out["idle_committed"] = daemon.profiled("after_commits",
                                                    lambda: daemon.idle(a.idle_seconds))
        if "idle" in a.only and "idle_committed" in out:
            out["idle_committed"]["scrape"] = daemon.scrape()
        if "status" in a.only:
            out["status_startup"] = startup(work, a.run_timeout)
            out["status_text"] = timed(["status", "--config", str(cfg)], work, a.run_timeout)
            out["status_json"] = timed(["status", "--config", str(cfg), "--json"], work,
                                       a.run_timeout)
        daemon.check()
        if "commits" in a.only:
            ends, _ = write(cfg, topics, a.more_entries, a.entry_size, a.run_timeout)
            daemon.wait_read(ends, deadline)
            out["commit_open"] = daemon.profiled("commit_open",
                                                 lambda: daemon.offload_now(a.run_timeout))
        if "stop" in a.only:
            ends, _ = write(cfg, topics, a.more_entries, a.entry_size, a.run_timeout)
            daemon.wait_read(ends, deadline)
            out["stop_open_segments"] = topics
            daemon.profile_toggle("stop")  # written as the process exits
            out["stop"] = daemon.stop(a.stop_timeout)
        out["peak_rss_mib"] = round(daemon.peak_rss / MiB, 1)
        if "metric-modes" in a.only:
            out["metric_modes"] = [metric_mode(work, store, mode, ends, a, deadline)
                                   for mode in a.metric_modes]
    except (Aborted, RuntimeError, subprocess.TimeoutExpired) as exc:
        out["aborted"] = str(exc)[:2000]
        out["read_progress"] = daemon.progress
        out["peak_rss_mib"] = round(daemon.peak_rss / MiB, 1)
    except KeyboardInterrupt:  # SIGTERM/SIGINT (see main): keep what was measured so far
        out["aborted"] = "interrupted"
        out["interrupted"] = True
        out["read_progress"] = daemon.progress
    finally:
        daemon.kill()
        daemon.name_profiles()
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    return out


def metric_mode(work: Path, store: Store, mode: str, ends: dict[str, str],
                a: argparse.Namespace, deadline: float) -> dict[str, Any]:
    """The scrape with ``[metrics] topic_level = mode``, after one commit per topic."""
    port = free_port()
    cfg = work / f"offloadd-topic-level-{mode}.toml"
    cfg.write_text(config_text(work, store, port, mode, a.block_bytes))
    refused = key_refused(cfg)
    if refused is not None:
        return {"topic_level": mode,
                "skipped": "the daemon refuses the key: " + refused.replace(str(cfg), cfg.name)}
    daemon = Daemon(cfg, port, a.max_rss_mib * MiB)
    try:
        daemon.start()
        daemon.wait_read(ends, deadline)
        commit = daemon.offload_now(a.run_timeout)
        time.sleep(a.settle)
        return {"topic_level": mode, "after": "one commit per topic", "commit": commit,
                "scrape": daemon.scrape(), "rss_mib": round(rss_bytes(daemon.pid) / MiB, 1),
                "stop": daemon.stop(a.stop_timeout)}
    finally:
        daemon.kill()


def commit_id() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "write":
        wp = argparse.ArgumentParser(prog="topic_scaling.py write")
        wp.add_argument("--config", required=True)
        wp.add_argument("--topics", type=int, required=True)
        wp.add_argument("--entries", type=int, required=True)
        wp.add_argument("--entry-size", type=int, required=True)
        w = wp.parse_args(sys.argv[2:])
        print(json.dumps(asyncio.run(_write(w.config, w.topics, w.entries, w.entry_size))))
        return
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topics", default="10,100,1000,10000",
                    help="topic counts on the embedded store, comma-separated")
    ap.add_argument("--zk-topics", default="",
                    help="topic counts on ZooKeeper + S3 (moto), e.g. 1000 (default: none)")
    ap.add_argument("--quick", action="store_true",
                    help="10 and 100 topics, 10 s idle windows: a smoke run")
    ap.add_argument("--bytes-per-topic", type=int, default=20_000)
    ap.add_argument("--entry-size", type=int, default=1024)
    ap.add_argument("--block-bytes", type=int,
                    help="[offload] max_block_size_bytes (default: the daemon's, 64 MiB; before "
                    "issue 22 every open segment held a zero-filled array of that size)")
    ap.add_argument("--more-entries", type=int, default=2,
                    help="entries per topic to open a segment on every topic")
    ap.add_argument("--idle-seconds", type=float, default=30.0)
    ap.add_argument("--settle", type=float, default=3.0,
                    help="seconds between a step and the next measurement")
    ap.add_argument("--metric-modes", default="true,false",
                    help="[metrics] topic_level values to scrape in (empty: none)")
    ap.add_argument("--run-timeout", type=float, default=900.0,
                    help="seconds one topic count may take before it is aborted")
    ap.add_argument("--stop-timeout", type=float, default=90.0,
                    help="SIGTERM: seconds before the daemon is killed")
    ap.add_argument("--max-rss-mib", type=int,
                    default=min(8192, int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
                                          / MiB / 3)),
                    help="kill a daemon whose RSS passes this (default: a third of the "
                    "machine's memory, at most 8 GiB)")
    ap.add_argument("--bytecode-cache", action=argparse.BooleanOptionalAction, default=True,
                    help="run the offloadd commands with compiled bytecode kept (in a temporary "
                    "PYTHONPYCACHEPREFIX), as an installed package has it; without, a command "
                    "in an environment with PYTHONDONTWRITEBYTECODE=1 compiles every module it "
                    "imports on each start (~1 s of `status` here)")
    ap.add_argument("--only", default=",".join(STEPS),
                    help="the steps to run, comma-separated, of " + ", ".join(STEPS) +
                    " (default: all); e.g. commits,stop for the commit rate and the stop alone")
    ap.add_argument("--profile", type=Path,
                    help="run the daemon under cProfile (bench/profiled.py) and write a profile "
                    "of each commits step, of the window after it and of the stop under this "
                    "directory (<run>/<step>.prof)")
    ap.add_argument("--out", type=Path, help="also write the JSON document here")
    ap.add_argument("--keep", action="store_true", help="keep the work directories")
    a = ap.parse_args()
    if a.quick:
        a.topics, a.idle_seconds, a.settle = "10,100", min(a.idle_seconds, 10.0), 1.0
    a.metric_modes = [m for m in a.metric_modes.split(",") if m]
    a.only = [step for step in a.only.split(",") if step]
    if unknown := set(a.only) - set(STEPS):
        ap.error(f"--only: unknown step(s) {', '.join(sorted(unknown))}")
    global PROFILE
    PROFILE = a.profile.resolve() if a.profile else None
    counts = [int(n) for n in a.topics.split(",") if n]
    zk_counts = [int(n) for n in a.zk_topics.split(",") if n]

    doc: dict[str, Any] = {
        "benchmark": "topic_scaling",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": commit_id(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
                   f"{platform.python_version()}",
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
        "loadavg_before": list(os.getloadavg()),
        "runs": [],
    }
    base = Path(tempfile.mkdtemp(prefix="offloadd-topic-scaling-"))
    global CHILD_ENV
    if a.bytecode_cache:
        CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        CHILD_ENV["PYTHONPYCACHEPREFIX"] = str(base / "pycache")
    doc["bytecode"] = ("cached (PYTHONPYCACHEPREFIX in the run's temporary directory)"
                       if a.bytecode_cache else
                       "as the environment has it (PYTHONDONTWRITEBYTECODE="
                       f"{os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r})")
    # SIGTERM/SIGINT unwind through the finally blocks, which stop every child started here
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, f: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        with ExitStack() as stack:
            plan: list[tuple[Callable[[Path], Store] | None, int]] = \
                [(embedded, n) for n in counts] + [(None, n) for n in zk_counts]
            make: Callable[[Path], Store] | None = None
            for factory, n in plan:
                if factory is None and make is None:
                    make = stack.enter_context(zk_and_s3(base))
                doc["runs"].append(one_run(factory or make or embedded, n, a, base))
                print(json.dumps(doc["runs"][-1]), file=sys.stderr)
                if doc["runs"][-1].get("interrupted"):
                    break  # the document is still printed, with what was measured
    finally:
        if not a.keep:
            shutil.rmtree(base, ignore_errors=True)
    doc["loadavg_after"] = list(os.getloadavg())
    text = json.dumps(doc, indent=2)
    if a.out:
        a.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
