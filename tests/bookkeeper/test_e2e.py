"""End to end in sidecar mode: the daemon, run in-process with ``[source] kind = "bookkeeper"``,
offloads three topics of a Pulsar-shaped cluster (real ZooKeeper, three fake bookies, ensemble 3,
write quorum 2), two of them live, through a bookie crash and a ZooKeeper session loss; then
``verify`` is clean and every payload reads back from the tier exactly as it was written.
"""

from __future__ import annotations

import asyncio
import io
import logging
import random
import sys
from pathlib import Path

import pytest

from offloadd import config
from offloadd.commit.ownership import Ownership
from offloadd.metadata import managed_ledger
from offloadd.model import Position, TopicName, catalog
from offloadd.read.reader import TierReader
from offloadd.read.verify import verify
from offloadd.shell.runtime import Runtime
from offloadd.shell.status import render_text
from tests.bookkeeper.conftest import Cluster
from tests.bookkeeper.test_source import expire_session

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

STATIC = TopicName.parse("persistent://public/default/history")
LIVE = [TopicName.parse(f"persistent://public/default/live-{i}") for i in range(2)]
OTHER = TopicName.parse("persistent://private/ns/not-ours")

CONFIG = """
[metadata]
url = "{offloadd_url}"
session_timeout_s = 4
[source]
kind = "bookkeeper"
pulsar_zk = "{pulsar_url}"
topics = ["persistent://public/default/*"]
read_timeout_s = 1.0
bookie_connect_timeout_s = 1.0
reads_in_flight = 16
readahead_bytes = 65536
[blobstore]
driver = "filesystem"
path = "{tier}"
[offload]
max_size_per_segment_mbytes = 0.1
max_segment_rollover_time_minutes = 0.02
max_block_size_bytes = 16384
buffer_max_bytes = 1048576
retry_base_s = 0.2
retry_max_s = 1.0
[metrics]
enabled = false
[daemon]
pid_file = "{tmp}/offloadd.pid"
shutdown_deadline_s = 10
"""


def batch(rnd: random.Random, n: int) -> list[bytes]:
    return [rnd.randbytes(rnd.randint(1, 900)) for _ in range(n)]


async def write_live(cluster: Cluster, topic: TopicName, stop: asyncio.Event,
                     seed: int) -> None:
    """A broker writing a topic: batches of entries, a new ledger every few batches."""
    rnd = random.Random(seed)
    n = 0
    while not stop.is_set():
        await cluster.pulsar.append(topic, batch(rnd, rnd.randint(1, 20)))
        n += 1
        if n % 6 == 0:
            await cluster.pulsar.roll(topic)
        await asyncio.sleep(0.05)
    await cluster.pulsar.close_ledger(topic)


def dump_tasks() -> None:
    out = io.StringIO()
    for task in asyncio.all_tasks():
        task.print_stack(limit=12, file=out)
    print(out.getvalue(), file=sys.stderr)


async def offloaded_to_the_end(cluster: Cluster, topic: TopicName) -> bool:
    written = cluster.pulsar.written[topic]
    info, _ = await managed_ledger.load(cluster.ours, topic.managed_ledger)
    segs = catalog.segments(info)
    return bool(segs) and all(s.complete for s in segs) and segs[-1].end == written[-1][0]


@pytest.mark.timeout(150)
async def test_sidecar_offloads_three_topics_two_live_through_faults(
        cluster: Cluster, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    p = cluster.pulsar
    p.ack_quorum = 1  # the writers go on while a bookie is down, as BookKeeper would with aq=1
    rnd = random.Random(7)
    for _ in range(3):
        await p.append(STATIC, batch(rnd, 150))
        await p.roll(STATIC)
    await p.append(STATIC, batch(rnd, 40))
    await p.close_ledger(STATIC)
    await p.append(OTHER, batch(rnd, 5))
    cfg = tmp_path / "offloadd.toml"
    cfg.write_text(CONFIG.format(offloadd_url=cluster.offloadd_url,
                                 pulsar_url=cluster.pulsar_url, tier=tmp_path / "tier",
                                 tmp=tmp_path))
    settings = config.load(cfg)
    rt = await Runtime.open(settings, ownership=Ownership())
    stop_writers = asyncio.Event()
    writers = [asyncio.ensure_future(write_live(cluster, t, stop_writers, i))
               for i, t in enumerate(LIVE)]
    daemon = asyncio.ensure_future(rt.daemon.run(install_signals=False))
    try:
        with caplog.at_level(logging.WARNING):
            await asyncio.sleep(2.5)
            await cluster.bookies[2].kill()  # mid-run: reads fail over, writes go on (aq=1)
            await asyncio.sleep(1.5)
            await expire_session(cluster.hosts, rt.source)  # type: ignore[arg-type]
            await asyncio.sleep(2.5)
            stop_writers.set()
            await asyncio.gather(*writers)
            try:
                async with asyncio.timeout(90):
                    for t in (STATIC, *LIVE):
                        while not await offloaded_to_the_end(cluster, t):
                            await asyncio.sleep(0.25)
            except TimeoutError:
                dump_tasks()  # where the daemon is stuck, for whoever reads the failure
                raise
        # status says how each bookie is read: v2; these ledgers are striped (ensemble 3,
        # write quorum 2: runs of two entries, which batching would not serve), so no bookie
        # was asked whether it has batched reads (the probe costs an old one an ERROR)
        live = rt.daemon.status()
        rows = live["source"]["bookies"]
        for b in cluster.bookies:
            assert rows[b.address] == {"reads": "v2", "tail": "v3", "batched_reads": "unknown"}
        assert sum(b.served["batch_asked"] for b in cluster.bookies) == 0
        assert sum(b.served["error_log"] for b in cluster.bookies) == 0  # long polls too
        text = render_text({"metadata": "m", "driver": "filesystem", "topics": [],
                            "daemon": live})
        assert f"{cluster.bookies[0].address} v2" in text
        assert f"{cluster.bookies[0].address} v2 batched" not in text
        rt.daemon.request_stop()
        await asyncio.wait_for(daemon, 30)
        metrics = rt.source.metrics  # type: ignore[attr-defined]
        dead = cluster.bookies[2].address
        # the dead bookie was noticed: a failed read or LAC query put it in quarantine
        assert dead in {b for b, _ in metrics.quarantines}, metrics.snapshot()
        assert sum(metrics.entries.values()) >= sum(len(p.written[t]) for t in (STATIC, *LIVE))
        assert not await cluster.ours.exists(f"/managed-ledgers/{OTHER.managed_ledger}")

        report = await verify(rt.metadata, rt.blobstore, rt.view, [STATIC, *LIVE], grace_s=0)
        assert report.ok, report.to_json()
        for checked in report.topics:
            # every payload's CRC32C against bookies
            assert checked.entries == checked.source_checked > 0
        reader = TierReader(rt.metadata, rt.blobstore)
        for t in (STATIC, *LIVE):
            want = p.written[t]
            assert len({pos.ledger_id for pos, _ in want}) >= 3
            got = [(e.position, bytes(e.payload)) async for e in reader.read(t)]
            assert got == want, f"{t}: {len(got)} entries read back, {len(want)} written"
            assert got[0][0] == Position(want[0][0].ledger_id, 0)
        assert "NoAuth" not in caplog.text and "not authorized" not in caplog.text
    finally:
        stop_writers.set()
        for w in writers:
            w.cancel()
        rt.daemon.request_stop()
        await asyncio.gather(daemon, *writers, return_exceptions=True)
        await rt.close()
