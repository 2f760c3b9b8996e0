"""Closing every topic's open segment at once, and stopping, with many topics in one daemon.

What a user does (issue 22): ``offloadd produce --topics N --bytes N*20KB``, then ``offloadd
run`` on the embedded default with a filesystem tier and segments that never roll by themselves;
once every topic has an open segment holding all it has, ``offloadd offload-now --wait`` closes
and commits them all: its wall time gives segment commits per second (each segment: ASSIGN,
seal = complete the data object and write the index, OFFLOADED). Then as much again is produced
with the daemon running, and once every topic has a segment open again the daemon gets SIGTERM:
the time to exit, and how many of those segments it committed on the way out.

    .venv/bin/python bench/offload_now_scale.py [--topics 1000] [--bytes-per-topic 20000]

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OFFLOADD = [sys.executable, "-m", "offloadd"]
# bytecode cached as in an installed offloadd
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

CONFIG = """
[source]
rollover_minutes = 600
[offload]
max_segment_rollover_time_minutes = 600
[blobstore]
path = "data/tier"
[metrics]
bind = "127.0.0.1:{port}"
[daemon]
log_level = "WARNING"
[retention]
orphan_grace_s = 72000
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _produce(cwd: Path, cfg: Path, topics: int, nbytes: int) -> None:
    # produce writes the topics in turn, one batch each of at most 1/20 of the rate: this rate
    # makes a batch one topic's share, so that every topic gets some
    per_topic = nbytes // topics
    subprocess.run([*OFFLOADD, "produce", "--json", "--config", str(cfg), "--topics", str(topics),
                    "--bytes", str(nbytes), "--rate", str(per_topic * 20)], cwd=cwd, check=True,
                   capture_output=True, timeout=1800)


def _status(port: int) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=30) as resp:
            doc: dict[str, Any] = json.loads(resp.read())
            return doc
    except (OSError, ValueError):
        return None


RSS_LIMIT = 6 << 30


def _rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _wait_open(port: int, topics: int, timeout: float, proc: subprocess.Popen[bytes]) -> float:
    """Until every topic has an open segment and what they hold stopped growing (read all)."""
    t0 = time.monotonic()
    last = -1
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"offloadd run exited {proc.returncode}")
        if _rss(proc.pid) > RSS_LIMIT:  # a shared machine: do not wake the OOM killer
            proc.kill()
            raise SystemExit(f"offloadd run over {RSS_LIMIT >> 30} GiB RSS: killed")
        st = _status(port)
        if st is not None:
            ts = st.get("topics") or {}
            held = [t.get("open_segment_bytes") or 0 for t in ts.values()]
            if len(ts) >= topics and all(held) and sum(held) == last:
                return time.monotonic() - t0
            last = sum(held)
        time.sleep(2.0)
    raise SystemExit(f"not every topic had an open segment after {timeout}s")


def run(topics: int, per_topic: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="offload-now-scale-") as tmp:
        cwd = Path(tmp)
        port = _free_port()
        cfg = cwd / "offloadd.toml"
        cfg.write_text(CONFIG.format(port=port))
        _produce(cwd, cfg, topics, topics * per_topic)
        log = open(cwd / "run.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen([*OFFLOADD, "run", "--config", str(cfg)], cwd=cwd,
                                stdout=subprocess.DEVNULL, stderr=log)
        try:
            ready_s = _wait_open(port, topics, 600, proc)
            rss = _rss(proc.pid)
            # what `offloadd offload-now --wait` sends, timed from the request to the answer
            # (not the command's own start-up)
            body = json.dumps({"topics": None, "wait": True, "timeout_s": 600}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{port}/offload-now", data=body,
                                         method="POST",
                                         headers={"Content-Type": "application/json"})
            t0 = time.monotonic()
            with urllib.request.urlopen(req, timeout=900) as resp:
                doc = json.loads(resp.read())
            close_s = time.monotonic() - t0
            results = doc.get("results", []) if isinstance(doc, dict) else []
            committed = sum(1 for r in results if r.get("result") == "committed")
            # again, then stop with every topic's segment open
            _produce(cwd, cfg, topics, topics * per_topic)
            _wait_open(port, topics, 600, proc)
            st = _status(port) or {}
            before = {t: v.get("last_committed") for t, v in (st.get("topics") or {}).items()}
            t1 = time.monotonic()
            os.kill(proc.pid, signal.SIGTERM)
            rc = proc.wait(300)
            stop_s = time.monotonic() - t1
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            log.close()
        after = _committed(cwd)
        closed_on_stop = sum(1 for t, last in before.items() if after.get(t) != last)
        return {"topics": topics, "bytes_per_topic": per_topic,
                "topics_with_open_segments": len(before),
                "segments_open_after_s": round(ready_s, 1), "rss_mib": rss >> 20,
                "offload_now_s": round(close_s, 2), "offload_now_committed": committed,
                "commits_per_s": round(committed / close_s) if close_s else None,
                "stop_s": round(stop_s, 2), "stop_exit_code": rc,
                "segments_closed_on_stop": closed_on_stop}


def _committed(cwd: Path) -> dict[str, str | None]:
    """Each topic's last committed position, from the metadata (after the daemon is gone)."""
    import asyncio

    sys.path.insert(0, str(ROOT))
    from offloadd.metadata import managed_ledger
    from offloadd.metadata.embedded import EmbeddedMetadataStore
    from offloadd.model import TopicName, catalog

    async def go() -> dict[str, str | None]:
        md = await EmbeddedMetadataStore.open(cwd / "data" / "metadata", read_only=True)
        try:
            out: dict[str, str | None] = {}
            for name in await managed_ledger.list_names(md):
                info, _ = await managed_ledger.load(md, name)
                done = [s for s in catalog.segments(info) if s.complete]
                out[str(TopicName.from_managed_ledger(name))] = \
                    str(done[-1].end) if done else None
            return out
        finally:
            await md.close()

    return asyncio.run(go())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topics", type=int, default=1000)
    p.add_argument("--bytes-per-topic", type=int, default=20_000)
    args = p.parse_args()
    out = run(args.topics, args.bytes_per_topic)
    print(json.dumps({"bench": "offload_now_scale", **out}, indent=2))


if __name__ == "__main__":
    main()
