"""The sidecar over many small topics (issue 22, "Sidecar at scale"): the daemon, in-process with
``[source] kind = "bookkeeper"``, offloads every topic of a Pulsar-shaped cluster (real
ZooKeeper, three fake bookies), reads Pulsar's ZooKeeper at most once per topic per minute once
nothing changes (watches, not polling: counted, not timed), does not poll its idle topics (no
``ledgers()`` calls: the source's watches wake them), holds one or two connections per bookie,
and ``verify`` is clean afterwards.

CI runs 300 topics in 30 namespaces; ``OFFLOADD_SLOW_TESTS=1`` adds 2,000. Times and CPU are
measured by ``bench/sidecar_scale.py`` (5,000 topics).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from offloadd import config
from offloadd.commit.ownership import Ownership
from offloadd.model import Position, TopicName
from offloadd.read.verify import verify
from offloadd.shell.runtime import Runtime
from tests.bookkeeper.conftest import Cluster
from tests.bookkeeper.scale import (
    SCALE_CONFIG,
    ZkOps,
    count_ledgers_calls,
    populate,
    topic_names,
)
from tests.bookkeeper.test_e2e import dump_tasks

pytestmark = [pytest.mark.integration]

CONFIG = SCALE_CONFIG + """[daemon]
pid_file = "{tmp}/offloadd.pid"
shutdown_deadline_s = 20
"""

STEADY_S = 20.0  # the window over which ZooKeeper reads are counted once all is offloaded


def offloaded(rt: Runtime, ends: dict[TopicName, Position]) -> int:
    return sum(1 for t, r in rt.daemon.topics.items() if r.offloader.last_committed == ends[t])


async def offload_all_then_idle(cluster: Cluster, tmp_path: Path, n: int,
                                namespaces: int) -> None:
    topics = topic_names(n, namespaces)
    ends = await populate(cluster.pulsar, topics)
    await cluster.pulsar.close()  # the writer's bookie connections: only the daemon's remain
    cfg = tmp_path / "offloadd.toml"
    cfg.write_text(CONFIG.format(offloadd_url=cluster.offloadd_url, pulsar_url=cluster.pulsar_url,
                                 tier=tmp_path / "tier", tmp=tmp_path))
    rt = await Runtime.open(config.load(cfg), ownership=Ownership())
    ops = ZkOps()
    src = await ops.attach_runtime(rt)
    daemon = asyncio.ensure_future(rt.daemon.run(install_signals=False))
    try:
        try:
            async with asyncio.timeout(60 + n / 10):
                while offloaded(rt, ends) < n:
                    await asyncio.sleep(0.5)
        except TimeoutError:
            dump_tasks()
            raise AssertionError(f"{offloaded(rt, ends)} of {n} topics offloaded") from None
        # steady state: nothing changes in Pulsar; what does the daemon still read?
        await asyncio.sleep(2.0)  # the last topics' loops settle
        asked = count_ledgers_calls(src)
        ops.reset()
        await asyncio.sleep(STEADY_S)
        pulsar_reads = ops.reads_of("pulsar")
        assert pulsar_reads <= n * STEADY_S / 60, ops.snapshot()  # <= 1 per topic per minute
        # idle topics are not polled: the source's watches wake them (each topic's loop and
        # the lag loop asked every 1 s and 2 s: 1.5 calls per topic per second)
        assert asked[0] <= n / 10, asked
        per_bookie: dict[str, int] = {}
        for addr, _version in src.client._conns:
            per_bookie[addr] = per_bookie.get(addr, 0) + 1
        assert per_bookie and max(per_bookie.values()) <= 2, per_bookie
        assert offloaded(rt, ends) == n  # nothing regressed meanwhile
        rt.daemon.request_stop()
        await asyncio.wait_for(daemon, 60)
        report = await verify(rt.metadata, rt.blobstore, rt.view, topics, grace_s=0)
        assert report.ok, report.to_json()
        written = {str(t): len(cluster.pulsar.written[t]) for t in topics}
        assert {t.topic: t.entries for t in report.topics} == written
        assert all(t.source_checked == t.entries for t in report.topics)
    finally:
        rt.daemon.request_stop()
        await asyncio.gather(daemon, return_exceptions=True)
        await rt.close()


@pytest.mark.timeout(300)
async def test_sidecar_offloads_300_topics_and_reads_zookeeper_by_watches(
        cluster: Cluster, tmp_path: Path) -> None:
    await offload_all_then_idle(cluster, tmp_path, 300, 30)


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_sidecar_offloads_2000_topics(cluster: Cluster, tmp_path: Path) -> None:
    await offload_all_then_idle(cluster, tmp_path, 2000, 40)
