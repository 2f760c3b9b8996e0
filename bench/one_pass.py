"""User CPU per GiB of the offload path at 64 KiB entries, this tree against a baseline tree
(issue 22, "one pass per byte").

Writes ``--mib`` MiB of history (2 topics, ``--entry-size`` bytes per entry) with the embedded
writer, then runs the daemon alone in a fresh process until every entry is committed to the
filesystem tier (``bench/offload_throughput.py``'s child, the same settings but the daemon's
default 64 MiB blocks), alternating: the baseline code (``--baseline DIR``: a tree holding an
``offloadd`` package, put first on ``PYTHONPATH``), this tree with the source check (``[source]
verify_crc``, the default) and this tree without it. ``--tier s3``: to a moto_server (one
started for each run, over HTTPS as S3 is reached in production, so bodies go unsigned; its
own CPU is another process's) instead of the filesystem tier. The figures are ratios taken in
one run on a shared machine: other tenants only ever add CPU time, so the least of each kind is
the figure to compare, with the median beside it. Beside the process's user time, each run
reports the event loop's thread's own (``loop_user_s``) and every kind of thread's CPU from
``/proc/self/task`` (``threads``: the reading threads are ``uvloop``'s default executor's).
Prints one JSON document.

    git archive main offloadd | tar -x -C /tmp/base
    .venv/bin/python bench/one_pass.py --baseline /tmp/base [--mib 512] [--repeats 3]
        [--tier fs|s3] [--after DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from offload_throughput import CONFIG, OFFLOAD, _fresh

GiB = 1024**3


S3 = """
[blobstore]
driver = "aws-s3"
endpoint = "{endpoint}"
bucket = "{bucket}"
region = "us-east-1"
access_key_id = "testing"
secret_access_key = "testing"
verify_tls = false
"""
BUCKET = "bench-one-pass"


def _config(cwd: Path, block: int, verify: bool, endpoint: str | None = None) -> None:
    text = CONFIG.format(seg_mib=128, block=block, buffer=256 * 1024 * 1024,
                         ledger=48 * 1024 * 1024, verify="true" if verify else "false")
    if endpoint is not None:
        text += S3.format(endpoint=endpoint, bucket=BUCKET)
    (cwd / "bench.toml").write_text(text)


@contextmanager
def _tier(kind: str) -> Iterator[str | None]:
    """The S3 endpoint of a fresh moto_server with the bucket made (``s3``), or None (the
    filesystem tier)."""
    if kind != "s3":
        yield None
        return
    import boto3
    import urllib3
    from s3_upload import moto

    urllib3.disable_warnings()
    with moto(tls=True) as url:
        boto3.client("s3", endpoint_url=url, region_name="us-east-1", verify=False,
                     aws_access_key_id="testing", aws_secret_access_key="testing"
                     ).create_bucket(Bucket=BUCKET)
        yield url


# Per-thread CPU of the child: the event loop's own (getrusage RUSAGE_THREAD, in it) and every
# thread's from /proc/self/task/<tid>/stat (utime, stime in clock ticks) and schedstat (cpu_s:
# the time it ran, in ns: exact, where the user/system split is sampled at each tick), grouped
# by the Python thread's name less its number (Python 3.11 does not name OS threads), as
# deltas over the
# measured window; a thread started inside the window counts from zero. A thread that ended
# inside it is missed, which the process total (RUSAGE_SELF) still holds: "others_*" is that
# total minus the loop's.
_THREADS = """
import os as _os, threading as _threading
_TICK = _os.sysconf("SC_CLK_TCK")
def _tasks():
    out = {}
    named = {t.native_id: t.name for t in _threading.enumerate()}
    for tid in _os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        comm = named.get(int(tid), "unnamed")
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ran = int(f.read().split()[0]) / 1e9
        except OSError:
            ran = 0.0
        fields = stat[stat.rindex(")") + 2:].split()
        out[tid] = (comm, int(fields[11]) / _TICK, int(fields[12]) / _TICK, ran)
    return out
def _by_name(t0, t1):
    names = {}
    for tid, (comm, u, s, c) in t1.items():
        _, u0, s0, c0 = t0.get(tid, (comm, 0.0, 0.0, 0.0))
        key = comm.rstrip("0123456789").rstrip("_-") or comm
        acc = names.setdefault(key, [0.0, 0.0, 0.0])
        acc[0] += u - u0
        acc[1] += s - s0
        acc[2] += c - c0
    return {k: {"user_s": round(v[0], 3), "sys_s": round(v[1], 3), "cpu_s": round(v[2], 3)}
            for k, v in names.items()}
"""
_START = "    r0 = resource.getrusage(resource.RUSAGE_SELF)\n"
_END = "    r1 = resource.getrusage(resource.RUSAGE_SELF)\n"
_PRINT = '"sys_s": r1.ru_stime - r0.ru_stime}))'


def _instrumented(poll_s: float) -> str:
    """The throughput bench's child, with per-thread CPU in its JSON line."""
    # the child's own loop (is every entry committed yet?) runs in the measured process: its
    # interval is a knob so that its share can be told from the offload path's
    code = OFFLOAD.replace("await asyncio.sleep(0.05)", f"await asyncio.sleep({poll_s})")
    assert code != OFFLOAD or poll_s == 0.05
    for part in (_START, _END, _PRINT):
        assert code.count(part) == 1, part
    code = code.replace("import asyncio,", _THREADS + "import asyncio,", 1)
    code = code.replace(_START, _START + "    l0 = resource.getrusage(resource.RUSAGE_THREAD)\n"
                        "    t0s = _tasks()\n")
    code = code.replace(_END, _END + "    l1 = resource.getrusage(resource.RUSAGE_THREAD)\n"
                        "    t1s = _tasks()\n")
    return code.replace(_PRINT, '"sys_s": r1.ru_stime - r0.ru_stime, '
                        '"loop_user_s": l1.ru_utime - l0.ru_utime, '
                        '"loop_sys_s": l1.ru_stime - l0.ru_stime, '
                        '"threads": _by_name(t0s, t1s)}))')


