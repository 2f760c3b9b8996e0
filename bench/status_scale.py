"""``offloadd status`` at many topics: wall time of the command on a synthetic catalog.

The catalog (:func:`synthetic_catalog`, also used by tests/shell/test_status_scale.py): topics
spread over ``namespaces`` namespaces, each with one closed ledger of 100 entries and an owner's
epoch; most fully offloaded in one committed segment, every 7th only half (lag), every 50th with a
failing status record. Written straight into an embedded store (one transaction), no daemon.
The command is run as a user runs it (``offloadd status --config ...``, a new process), in text
(the summary view) and with ``--json``.

    .venv/bin/python bench/status_scale.py [--topics 10000] [--namespaces 10] [--before DIR]

``--before DIR``: also run the command of the tree at ``DIR`` (``PYTHONPATH=DIR``) on the same
catalog, each run alternating with this tree's, so both see the same load (``before`` beside
the usual keys).

Prints one JSON document.
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
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from offloadd._proto import mldataformats_pb2 as pb  # noqa: E402
from offloadd.commit.epochs import TopicState  # noqa: E402
from offloadd.metadata.base import CreateOp  # noqa: E402
from offloadd.metadata.embedded import EmbeddedMetadataStore  # noqa: E402
from offloadd.metadata.offload_status import OffloadStatus  # noqa: E402
from offloadd.model import TopicName, catalog  # noqa: E402
from offloadd.model.catalog import LedgerRange  # noqa: E402
from offloadd.model.keys import (  # noqa: E402
    managed_ledger_path,
    offload_status_path,
    topic_state_path,
)

ENTRIES = 100
ENTRY_BYTES = 1000
FAILING_EVERY = 50
HALF_EVERY = 7


def topic_name(i: int, namespaces: int) -> TopicName:
    return TopicName.parse(f"persistent://tenant-{i % 2}/ns-{i % namespaces}/t-{i}")


def _ml_bytes(i: int, now_ms: int) -> bytes:
    info = pb.ManagedLedgerInfo()
    li = info.ledgerInfo.add()
    li.ledgerId, li.entries, li.size, li.timestamp = 1, ENTRIES, ENTRIES * ENTRY_BYTES, now_ms
    last = ENTRIES // 2 - 1 if i % HALF_EVERY == 0 else ENTRIES - 1
    uid = uuid.UUID(int=i + 1)
    catalog.add_assigned(info, uid, [LedgerRange(1, 0, last)], now_ms,
                         catalog.driver_metadata("filesystem", {}))
    catalog.mark_offloaded(info, uid, now_ms, [1])
    return info.SerializeToString()


async def synthetic_catalog(path: Path, topics: int, namespaces: int = 10) -> list[TopicName]:
    """Write the catalog into the embedded store under ``path``; the topics' names."""
    now_ms = int(time.time() * 1000)
    names = [topic_name(i, namespaces) for i in range(topics)]
    md = await EmbeddedMetadataStore.open(path)
    try:
        ops: list[CreateOp] = []
        parents: set[str] = set()
        for i, t in enumerate(names):
            ml = t.managed_ledger
            for p in (managed_ledger_path(ml), topic_state_path(ml), offload_status_path(ml)):
                parent = p.rsplit("/", 1)[0]
                while parent and parent not in parents:
                    parents.add(parent)
                    parent = parent.rsplit("/", 1)[0]
            rec = OffloadStatus(state="failing", owner="bench", failed_attempts=3,
                                failing_since_ms=now_ms, last_error=f"boom {i}") \
                if i % FAILING_EVERY == 0 else \
                OffloadStatus(state="ok", owner="bench", last_success_ms=now_ms)
            ops += [CreateOp(managed_ledger_path(ml), _ml_bytes(i, now_ms)),
                    CreateOp(topic_state_path(ml), TopicState(1, "bench", 0).encode()),
                    CreateOp(offload_status_path(ml), rec.encode())]
        parent_ops = [CreateOp(p, b"") for p in sorted(parents, key=lambda p: p.count("/"))]
        await md.multi([*parent_ops, *ops])
    finally:
        await md.close()
    return names


CONFIG = """
[metadata]
url = "embedded:{root}/metadata"
[source]
path = "{root}/ledgers"
[blobstore]
path = "{root}/tier"
[metrics]
enabled = false
"""


# bytecode cached as in an installed offloadd (the first run writes it)
_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _timed(args: list[str], cwd: Path, tree: Path | None = None
           ) -> tuple[float, float, int, int]:
    """Wall seconds, CPU seconds (user + system) of the command, its exit code, stdout size;
    ``tree``: the offloadd of that directory instead of this one."""
    env = _ENV if tree is None else {**_ENV, "PYTHONPATH": str(tree.resolve())}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "offloadd", "status", *args],
                         capture_output=True, text=True, timeout=900, env=env, cwd=cwd)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu, res.returncode, len(res.stdout)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topics", type=int, default=10_000)
    p.add_argument("--namespaces", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--before", type=Path, default=None,
                   help="a tree whose command runs beside this one's, alternating")
    args = p.parse_args()
    out: dict[str, Any] = {"bench": "status_scale", "topics": args.topics,
                           "namespaces": args.namespaces, "loadavg_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="status-scale-") as tmp:
        root = Path(tmp)
        asyncio.run(synthetic_catalog(root / "metadata", args.topics, args.namespaces))
        cfg = root / "offloadd.toml"
        cfg.write_text(CONFIG.format(root=root))
        one = str(topic_name(1, args.namespaces))
        trees: list[Path | None] = [None] if args.before is None else [None, args.before]
        for tree in trees:  # warm-up: writes the bytecode
            _timed(["--config", str(cfg), "--topic", one], root, tree)
        if args.before is not None:
            out["before"] = {"tree": str(args.before)}
        for label, extra in (("summary_text", []), ("json", ["--json"]),
                             ("namespace", ["--namespace", "tenant-1/ns-1"]),
                             ("one_topic", ["--topic", one])):
            runs: dict[Path | None, list[tuple[float, float, int, int]]] = {t: [] for t in trees}
            for _ in range(args.repeats):
                for tree in reversed(trees):
                    runs[tree].append(_timed(["--config", str(cfg), *extra], root, tree))
            for tree, rs in runs.items():
                (out if tree is None else out["before"])[label] = {
                    "seconds": [round(r[0], 2) for r in rs],
                    "cpu_seconds": [round(r[1], 2) for r in rs], "exit_code": rs[0][2],
                    "stdout_bytes": rs[0][3]}
    out["loadavg_after"] = os.getloadavg()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
