"""A real ``offloadd run`` stopped (``SIGSTOP``) for longer than its bookie read timeout while it
tails live topics (issue 23 item 4): on ``SIGCONT`` every request timer that fell due fires at
once, before the answers that came meanwhile are read. That is a pause of our own, not a bookie
failure: no bookie may be quarantined and no failover counted, and offloading goes on.

The cluster is the usual one (real ZooKeeper, fake bookies in this process, which keep answering
while the daemon is stopped); the daemon's counters are read from its metrics endpoint.
"""

from __future__ import annotations

import asyncio
import random
import re
import socket
import urllib.request
from pathlib import Path

import pytest

from offloadd.model import TopicName
from tests.bookkeeper.conftest import open_cluster
from tests.bookkeeper.scale import SMALL_SEGMENTS
from tests.bookkeeper.test_soak import Daemon

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOPICS = [TopicName.parse(f"persistent://public/pause/t{i}") for i in range(2)]
READ_TIMEOUT_S = 1.0
STOPPED_S = 4.0  # four read timeouts

CONFIG = """
[metadata]
url = "{offloadd_url}"
session_timeout_s = 30
[source]
kind = "bookkeeper"
pulsar_zk = "{pulsar_url}"
topics = ["persistent://public/pause/*"]
read_timeout_s = {read_timeout}
bookie_connect_timeout_s = 1.0
bookie_quarantine_s = 30
""" + SMALL_SEGMENTS + """[metrics]
bind = "127.0.0.1:{port}"
[daemon]
pid_file = "{root}/offloadd.pid"
shutdown_deadline_s = 15
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[str, float]:
    """The daemon's ``offloadd_bookkeeper_*`` series, summed over their labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"(offloadd_bookkeeper_\w+?)(?:\{[^}]*\})? (\S+)$", line)
        if m:
            out[m[1]] = out.get(m[1], 0.0) + float(m[2])
    return out


async def test_a_stopped_daemon_blames_no_bookie(zk_server: str, tmp_path: Path) -> None:
    async with open_cluster(zk_server, bookies=3) as cluster:
        p = cluster.pulsar
        rnd = random.Random(23)
        port = free_port()
        config = tmp_path / "offloadd.toml"
        config.write_text(CONFIG.format(
            offloadd_url=cluster.offloadd_url, pulsar_url=cluster.pulsar_url,
            tier=tmp_path / "tier", root=tmp_path, port=port, read_timeout=READ_TIMEOUT_S))
        stop = asyncio.Event()

        async def broker(t: TopicName) -> None:
            while not stop.is_set():
                await p.append(t, [rnd.randbytes(rnd.randint(100, 2000))
                                   for _ in range(rnd.randint(1, 8))])
                await asyncio.sleep(0.02)

        for t in TOPICS:
            await p.append(t, [b"x" * 500] * 50)
        daemon = Daemon(config, tmp_path)
        await daemon.start()
        brokers = [asyncio.ensure_future(broker(t)) for t in TOPICS]
        try:
            await asyncio.sleep(2.0)  # reading and long-polling the live tails
            before = await asyncio.to_thread(scrape, port)
            assert before.get("offloadd_bookkeeper_entries_read_total", 0) > 0, before
            for b in cluster.bookies:  # answers take a while: reads are in flight at the stop
                b.latency_s = 0.3
            await asyncio.sleep(1.0)
            daemon.pause()
            await asyncio.sleep(STOPPED_S)  # the bookies answer meanwhile; nobody reads
            daemon.resume()
            await asyncio.sleep(3.0)
            after = await asyncio.to_thread(scrape, port)
            # a loaded machine may take longer to run the daemon's next turns after SIGCONT
            for _ in range(30):
                if after.get("offloadd_bookkeeper_pauses_total", 0) >= 1:
                    break
                await asyncio.sleep(1.0)
                after = await asyncio.to_thread(scrape, port)
        finally:
            stop.set()
            await asyncio.gather(*brokers, return_exceptions=True)
            if daemon.alive():
                daemon.resume()
                await daemon.stop()
        log = daemon.text()
        assert "quarantined" not in log, log[-3000:]
        assert after.get("offloadd_bookkeeper_quarantines_total", 0) == 0, after
        assert after.get("offloadd_bookkeeper_read_failovers_total", 0) == 0, after
        assert after.get("offloadd_bookkeeper_pauses_total", 0) >= 1, after
        assert "did not run for" in log
        # and it went on reading after the pause
        assert after["offloadd_bookkeeper_entries_read_total"] > \
            before["offloadd_bookkeeper_entries_read_total"]
