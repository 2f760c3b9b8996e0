"""``offloadd status`` against a live daemon at many topics, two versions of the command side by
side (issue 22, "Status at scale").

The daemon part is ``bench/topic_scaling.py``'s (its functions, same method): ``--bytes-per-topic``
of history on every topic (1 KiB entries, the embedded writer), ``offloadd run`` on the embedded
store with the filesystem tier, wait until every topic has read its history, then
``offload-now --wait`` (every topic commits a segment: the state topic_scaling's status step
sees). Then, ``--repeats`` times, for each version in turn (this tree and, with ``--before DIR``,
the tree at ``DIR`` run with ``PYTHONPATH=DIR``: the same daemon, the same store, alternating so
both see the same load), ``offloadd status`` in text and with ``--json``: wall seconds, the
command's own CPU seconds (user + system), its exit code and output size, the daemon's CPU over
the command, and the load average. Bytecode is kept for both (a first run of each writes it).

    .venv/bin/python bench/status_live.py [--topics 10000] [--before /tmp/status-before]
        [--repeats 3] [--out bench/results/...json]

Prints one JSON document (also written to ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import topic_scaling as ts  # noqa: E402
from bench.procstat import cpu_ticks  # noqa: E402


def timed_status(version: str, env: dict[str, str], cfg: Path, extra: list[str],
                 daemon_pid: int, timeout: float) -> dict[str, Any]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    d0 = cpu_ticks(daemon_pid)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    p = subprocess.run([*ts.PY, "status", "--config", str(cfg), *extra], cwd=cfg.parent,
                       capture_output=True, text=True, timeout=timeout, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"version": version, "view": "json" if extra else "text",
            "seconds": round(wall, 2),
            "cpu_s": round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime,
                           2),
            "daemon_cpu_s": round((cpu_ticks(daemon_pid) - d0) / ts.TICK, 2),
            "exit": p.returncode, "bytes": len(p.stdout), "load1": round(load, 1),
            "daemon_answered": ("daemon pid" in p.stdout) if not extra
            else '"topics_owned"' in p.stdout or '"state": "running"' in p.stdout}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topics", type=int, default=10_000)
    ap.add_argument("--bytes-per-topic", type=int, default=20_000)
    ap.add_argument("--entry-size", type=int, default=1024)
    ap.add_argument("--before", type=Path, default=None,
                    help="a tree with the code to compare with (run with PYTHONPATH=DIR)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-commit", action="store_true",
                    help="leave every segment open (no offload-now before status)")
    ap.add_argument("--run-timeout", type=float, default=1800.0)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="status-live-"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(base / "pycache")
    ts.CHILD_ENV = env
    versions: list[tuple[str, dict[str, str]]] = [("after", env)]
    if a.before is not None:
        versions.insert(0, ("before", {**env, "PYTHONPATH": str(a.before.resolve())}))
    doc: dict[str, Any] = {"benchmark": "status_live", "topics": a.topics,
                           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                           f"Python {platform.python_version()}",
                           "before": str(a.before) if a.before else None,
                           "loadavg_before": os.getloadavg()}
    work = base / "run"
    work.mkdir()
    port = ts.free_port()
    cfg = work / "offloadd.toml"
    cfg.write_text(ts.config_text(work, ts.embedded(work), port, None, None))
    daemon = ts.Daemon(cfg, port, 8 * 1024 * ts.MiB)
    deadline = time.monotonic() + a.run_timeout
    try:
        entries = max(1, a.bytes_per_topic // a.entry_size)
        ends, took = ts.write(cfg, a.topics, entries, a.entry_size, a.run_timeout)
        doc["write_s"] = round(took, 1)
        daemon.start()
        doc["catch_up_s"] = round(daemon.wait_read(ends, deadline), 1)
        if not a.no_commit:
            doc["commits"] = daemon.offload_now(a.run_timeout)
        time.sleep(3)
        for name, venv in versions:  # warm-up: each version's bytecode written
            timed_status(name, venv, cfg, ["--topic", ts.TOPIC_PREFIX + "0"], daemon.pid,
                         a.run_timeout)
        runs = []
        for _ in range(a.repeats):
            for extra in ([], ["--json"]):
                for name, venv in versions:
                    runs.append(timed_status(name, venv, cfg, extra, daemon.pid,
                                             a.run_timeout))
                    daemon.check()
        doc["runs"] = runs
        doc["summary"] = {f"{n}_{v}": {
            k: sorted(r[k] for r in runs if r["version"] == n and r["view"] == v)
            for k in ("seconds", "cpu_s", "daemon_cpu_s")}
            for n, _ in versions for v in ("text", "json")}
    except (ts.Aborted, RuntimeError, subprocess.TimeoutExpired) as exc:
        doc["aborted"] = str(exc)[:2000]
    finally:
        daemon.kill()
        shutil.rmtree(base, ignore_errors=True)
    doc["loadavg_after"] = os.getloadavg()
    text = json.dumps(doc, indent=2)
    if a.out is not None:
        a.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
