"""Run the whole benchmark suite (P1–P10, BK, SIDECAR, SCALE) in one go, save the JSON, rewrite
the summary table.

    .venv/bin/python bench/run_all.py            # everything (< 15 min on 2 cores)
    .venv/bin/python bench/run_all.py --only P4  # one benchmark (names below)
    .venv/bin/python bench/run_all.py --only BK --update          # ... and its rows in the table
    .venv/bin/python bench/run_all.py --from BK=bench/results/x.json --update  # a saved run

Each benchmark is its own script (run alone with ``.venv/bin/python bench/<name>.py``) that
prints one JSON document; this runner runs them one after another (never in parallel: they
measure ratios on a shared 2-core machine), stores every document in
``bench/results/latest.json`` and rewrites the table between the summary markers at the top of
``docs/benchmarks.md``: date, machine, commit, goal, figure, met or not. The detailed sections
below the table are written by hand from the same run.

``--only`` runs some benchmarks and ``--from NAME=FILE`` takes a document a benchmark printed
when run alone (with other arguments than the suite's, say); either way the document replaces
that benchmark's in ``latest.json`` — the others' stay — with its date and commit. With
``--update`` the table is rendered again from every stored document, its header naming the
benchmarks rerun since the last full run, so that no row of the table is written by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks.md"
BEGIN, END = "<!-- summary:begin -->", "<!-- summary:end -->"

Row = tuple[str, str, str, bool | None]  # what, goal, figure, met


def _get(d: Any, *path: Any) -> Any:
    for p in path:
        if isinstance(d, dict):
            d = d.get(p)
        elif isinstance(d, list) and isinstance(p, int) and -len(d) <= p < len(d):
            d = d[p]
        else:
            return None
    return d


def _load(d: dict[str, Any]) -> str:
    """The machine's 1-minute load average the document recorded, as a figure's suffix: the
    machine is shared, and a rate means little without it."""
    before, after = _get(d, "loadavg_before", 0), _get(d, "loadavg_after", 0)
    if before is not None and after is not None:
        return f" (load {before:.1f}→{after:.1f})"
    at = _get(d, "loadavg", 0)
    return "" if at is None else f" (load {at:.1f})"


def _p1p2(d: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for r in d.get("results", []):
        size = "1 KiB" if r["entry_size"] == 1024 else f"{r['entry_size'] // 1024} KiB"
        goal_user = 0.5 if r["entry_size"] <= 1024 else 0.1
        u = r["offload"]["user_s_per_gib"]
        rows.append((f"P1 user CPU s/GiB, {size} entries", f"≤ {goal_user}", f"{u}",
                     u <= goal_user))
        rows.append((f"P1 total CPU ÷ raw copy, {size}", "≤ 1.3", f"{r['cpu_ratio']}",
                     r["cpu_ratio"] <= 1.3))
        rows.append((f"P2 throughput ÷ raw copy, filesystem, {size}", "≥ 0.9",
                     f"{r['throughput_ratio']}", r["throughput_ratio"] >= 0.9))
        if "source_check_user_ratio" in r:  # the P1 figures above include the check
            rows.append((f"P1 source checksum check: user CPU with ÷ without, {size}",
                         "(figure)", f"{r['source_check_user_ratio']}× "
                         f"({r['source_check_user_s_per_gib']:+} s/GiB)", None))
    return rows


def _p3(d: dict[str, Any]) -> list[Row]:
    r = d["p99_ratio"]
    return [("P3 writer append p99 with offload ÷ without", "≤ 1.10", f"{r}", r <= 1.10)]


def _p4(d: dict[str, Any]) -> list[Row]:
    p99, goal = d["lag_p99_s"], d["goal_s"]
    return [(f"P4 availability lag p99, {d['rate_bytes_per_s'] / 1e6:g} MB/s, "
             f"{d['roll_s']:g} s rolling", f"≤ {goal:g} s", f"{p99} s", p99 <= goal)]


def _p5(d: dict[str, Any]) -> list[Row]:
    ratios = _get(d, "ratio_vs_sequential") or {}
    if not ratios:
        return []
    best_key = max(ratios, key=lambda k: ratios[k])
    r = ratios[best_key]
    return [(f"P5 cold read: parallel ({best_key}) ÷ sequential, 20 ms/request", "≥ 4",
             f"{r}{_load(d)}", r >= 4)]


def _p2s3(d: dict[str, Any]) -> list[Row]:
    r = _get(d, "ratio")
    if r is None:
        return []
    return [("P2 S3 upload ÷ plain aiobotocore multipart", "≥ 0.9", f"{r}{_load(d)}",
             r >= 0.9)]


def _p6(d: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for r in d.get("results", []):
        w = _get(r, "segment_writes_per_segment")
        n = _get(r, "ledgers_per_segment", "mean")
        if w is None:
            continue
        rows.append((f"P6 ZooKeeper writes per committed segment ({n} ledgers/segment)", "≤ 2",
                     f"{w}", w <= 2))
    return rows


def _p7(d: dict[str, Any]) -> list[Row]:
    r = d["peak_over_bound"]
    return [("P7 peak RSS ÷ (buffer cap + 128 MiB), slow store", "≤ 1", f"{r}", r <= 1)]


def _p8(d: dict[str, Any]) -> list[Row]:
    e = max(d["worst_rate_error"], d.get("daemon_worst_rate_error", 0))
    return [("P8 throttle achieved ÷ limit, 1–200 MB/s (worst)", "1 ± 0.02",
             f"1 ± {e}", e <= 0.02)]


def _p9(d: dict[str, Any]) -> list[Row]:
    r = _get(d, "speedup") or _get(d, "ratio")
    if r is None:
        return []
    return [("P9 Spark backfill local[2] ÷ local[1]", "≥ 1.6", f"{r}", r >= 1.6)]


def _p10(d: dict[str, Any]) -> list[Row]:
    p99, goal = d["lag_p99_s"], d["goal_p99_s"]
    return [(f"P10 lakehouse table lag p99, {d['rate_bytes_per_s'] / 1e6:g} MB/s, 3 topics",
             f"≤ {goal:g} s", f"{p99} s", p99 <= goal)]


def _p2s3_rgw(d: dict[str, Any]) -> list[Row]:
    r = _get(d, "ratio")
    if r is None:
        return []
    return [("P2 S3 upload ÷ plain aiobotocore multipart, Ceph RGW", "≥ 0.9", f"{r}{_load(d)}",
             r >= 0.9)]


def _p5_rgw(d: dict[str, Any]) -> list[Row]:
    ratios = _get(d, "ratio_vs_sequential") or {}
    if not ratios:
        return []
    best_key = max(ratios, key=lambda k: ratios[k])
    return [(f"P5 read: parallel ({best_key}) ÷ sequential, Ceph RGW, its own latency",
             "(figure)", f"{ratios[best_key]}{_load(d)}", None)]


def _bk(d: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for r in d.get("results", []):
        v = r.get("modes", {}).get("v2")
        if v is None or (r.get("ensemble"), r.get("wq")) != (3, 2):
            continue
        size, lat = r["entry_bytes"], r["latency_ms"]
        cpu_goal, rate_goal = (8.0, 100.0) if size <= 1024 else (1.5, 400.0)
        what = f"BookKeeper source, {size // 1024} KiB entries, bookies +{lat:g} ms"
        rows.append((f"{what}: CPU-s/GiB", f"≤ {cpu_goal:g}",
                     f"{v['cpu_s_per_gib']:.2f} ({v['us_per_entry']:.1f} µs/entry){_load(d)}",
                     v["cpu_s_per_gib"] <= cpu_goal))
        rows.append((f"{what}: MiB/s", f"≥ {rate_goal:g}", f"{v['mib_s']:.0f}{_load(d)}",
                     v["mib_s"] >= rate_goal))
    return rows


def _sidecar(d: dict[str, Any]) -> list[Row]:
    r = d["cpu_ratio"]
    return [("Sidecar path (BookKeeper → filesystem tier) ÷ source alone, CPU-s/GiB, 1 KiB",
             "≤ 1.5", f"{r:.2f}{_load(d)}", r <= 1.5)]


def _scale(d: dict[str, Any]) -> list[Row]:
    """bench/topic_scaling.py: issue 22's goals, from the largest topic count each store ran
    to the end (a run killed at its RSS bound is a row of its own). The idle, status and scrape
    goals are set at 10,000 topics: below that the figure is shown, not judged."""
    def at(store: str, r: dict[str, Any]) -> str:
        block = r.get("max_block_size_bytes", "default")
        return f"{store}, {r['topics']:,} topics" + (
            "" if block == "default" else f", {block / 2**20:g} MiB blocks")

    rows: list[Row] = []
    for store, commit_goal in (("embedded", 500), ("zookeeper+s3", 200)):
        runs = [r for r in d.get("runs", []) if r.get("store") == store]
        for r in runs:
            if "aborted" in r:
                rows.append((f"Topics ({at(store, r)})", "runs to the end",
                             f"aborted: {r['aborted'][:80]}", False))
        done = [r for r in runs if "aborted" not in r]
        if not done:
            continue
        r = max(done, key=lambda x: x["topics"])
        n, where = r["topics"], at(store, r)
        big = n >= 10_000
        cpu = r["idle_committed"]["cpu_pct_of_core"]
        rows.append((f"Topics ({where}): idle CPU % of a core", "≤ 1 at 10,000", f"{cpu}{_load(d)}",
                     cpu <= 1 if big else None))
        rss = max(r["idle_open"]["rss_mib"], r["idle_committed"]["rss_mib"])
        bound = 150 + 20 * n / 1024
        rows.append((f"Topics ({where}): RSS MiB, open segments or not", f"≤ {bound:,.0f} "
                     "(150 + 20 KiB/topic)", f"{rss:,.0f}", rss <= bound))
        modes = {m["topic_level"]: m for m in r.get("metric_modes", []) if "scrape" in m}
        scrape = (modes.get("false") or r["idle_committed"])["scrape"]
        which = "topic_level = false" if "false" in modes else "default metrics"
        rows.append((f"Topics ({where}): /metrics scrape, {which}", "≤ 100 KB at 10,000",
                     f"{scrape['bytes'] / 1000:,.0f} KB, {scrape['series']:,} series",
                     scrape["bytes"] <= 100_000 if big and "false" in modes else None))
        rate = r["commit_open"].get("commits_per_s_daemon")
        rows.append((f"Topics ({where}): commits/s, offload-now --wait", f"≥ {commit_goal}",
                     f"{rate}", None if rate is None else rate >= commit_goal))
        stop = r["stop"]["seconds"]
        rows.append((f"Topics ({where}): SIGTERM to exit, every segment open", "≤ 30 s",
                     f"{stop} s" + (" (killed)" if r["stop"]["killed"] else ""),
                     stop <= 30 and not r["stop"]["killed"]))
        st = r["status_text"]["seconds"]
        rows.append((f"Topics ({where}): offloadd status wall time", "≤ 3 s at 10,000", f"{st} s",
                     st <= 3 if big else None))
    return rows


@dataclass(frozen=True)
class Bench:
    name: str
    script: str
    args: tuple[str, ...]
    summarize: Callable[[dict[str, Any]], list[Row]]


SUITE = [
    Bench("P1P2", "offload_throughput.py", ("--mib", "512"), _p1p2),
    Bench("P3", "write_isolation.py", ("--seconds", "12", "--history-mib", "512",
                                       "--prefix", "nice -n 10"), _p3),
    Bench("P4", "availability_lag.py", ("--seconds", "40",), _p4),
    Bench("P5", "s3_read_parallel.py", (), _p5),
    Bench("P2S3", "s3_upload.py", (), _p2s3),
    Bench("P6", "zk_writes_per_segment.py", (), _p6),
    Bench("P7", "memory_bound.py", ("--seconds", "25"), _p7),
    Bench("P8", "throttle_accuracy.py", (), _p8),
    Bench("P9", "backfill_scaling.py", (), _p9),
    Bench("P5RGW", "s3_read_parallel.py", ("--store", "rgw"), _p5_rgw),
    Bench("P2RGW", "s3_upload.py", ("--store", "rgw"), _p2s3_rgw),
    Bench("BK", "bookkeeper_read.py", ("--mib", "256,1024"), _bk),
    Bench("SIDECAR", "sidecar_path.py", ("--repeats", "7"), _sidecar),
    Bench("P10", "lakehouse_lag.py", ("--seconds", "90"), _p10),
    Bench("SCALE", "topic_scaling.py", ("--topics", "10,100,1000", "--run-timeout", "240",
                                              "--max-rss-mib", "4096"),
          _scale),
]


def run_one(b: Bench) -> tuple[dict[str, Any] | None, float, str]:
    t0 = time.monotonic()
    script = ROOT / "bench" / b.script
    if not script.exists():
        return None, 0.0, "script missing"
    p = subprocess.run([sys.executable, str(script), *b.args], cwd=ROOT, capture_output=True,
                       text=True, timeout=900)
    took = time.monotonic() - t0
    if p.returncode != 0:
        return None, took, (p.stderr.strip().splitlines() or ["failed"])[-1][:200]
    out = p.stdout
    try:
        return json.loads(out[out.index("{"):]), took, ""
    except ValueError:
        return None, took, "no JSON on stdout"


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def render(rows: list[Row], meta: dict[str, str],
           reruns: dict[tuple[str, str], list[tuple[str, str]]] | None = None) -> str:
    """The summary block. ``reruns``: per (day, commit), the (name, time) of the benchmarks
    stored since the last full run."""
    head = (f"Last full run: {meta['date']} · {meta['machine']} · commit `{meta['commit']}` · "
            f"{meta['seconds']} s for the whole suite (`.venv/bin/python bench/run_all.py`).")
    if reruns:
        parts = []
        for (day, rev), runs in sorted(reruns.items()):
            times = sorted(t for _, t in runs)
            span = times[0] if times[0] == times[-1] else f"{times[0]}–{times[-1]}"
            parts.append(f"{', '.join(n for n, _ in runs)} on {day} ({span} UTC), "
                         f"commit `{rev}`")
        head += (" Rerun alone since (`bench/run_all.py --only NAME --update`, or a saved run "
                 "with `--from`): " + "; ".join(parts) + ".")
    lines = [BEGIN, "", head, "", "| benchmark | goal | figure | met |", "|---|---|---|---|"]
    for what, goal, figure, met in rows:
        mark = "—" if met is None else ("yes" if met else "**no**")
        lines.append(f"| {what} | {goal} | {figure} | {mark} |")
    lines += ["", END]
    return "\n".join(lines)


def write_summary(block: str) -> None:
    text = DOC.read_text() if DOC.exists() else "# Benchmarks\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        text = head + block + tail
    else:
        first, _, rest = text.partition("\n")
        text = f"{first}\n\n{block}\n{rest}"
    DOC.write_text(text)


def table_rows() -> list[Row]:
    """The rows of the summary table as it is in the document."""
    text = DOC.read_text() if DOC.exists() else ""
    if BEGIN not in text or END not in text:
        return []
    rows: list[Row] = []
    for line in text.split(BEGIN, 1)[1].split(END, 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or cells[0] in ("benchmark", "---"):
            continue
        met = {"yes": True, "**no**": False}.get(cells[3])
        rows.append((cells[0], cells[1], cells[2], met))
    return rows


def summarize(b: Bench, stored: dict[str, Any] | None,
              kept: list[Row] | None = None) -> list[Row]:
    """``b``'s rows from its stored result; without one, the rows of the table that name it
    (``kept``: put there before results were stored) rather than none."""
    data = None if stored is None else stored.get("result")
    if data is None and stored is None and kept:
        mine = [r for r in kept if r[0].startswith(f"{b.name} ")]
        if mine:
            return mine
    if data is None:
        err = "not run" if stored is None else stored.get("error") or "failed"
        return [(f"{b.name} ({b.script})", "", f"did not run: {err}", None)]
    try:
        return b.summarize(data)
    except (KeyError, TypeError, ValueError) as exc:
        return [(f"{b.name} ({b.script})", "", f"unreadable result: {exc}", None)]


def _from_file(spec: str) -> tuple[str, dict[str, Any], str]:
    """NAME, the document, and when it was written (the file's time)."""
    name, sep, path = spec.partition("=")
    if not sep or name not in {b.name for b in SUITE}:
        raise SystemExit(f"--from {spec}: expected NAME=FILE, NAME one of "
                         f"{', '.join(b.name for b in SUITE)}")
    try:
        text = Path(path).read_text()
        data: dict[str, Any] = json.loads(text[text.index("{"):])
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(Path(path).stat().st_mtime))
    except (OSError, ValueError) as exc:
        raise SystemExit(f"--from {spec}: cannot read a benchmark's JSON document: {exc}") \
            from None
    return name, data, when


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", action="append", default=[],
                    help="run only these (e.g. P4); the others' stored results stay")
    ap.add_argument("--from", dest="from_", action="append", default=[], metavar="NAME=FILE",
                    help="store FILE (a benchmark's JSON output) as NAME's result, no run")
    ap.add_argument("--update", action="store_true",
                    help="with --only/--from: render the summary table again from every "
                         "stored result")
    a = ap.parse_args()
    partial = bool(a.only or a.from_)
    unknown = set(a.only) - {b.name for b in SUITE}
    if unknown:
        raise SystemExit(f"--only {', '.join(sorted(unknown))}: no such benchmark; one of "
                         f"{', '.join(b.name for b in SUITE)}")
    t0 = time.monotonic()
    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    latest = ROOT / "bench" / "results" / "latest.json"
    saved: dict[str, Any] = json.loads(latest.read_text()) if partial and latest.exists() \
        else {}
    results: dict[str, Any] = dict(saved.get("results", {})) if partial else {}
    for spec in a.from_:
        name, doc, when = _from_file(spec)
        results[name] = {"seconds": None, "error": None, "result": doc, "date": when,
                         "commit": commit(), "from": spec.partition("=")[2]}
    for b in SUITE:
        if partial and b.name not in a.only:
            continue
        data, took, err = run_one(b)
        results[b.name] = {"seconds": round(took, 1), "error": err or None, "result": data}
        if partial:
            results[b.name] |= {"date": now, "commit": commit()}
        print(f"{b.name:5s} {b.script:28s} {took:6.1f}s {'ok' if data else 'FAILED: ' + err}",
              file=sys.stderr)
    kept = table_rows() if partial else []
    rows = [row for b in SUITE for row in summarize(b, results.get(b.name), kept)]
    meta = saved.get("meta") if partial else None
    if meta is None:
        meta = {
            "date": now,
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
                       f"{platform.python_version()}",
            "commit": commit(),
            "seconds": f"{time.monotonic() - t0:.0f}",
        }
    reruns: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for b in SUITE:  # in the suite's order
        r = results.get(b.name)
        if r is not None and "date" in r:
            day, _, hhmm = r["date"].partition(" ")
            reruns.setdefault((day, r["commit"]), []).append((b.name, hhmm.split()[0]))
    latest.parent.mkdir(exist_ok=True)
    latest.write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    if not partial or a.update:
        write_summary(render(rows, meta, reruns))
    print(json.dumps({"meta": meta, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