def _child(cwd: Path, pythonpath: str | None, poll_s: float) -> dict[str, Any]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    code = _instrumented(poll_s)
    p = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                       timeout=1800, env=env)
    if p.returncode != 0:
        raise SystemExit(f"child failed:\n{p.stderr[-4000:]}")
    out: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", required=True, help="a tree holding the baseline offloadd")
    ap.add_argument("--after", help="a tree holding the offloadd to measure as after "
                    "(default: the installed one, this tree), so that editing this tree while "
                    "the bench runs changes nothing")
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--entry-size", type=int, default=64 * 1024)
    ap.add_argument("--block-mib", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tier", choices=("fs", "s3"), default="fs")
    ap.add_argument("--poll-s", type=float, default=0.05,
                    help="how often the child checks that everything is committed "
                    "(bench/offload_throughput.py: 0.05)")
    args = ap.parse_args()
    baseline = str(Path(args.baseline).resolve())
    if not (Path(baseline) / "offloadd" / "__init__.py").exists():
        raise SystemExit(f"{baseline} holds no offloadd package")
    block = args.block_mib * 1024 * 1024
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    after_tree = str(Path(args.after).resolve()) if args.after else None
    kinds = {"before": (baseline, True), "after": (after_tree, True),
             "after_without_source_check": (after_tree, False)}
    with tempfile.TemporaryDirectory(prefix="offloadd-onepass-") as d:
        cwd = Path(d)
        _config(cwd, block, verify=True)
        subprocess.run([sys.executable, "-m", "offloadd", "produce", "--config", "bench.toml",
                        "--topics", "2", "--bytes", str(args.mib * 1024 * 1024),
                        "--entry-size", str(args.entry_size)], cwd=cwd, check=True,
                       capture_output=True, timeout=1800)
        data_bytes = sum(f.stat().st_size for f in (cwd / "data" / "ledgers").glob("*.log"))
        pristine = cwd / "pristine"
        (cwd / "data").rename(pristine)
        samples: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
        for _ in range(args.repeats):
            for kind, (path, verify) in kinds.items():
                _fresh(cwd, pristine)
                with _tier(args.tier) as endpoint:
                    _config(cwd, block, verify, endpoint)
                    os.sync()
                    samples[kind].append(_child(cwd, path, args.poll_s))
    gib = data_bytes / GiB
    out: dict[str, object] = {}
    for kind, runs in samples.items():
        user = [r["user_s"] / gib for r in runs]
        loop = [r["loop_user_s"] / gib for r in runs]
        others = [(r["user_s"] - r["loop_user_s"]) / gib for r in runs]
        out[kind] = {
            "user_s_per_gib_min": round(min(user), 3),
            "user_s_per_gib_median": round(statistics.median(user), 3),
            "sys_s_per_gib_min": round(min(r["sys_s"] for r in runs) / gib, 3),
            "sys_s_per_gib_median": round(statistics.median(r["sys_s"] for r in runs) / gib, 3),
            # the event-loop thread alone, and every other thread (reads, checks, writes)
            "loop_user_s_per_gib_median": round(statistics.median(loop), 3),
            "others_user_s_per_gib_median": round(statistics.median(others), 3),
            "user_plus_sys_s_per_gib_median": round(
                statistics.median(r["user_s"] + r["sys_s"] for r in runs) / gib, 3),
            # each kind of thread's run time (exact, user and system together)
            "thread_cpu_s_per_gib_median": {
                name: round(statistics.median(r["threads"].get(name, {}).get("cpu_s", 0.0)
                                              for r in runs) / gib, 3)
                for name in sorted({n for r in runs for n in r["threads"]})},
            "mib_s_max": round(max(data_bytes / 2**20 / r["wall_s"] for r in runs), 1),
            "user_s_per_gib": [round(u, 3) for u in user],
            "loop_user_s_per_gib": [round(u, 3) for u in loop],
            "threads": [r["threads"] for r in runs],
        }
    before, after = samples["before"], samples["after"]
    out["after_over_before_user_min"] = round(
        min(r["user_s"] for r in after) / max(min(r["user_s"] for r in before), 1e-9), 3)
    out["after_over_before_user_median"] = round(
        statistics.median(r["user_s"] for r in after)
        / max(statistics.median(r["user_s"] for r in before), 1e-9), 3)
    print(json.dumps({"benchmark": "one_pass", "started": started, "baseline": baseline,
                      "after": after_tree,
                      "mib": args.mib, "poll_s": args.poll_s, "tier": args.tier,
                      "entry_size": args.entry_size, "block_mib": args.block_mib,
                      "bytes": data_bytes, "repeats": args.repeats,
                      "load_average": os.getloadavg(), "results": out}, indent=2))


if __name__ == "__main__":
    main()
