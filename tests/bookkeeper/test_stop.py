"""A sidecar ``offloadd run`` told to stop (SIGTERM) while ZooKeeper does not answer (issue 22,
"Sidecar at scale": a stop not finished after 40 s was killed): it exits within its documented
bound, ``[daemon] shutdown_deadline_s`` (plus the closing of its sessions and the interpreter's
exit), and what it had committed before stays committed and readable. ZooKeeper is frozen with
``SIGSTOP`` (a server that hangs, connections still open), on a server of this test's own."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from offloadd.blobstore.filesystem.store import FilesystemBlobStore
from offloadd.errors import NotFound
from offloadd.metadata import managed_ledger
from offloadd.metadata.zookeeper import ZooKeeperMetadataStore
from offloadd.model import Position, TopicName, catalog
from offloadd.read.reader import TierReader
from tests.bookkeeper.conftest import open_cluster
from tests.bookkeeper.scale import SCALE_CONFIG, populate, topic_names
from tests.fixtures.zookeeper import ZooKeeperServer
from tests.ops.support import DaemonProcess

pytestmark = [pytest.mark.integration]

DEADLINE_S = 8.0
# the daemon's exit after its deadline: its sessions' close (bounded by their timeouts) and
# the interpreter's end, on a loaded machine
MARGIN_S = 25.0
CONFIG = SCALE_CONFIG + f"""[daemon]
pid_file = "{{tmp}}/offloadd.pid"
log_format = "json"
log_level = "INFO"
shutdown_deadline_s = {DEADLINE_S}
"""


async def committed_end(md: ZooKeeperMetadataStore, topic: TopicName) -> Position | None:
    try:
        info, _ = await managed_ledger.load(md, topic.managed_ledger)
    except NotFound:  # not mirrored yet
        return None
    segs = [s for s in catalog.segments(info) if s.complete]
    return segs[-1].end if segs else None


@pytest.mark.timeout(240)
async def test_sigterm_while_zookeeper_is_frozen_exits_within_the_deadline(
        tmp_path: Path) -> None:
    server = ZooKeeperServer(tmp_path / "zk")
    server.start()
    proc: DaemonProcess | None = None
    frozen = False
    try:
        await asyncio.to_thread(server.wait_serving)
        async with open_cluster(server.address) as cluster:
            topics = topic_names(20, namespaces=2)
            ends = await populate(cluster.pulsar, topics)
            cfg = tmp_path / "offloadd.toml"
            cfg.write_text(CONFIG.format(offloadd_url=cluster.offloadd_url,
                                         pulsar_url=cluster.pulsar_url, tier=tmp_path / "tier",
                                         tmp=tmp_path))
            proc = DaemonProcess(tmp_path, cfg)
            async with asyncio.timeout(120):
                for t in topics:
                    while await committed_end(cluster.ours, t) != ends[t]:
                        assert proc.proc.poll() is None, proc.log_path.read_text()
                        await asyncio.sleep(0.2)
            # more entries for a few topics: their open segments are what the stop closes,
            # with every commit of them waiting on the frozen server
            live = topics[:4]
            for t in live:
                await cluster.pulsar.append(t, [b"after" * 20] * 3)
            await asyncio.sleep(0.5)

            assert server.process is not None
            os.kill(server.process.pid, signal.SIGSTOP)
            frozen = True
            t0 = time.monotonic()
            proc.signal(signal.SIGTERM)
            code = await asyncio.to_thread(proc.proc.wait, DEADLINE_S + MARGIN_S)
            took = time.monotonic() - t0
            os.kill(server.process.pid, signal.SIGCONT)
            frozen = False
            assert code == 0, proc.log_path.read_text()
            assert proc.logged("stopping: no new entries")
            print(f"stopped in {took:.1f}s with ZooKeeper frozen")

            # committed before the stop: still committed, and read back whole from the tier
            # (a new session: the freeze outlasted this process's sessions too)
            md = await ZooKeeperMetadataStore.open(cluster.offloadd_url, session_timeout_s=4.0,
                                                   connect_timeout_s=10.0)
            try:
                reader = TierReader(md, FilesystemBlobStore(tmp_path / "tier"))
                for t in topics:
                    end = await committed_end(md, t)
                    assert end is not None and end >= ends[t], t
                    written = [(p, b) for p, b in cluster.pulsar.written[t] if p <= end]
                    got = [(e.position, bytes(e.payload)) async for e in reader.read(t)]
                    assert got == written, t
            finally:
                await md.close()
    finally:
        if frozen and server.process is not None:
            os.kill(server.process.pid, signal.SIGCONT)
        if proc is not None:
            proc.close()
        server.stop()
