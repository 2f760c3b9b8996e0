"""Issue 5 on the real pipeline: the broker-wide throttle (PIP-211) and the byte counters.

One run, shared by the tests of this module: an ``offloadd produce`` subprocess writes 3 topics
at 10 MB/s each for 20 s into the embedded store; in this process a :class:`Daemon` composed by
``Runtime.open`` tails them across processes and uploads to a filesystem tier through
:class:`RecordingBlobStore`, with ``flow_permits_per_second = 4000000``. The writer is a separate
process so its CPU does not distort the daemon's loop (the machine has 2 shared cores).

Measurement
-----------
Samples are the data-object parts, timestamped when their bytes are handed to the store (when
the throttle let them go). The window is ``[first part + 1 s, writer exit)``: the first second is
discarded as warm-up (discovery finds the topics one pass apart, and the fresh bucket starts
empty), so the figure is the steady-state rate. The writer produces 30 MB/s against a 4 MB/s
budget, so every topic has a backlog for the whole window: the daemon always wants more than the
limit. After the writer exits, a reload lifts the limit (``Daemon.reload``) so the open segments
close at once, and the daemon stops gracefully; nothing after the window is measured.

Windows: a one-second window can hold at most ``limit + max(burst, one part)``: a part goes
to the store whole once its bytes are granted, and whatever the bucket saved while the loop was
stalled (up to ``burst``) is caught up at once. Hence two choices, both ordinary configuration:

* blocks of 256 KiB (1/16 of the limit); 1 MiB parts alone would put the bound at 1.26 x,
  above the issue's 1.25 x;
* ``burst_bytes = 1000000`` (a quarter second of permits) instead of the default second: on
  this shared 2-core machine the loop stalls for 100-250 ms now and then, and with the default
  burst the catch-up after such a stall showed windows of up to 1.23 x (five runs with 256-512
  KiB blocks: 1.06-1.23 x), against 1.06-1.10 x (three runs) with the quarter-second burst, at
  the same achieved rate (0.998-1.000 x).

The windows are asserted on the moments parts are handed to the store (what the throttle
controls); the moments they land add the store's own latency jitter and are only reported.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import uvloop

from offloadd import config as config_mod
from offloadd.commit.ownership import Ownership
from offloadd.metadata import managed_ledger
from offloadd.model import catalog
from offloadd.model.keys import parse_key, streaming_data_key
from offloadd.read.verify import verify
from offloadd.shell.produce import topic_names
from offloadd.shell.runtime import Runtime
from tests.throttle_e2e.recording import (
    RecordingBlobStore,
    Sample,
    in_window,
    max_window,
    rate,
    shares,
)

pytestmark = pytest.mark.integration

LIMIT = 4_000_000
TOPICS = 3
PER_TOPIC_RATE = 10_000_000
WRITE_SECONDS = 20
WARMUP_S = 1.0
BLOCK = 256 * 1024
ENTRY = 4096
TIMEOUT = 150

CONFIG = """\
[metadata]
url = "embedded:{root}/data/metadata"

[source]
path = "{root}/data/ledgers"

[blobstore]
path = "{root}/data/tier"
part_size_bytes = {block}

[offload]
flow_permits_per_second = {limit}
burst_bytes = {burst}
max_block_size_bytes = {block}
max_size_per_segment_mbytes = 8
max_segment_rollover_time_minutes = 10
buffer_max_bytes = {buffer}

[metrics]
enabled = false

