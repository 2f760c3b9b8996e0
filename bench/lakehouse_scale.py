"""The lakehouse at 1,000 topics: its CPU against the daemon's own, table commits/s, table lag.

Issue 22: "with the lakehouse on, 1,000 topics in ``standalone`` cost 108 user-s for 60 MB where
44 were spent without it". Four measurements, each in a temporary directory, all processes on
loopback and stopped on exit:

1. **without**: ``offloadd standalone --topics N --duration S --rate R`` with
   ``[lakehouse] enabled = false``: the daemon's (and its writer's) user and system seconds
   (``wait4`` rusage of the child), bytes written;
2. **with**: the same with the lakehouse on (the follower projects while the writer writes, then
   the tables catch up before exit). From the catalog afterwards: every table's projection
   commits (snapshots recording ``offloadd.last-position``), table commits/s while writing,
   and the per-segment table lag — a segment's commit to the tier until the first snapshot
   whose last position reaches its end (p50/p99/max over every segment of every topic, and
   the worst table);
3. **sync**: ``offloadd lakehouse sync`` alone over run 1's directory (everything committed,
   nothing projected yet): the projection's CPU per GiB of payload and its commits/s, apart
   from the daemon;
4. **idle pass**: in this process, over run 3's tables once they have everything: the CPU of
   one projection pass that finds nothing new, and of one metrics report of every table
   (what the follower does every ``interval_s`` at rest);
5. **commit cost** (first, in this process): CPU per table append against the table's
   snapshot count, through pyiceberg's ``Table.append`` and through offloadd's ``append``.

Prints one JSON document (also written to ``--out``). CPU per GiB compares the lakehouse's
share (run 2 minus run 1, and run 3 alone) with the daemon's own (run 1).

    .venv/bin/python bench/lakehouse_scale.py [--topics 1000] [--seconds 60] [--rate 1000000]
        [--skip with,sync] [--out bench/results/issue22-lakehouse_scale-after.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from offloadd import config
from offloadd.errors import NotFound
from offloadd.lakehouse.tables import LAST_POSITION, open_catalog
from offloadd.metadata import managed_ledger
from offloadd.metadata.embedded import EmbeddedMetadataStore
from offloadd.model import Position, TopicName, catalog

GIB = 1024**3


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


def run_child(argv: list[str], cwd: Path, env: dict[str, str]) -> dict[str, Any]:
    """Run a child to its end: stdout, its user/system seconds (wait4), wall seconds."""
    out_path = cwd / f".out-{time.monotonic_ns()}"
    t0 = time.monotonic()
    with open(out_path, "w") as out, open(cwd / "stderr.log", "a") as err:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - t0
    text = out_path.read_text()
    if proc.returncode != 0:
        raise SystemExit(f"{argv[3:5]} exited {proc.returncode}; see {cwd / 'stderr.log'}:\n"
                         + (cwd / "stderr.log").read_text()[-3000:])
    return {"stdout": text, "user_s": round(usage.ru_utime, 1),
            "sys_s": round(usage.ru_stime, 1), "wall_s": round(wall, 1)}


def standalone(root: Path, a: argparse.Namespace, lakehouse: bool) -> dict[str, Any]:
    env = {**os.environ, "OFFLOADD_METRICS__ENABLED": "false",
           "OFFLOADD_LAKEHOUSE__ENABLED": "true" if lakehouse else "false"}
    t_start = time.time()
    res = run_child([sys.executable, "-m", "offloadd", "standalone", "--json", "--duration",
                     str(a.seconds), "--rate", str(a.rate), "--topics", str(a.topics),
                     "--log-level", "WARNING"], root, env)
    summary = json.loads(res.pop("stdout").strip().splitlines()[-1])
    nbytes = int(summary["bytes_written"])
    res.update(bytes_written=nbytes, started=t_start,
               writer_s=float(summary["seconds"]),
               cpu_s_per_gib=round((res["user_s"] + res["sys_s"]) / (nbytes / GIB), 1),
               drained=summary.get("drained"))
    if lakehouse:
        errors = [t for t, r in (summary.get("lakehouse") or {}).items() if r.get("error")]
        res["lakehouse_errors"] = len(errors)
    return res


def settings_for(root: Path) -> Any:
    cwd = os.getcwd()
    os.chdir(root)
    try:
        return config.load(None, lakehouse__path=str(root / "data" / "lakehouse"),
                           metadata__url=f"embedded:{root / 'data' / 'metadata'}",
                           source__path=str(root / "data" / "ledgers"),
                           blobstore__path=str(root / "data" / "tier"))
    finally:
        os.chdir(cwd)


async def segments_of(root: Path, topics: list[TopicName]) -> dict[TopicName, list[Any]]:
    md = await EmbeddedMetadataStore.open(str(root / "data" / "metadata"))
    out = {}
    try:
        for t in topics:
            try:
                info, _ = await managed_ledger.load(md, t.managed_ledger)
            except NotFound:  # the writer's round robin did not reach it in the time given
                continue
            out[t] = [(s.end, s.offloaded_ms) for s in catalog.segments(info) if s.complete]
    finally:
        await md.close()
    return out


def tables_report(root: Path, topics: list[TopicName], window: tuple[float, float]
                  ) -> dict[str, Any]:
    """Commits, commits/s inside ``window`` (unix seconds) and per-segment lag."""
    cat = open_catalog(settings_for(root), create=False)
    segs = asyncio.run(segments_of(root, topics))
    lags: list[float] = []
    worst: dict[str, float] = {}
    commits = in_window = 0
    for topic in segs:
        table = cat.load_table((topic.tenant, topic.namespace, topic.local))
        snaps = sorted((s.timestamp_ms, Position.parse(str(s.summary[LAST_POSITION])))
                       for s in table.metadata.snapshots
                       if s.summary is not None and s.summary[LAST_POSITION])
        commits += len(snaps)
        in_window += sum(1 for ts, _ in snaps if window[0] * 1000 <= ts <= window[1] * 1000)
        for end, committed_ms in segs[topic]:
            seen = next((ts for ts, pos in snaps if pos >= end), None)
            if seen is None:
                raise SystemExit(f"{topic}: segment ending {end} never became visible")
            lag = max(0.0, (seen - committed_ms) / 1000)
            lags.append(lag)
            worst[str(topic)] = max(worst.get(str(topic), 0.0), lag)
    span = window[1] - window[0]
    return {"topics_written": len(segs), "table_commits": commits, "segments": len(lags),
            "table_commits_per_s_while_writing": round(in_window / span, 1) if span else None,
            "lag_p50_s": round(percentile(lags, 0.5), 1),
            "lag_p99_s": round(percentile(lags, 0.99), 1),
            "lag_max_s": round(max(lags, default=0.0), 1),
            "table_max_lag_p50_s": round(percentile(list(worst.values()), 0.5), 1)}


def sync_alone(root: Path) -> dict[str, Any]:
    env = {**os.environ, "OFFLOADD_METRICS__ENABLED": "false"}
    res = run_child([sys.executable, "-m", "offloadd", "lakehouse", "sync", "--json",
                     "--log-level", "WARNING"], root, env)
    reps = json.loads(res.pop("stdout"))["topics"]
    commits = sum(r["commits"] for r in reps)
    res.update(table_commits=commits, rows=sum(r["rows"] for r in reps),
               errors=sum(1 for r in reps if r["error"]),
               table_commits_per_s=round(commits / res["wall_s"], 1))
    return res


def idle_pass(root: Path) -> dict[str, Any]:
    """CPU of one projection pass with nothing new, and of one metrics report, in-process."""
    from offloadd import wiring
    from offloadd.lakehouse.follower import report_tables
    from offloadd.lakehouse.projector import Projector
    from offloadd.metrics import Metrics

    settings = settings_for(root)

    async def go() -> dict[str, Any]:
        md = await wiring.open_metadata(settings)
        bs = await wiring.open_blobstore(settings)
        try:
            proj = Projector(settings, md, bs)
            out: dict[str, Any] = {}
            for name in ("first_pass", "idle_pass", "idle_pass_again"):
                t0, r0 = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF)
                reps = await proj.sync()
                r1 = resource.getrusage(resource.RUSAGE_SELF)
                out[name] = {"cpu_s": round(r1.ru_utime + r1.ru_stime - r0.ru_utime
                                            - r0.ru_stime, 2),
                             "wall_s": round(time.monotonic() - t0, 2),
                             "commits": sum(r.commits for r in reps)}
            metrics = Metrics(topic_level=False)
            t0, r0 = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF)
            n = await report_tables(settings, md, metrics)
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            out["metrics_report"] = {"tables": n, "cpu_s": round(
                r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, 2),
                "wall_s": round(time.monotonic() - t0, 2)}
            if hasattr(proj, "table_stats"):  # the follower's report: what the pass saw
                r0 = resource.getrusage(resource.RUSAGE_SELF)
                n = len(proj.table_stats(int(time.time() * 1000)))
                r1 = resource.getrusage(resource.RUSAGE_SELF)
                out["metrics_report_from_pass"] = {"tables": n, "cpu_s": round(
                    r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, 3)}
            return out
        finally:
            await bs.close()
            await md.close()

    cwd = os.getcwd()
    os.chdir(root)
    try:
        return asyncio.run(go())
    finally:
        os.chdir(cwd)


def commit_cost(snapshots: int = 200, step: int = 50) -> dict[str, Any]:
    """CPU per append against the table's snapshot count: pyiceberg's ``Table.append`` (what
    the projection used) and offloadd's :func:`~offloadd.lakehouse.tables.append`, each on
    a table of its own in a temporary SQL catalog, 100 rows per append."""
    import pyarrow as pa
    from pyiceberg.catalog.sql import SqlCatalog

    from offloadd.lakehouse.tables import append

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="offloadd-commitcost-") as d:
        cat = SqlCatalog("bench", uri=f"sqlite:///{d}/c.db", warehouse=f"file://{d}/wh")
        cat.create_namespace("ns")
        df = pa.table({"a": pa.array(range(100), pa.int64()), "b": pa.array(["x"] * 100)})
        for name in ("pyiceberg_append", "offloadd_append"):
            t = cat.create_table(f"ns.{name}", schema=df.schema)
            ms = out[name + "_cpu_ms"] = {}
            for _ in range(snapshots // step):
                r0 = resource.getrusage(resource.RUSAGE_SELF)
                for i in range(step):
                    props = {"k": str(i)}
                    if name == "pyiceberg_append":
                        t.append(df, snapshot_properties=props)
                    else:
                        append(t, df, props)
                r1 = resource.getrusage(resource.RUSAGE_SELF)
                cpu = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
                ms[len(t.metadata.snapshots)] = round(cpu / step * 1000, 1)
    return out


def save(result: dict[str, Any], out: Path | None) -> None:
    """The results so far (a later phase that fails leaves the earlier ones)."""
    if out is not None:
        out.write_text(json.dumps(result, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--topics", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--rate", type=float, default=1_000_000)
    ap.add_argument("--skip", default="",
                    help="comma-separated: without, with, sync, idle, commit-cost")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    skip = set(filter(None, a.skip.split(",")))
    topics = [TopicName.parse(f"persistent://public/default/topic-{i}") for i in range(a.topics)]
    result: dict[str, Any] = {"topics": a.topics, "seconds": a.seconds,
                              "rate_bytes_per_s": a.rate, "load_before": os.getloadavg()[0]}
    if "commit-cost" not in skip:
        result["commit_cost"] = commit_cost()
        save(result, a.out)
    if "without" in skip:
        print(json.dumps(result, indent=2))
        return
    with tempfile.TemporaryDirectory(prefix="offloadd-lakescale-") as d:
        off, on = Path(d) / "without", Path(d) / "with"
        off.mkdir()
        on.mkdir()
        result["without"] = standalone(off, a, lakehouse=False)
        save(result, a.out)
        if "with" not in skip:
            w = result["with"] = standalone(on, a, lakehouse=True)
            w.update(tables_report(on, topics, (w["started"], w["started"] + w["writer_s"])))
            base = result["without"]
            extra = (w["user_s"] + w["sys_s"]) - (base["user_s"] + base["sys_s"])
            result["lakehouse_cpu_s"] = round(extra, 1)
            result["lakehouse_cpu_s_per_gib"] = round(extra / (w["bytes_written"] / GIB), 1)
            save(result, a.out)
        if "sync" not in skip:
            s = result["sync"] = sync_alone(off)
            s["cpu_s_per_gib"] = round((s["user_s"] + s["sys_s"])
                                       / (result["without"]["bytes_written"] / GIB), 1)
            save(result, a.out)
            if "idle" not in skip:
                result["idle"] = idle_pass(off)
        for r in (result.get("without"), result.get("with")):
            if r:
                r.pop("started", None)
    result["load_after"] = os.getloadavg()[0]
    print(json.dumps(result, indent=2))
    save(result, a.out)


if __name__ == "__main__":
    main()