[daemon]
pid_file = "{root}/data/offloadd.pid"
shutdown_deadline_s = 60
log_level = "WARNING"
"""


@dataclass
class Run:
    parts: list[Sample]  # (handed to the store, managed-ledger name, bytes)
    landed: list[Sample]  # (stored, managed-ledger name, bytes)
    window: tuple[float, float]
    produced: dict[str, Any]
    counters: dict[str, dict[str, float]] = field(default_factory=dict)  # ml name -> series
    tier_bytes: dict[str, int] = field(default_factory=dict)  # ml name -> data object bytes
    verified: dict[str, Any] = field(default_factory=dict)  # verify's report (JSON form)
    tier_data_objects: int = 0
    committed_segments: int = 0

    def measured(self) -> list[Sample]:
        return in_window(self.parts, *self.window)

    def describe(self) -> str:
        lo, hi = self.window
        return (f"window {hi - lo:.1f} s, {len(self.measured())} parts, rate "
                f"{rate(self.parts, lo, hi) / LIMIT:.4f} x limit, landed "
                f"{rate(self.landed, lo, hi) / LIMIT:.4f} x, max 1 s window "
                f"{max_window(self.measured()) / LIMIT:.3f} x (landed "
                f"{max_window(in_window(self.landed, lo, hi)) / LIMIT:.3f} x), shares "
                f"{shares(self.measured())}, writer {self.produced}")


async def _scenario(root: Path) -> Run:
    cfg = root / "offloadd.toml"
    cfg.write_text(CONFIG.format(root=root, limit=LIMIT, block=BLOCK, burst=LIMIT // 4,
                                 buffer=48 * 1024 * 1024))
    settings = config_mod.load(str(cfg))
    rt = await Runtime.open(settings, ownership=Ownership())
    recorder = RecordingBlobStore(rt.blobstore)
    rt.daemon.env.blobstore = recorder
    daemon = rt.daemon
    try:
        running = asyncio.create_task(daemon.run(install_signals=False))
        with (root / "produce.log").open("wb") as log:
            writer = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "offloadd", "produce", "--json", "--config", str(cfg),
                "--topics", str(TOPICS), "--rate", str(TOPICS * PER_TOPIC_RATE),
                "--duration", str(WRITE_SECONDS), "--entry-size", str(ENTRY),
                cwd=root, stdout=asyncio.subprocess.PIPE, stderr=log)
            try:
                out, _ = await asyncio.wait_for(writer.communicate(), WRITE_SECONDS + 40)
            except BaseException:
                writer.kill()
                await writer.wait()
                raise
        writer_done = time.monotonic()
        assert writer.returncode == 0, (root / "produce.log").read_text()[-2000:]
        produced = json.loads(out.decode().strip().splitlines()[-1])
        assert recorder.parts, "the daemon uploaded nothing while the writer ran"
        first = min(p.started for p in recorder.parts)

        # lift the limit so the open segments close at once, then stop
        unlimited = settings.model_copy(update={"offload": settings.offload.model_copy(
            update={"flow_permits_per_second": 0.0})})
        daemon.reload(unlimited)
        daemon.request_stop()
        await asyncio.wait_for(running, 90)

        run = Run(parts=[(p.started, p.topic, p.nbytes) for p in recorder.parts],
                  landed=[(p.landed, p.topic, p.nbytes) for p in recorder.parts],
                  window=(first + WARMUP_S, writer_done), produced=produced)
        await _reality(rt, run)
        return run
    finally:
        await rt.close()


async def _reality(rt: Runtime, run: Run) -> None:
    """What the metrics say, and what the tier and the metadata hold."""
    names = topic_names(TOPICS)
    for t in names:
        labels = {"namespace": t.ns, "topic": str(t)}
        run.counters[t.managed_ledger] = {
            series: rt.metrics.registry.get_sample_value(series, labels) or 0.0
            for series in ("offloadd_offloaded_bytes_total", "offloadd_offloaded_entries_total",
                           "offloadd_throttle_wait_seconds_total",
                           "brk_ledgeroffloader_ledger_offload_limited_total")
        }
        info, _ = await managed_ledger.load(rt.metadata, t.managed_ledger)
        size = 0
        for seg in catalog.segments(info):
            assert seg.complete, f"{t}: segment {seg.uid} left uncommitted after a clean stop"
            size += (await rt.blobstore.head(streaming_data_key(seg.uid))).size
            run.committed_segments += 1
        run.tier_bytes[t.managed_ledger] = size
    keys = [parse_key(o.key) async for o in rt.blobstore.list()]
    run.tier_data_objects = sum(1 for k in keys if k is not None and not k.is_index)
    report = await verify(rt.metadata, rt.blobstore, rt.view, names, grace_s=0.0)
    run.verified = report.to_json()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    root = tmp_path_factory.mktemp("throttle-e2e")
    return uvloop.run(_scenario(root))


@pytest.mark.timeout(TIMEOUT)
def test_the_writer_outpaces_the_limit_so_the_throttle_is_what_paces(run: Run) -> None:
    lo, hi = run.window
    assert hi - lo >= WRITE_SECONDS * 0.75, run.describe()
    assert run.produced["bytes"] >= 3 * LIMIT * WRITE_SECONDS, run.describe()


@pytest.mark.timeout(TIMEOUT)
def test_achieved_upload_rate_is_within_5_percent_of_the_limit(run: Run) -> None:
    achieved = rate(run.parts, *run.window)
    assert abs(achieved / LIMIT - 1) <= 0.05, run.describe()


@pytest.mark.timeout(TIMEOUT)
def test_no_one_second_window_carries_more_than_1_25_times_the_limit(run: Run) -> None:
    assert max_window(run.measured()) <= 1.25 * LIMIT, run.describe()


@pytest.mark.timeout(TIMEOUT)
def test_every_topic_gets_at_least_a_quarter_of_the_budget(run: Run) -> None:
    got = shares(run.measured())
    assert len(got) == TOPICS, run.describe()
    assert min(got.values()) >= 0.25, run.describe()


@pytest.mark.timeout(TIMEOUT)
def test_throttle_waits_are_reported_per_topic(run: Run) -> None:
    for name, c in run.counters.items():
        assert c["offloadd_throttle_wait_seconds_total"] > 0, (name, c)
        assert c["brk_ledgeroffloader_ledger_offload_limited_total"] > 0, (name, c)


@pytest.mark.timeout(TIMEOUT)
def test_byte_counters_equal_the_data_objects_stored_in_the_tier(run: Run) -> None:
    assert run.committed_segments >= TOPICS
    uploaded: dict[str, int] = {}
    for _, topic, n in run.parts:
        uploaded[topic] = uploaded.get(topic, 0) + n
    for name, c in run.counters.items():
        assert c["offloadd_offloaded_bytes_total"] == run.tier_bytes[name] > 0, (name, c)
        assert uploaded[name] == run.tier_bytes[name], name
    assert run.tier_data_objects == run.committed_segments


@pytest.mark.timeout(TIMEOUT)
def test_entry_counters_equal_what_verify_reads_back(run: Run) -> None:
    assert run.verified["ok"], run.verified
    by_ml = {t["topic"]: t for t in run.verified["topics"]}
    for t in topic_names(TOPICS):
        report = by_ml[str(t)]
        assert report["entries"] == report["source_checked"] > 0, report
        counted = run.counters[t.managed_ledger]["offloadd_offloaded_entries_total"]
        assert counted == report["entries"], (str(t), counted, report)
