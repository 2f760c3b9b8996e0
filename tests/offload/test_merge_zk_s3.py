"""``offloadd compact`` on ZooKeeper + moto's S3 (the production shape; the crash rounds run on
the embedded store in ``test_merge_crash.py``): history offloaded by the topic task into small
segments, one real ``compact`` killed with SIGKILL once its first multipart upload is open, a
second one (after the dead session's ownership expired) finishes; every entry reads back,
``verify`` passes, ``gc`` leaves no orphan and no stale upload; the data object's complete and
the index PUT carried ``If-None-Match`` (moto refuses overwrites on both, the probe found)."""

from __future__ import annotations

import asyncio
import json
import math
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from offloadd import config, wiring
from offloadd.blobstore.base import PROBE_KEY_PREFIX
from offloadd.commit.fence import NoFence
from offloadd.ledger.local import LocalLedgerStore, RolloverPolicy
from offloadd.metadata import managed_ledger
from offloadd.model import Position, TopicName, catalog
from offloadd.offload.buffer import OffloadBuffer
from offloadd.offload.roller import RollPolicy
from offloadd.offload.topic import OffloadEnv, TopicOffloader, TopicPolicy
from offloadd.read.reader import TierReader
from offloadd.retry import Backoff
from tests.fixtures.s3 import MotoBucket, moto_server, s3_bucket
from tests.fixtures.zookeeper import zk_server
from tests.s3e2e.helpers import run, s3_config

__all__ = ["moto_server", "s3_bucket", "zk_server"]

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TOPIC = TopicName.parse("persistent://public/default/merged")
KiB = 1024
ENTRY = KiB


async def offload_history(settings: config.Settings, ledgers: Path, n: int,
                          per_segment: int) -> list[tuple[tuple[int, int], bytes]]:
    md = await wiring.open_metadata(settings)
    tier = await wiring.open_tier(settings)
    store = LocalLedgerStore(ledgers, md, RolloverPolicy(max_entries=45))
    written: list[tuple[tuple[int, int], bytes]] = []
    try:
        for i in range(n):
            p = (f"{i:08d}".encode() * (ENTRY // 8 + 1))[:ENTRY]
            pos = await store.writer.append(TOPIC, [p])
            written.append((pos, p))
        env = OffloadEnv(source=store.source, metadata=md, blobstore=tier.store,
                         buffer=OffloadBuffer(8 << 20), retry=Backoff(0.01, 0.05),
                         idle_poll_s=0.05)
        roll = RollPolicy(per_segment * (ENTRY + 12), 600, 4 * KiB)
        off = TopicOffloader(TOPIC, env, lambda: TopicPolicy(roll), NoFence())
        task = asyncio.create_task(off.run())
        last = Position(*written[-1][0])
        try:
            async with asyncio.timeout(120):
                while off.position is None or off.position <= last:
                    await asyncio.sleep(0.05)
                while True:
                    info, _ = await managed_ledger.load(md, TOPIC.managed_ledger)
                    if sum(s.entries for s in catalog.segments(info) if s.complete) == n:
                        break
                    off.trigger()
                    await asyncio.sleep(0.1)
        finally:
            off.request_stop()
            await asyncio.wait_for(task, 30)
    finally:
        await store.close()
        await tier.store.close()
        await md.close()
    return written


async def read_all(settings: config.Settings) -> tuple[list[tuple[tuple[int, int], bytes]],
                                                       int]:
    md = await wiring.open_metadata(settings)
    tier = await wiring.open_tier(settings)
    try:
        reader = TierReader(md, tier.store)
        got = [((e.position.ledger_id, e.position.entry_id), bytes(e.payload))
               async for e in reader.read(TOPIC)]
        return got, len(await reader.segments(TOPIC))
    finally:
        await tier.store.close()
        await md.close()


def start_compact(cfg: Path, cwd: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "offloadd", "compact", "--json", "--config",
                             str(cfg)],
                            cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def test_compact_on_zookeeper_and_s3_survives_a_kill(
        tmp_path: Path, zk_server: str, s3_bucket: MotoBucket) -> None:
    chroot = f"/a10-merge-{uuid.uuid4().hex[:8]}"
    body = f"""
[metadata]
url = "zk://{zk_server}{chroot}"
session_timeout_s = 2.0
[source]
path = "{tmp_path / 'ledgers'}"
[offload]
deletion_lag_ms = 0
flow_permits_per_second = 131072
min_block_size_bytes = 0
[compact]
target_mbytes = 0.0625
[retention]
orphan_grace_s = 36000
"""
    # parts far below the merge target: the killed merge has a multipart upload open
    cfg = s3_config(tmp_path, s3_bucket.endpoint, s3_bucket.name, body,
                    blobstore="part_size_bytes = 16384")
    settings = config.load(cfg)
    written = await offload_history(settings, tmp_path / "ledgers", 240, 10)
    _, before = await read_all(settings)
    assert before >= 23

    s3 = s3_bucket.boto3()

    def merging() -> bool:  # a merge's multipart upload is open (not the start-up probe's)
        ups = s3.list_multipart_uploads(Bucket=s3_bucket.name).get("Uploads") or ()
        return any(not u["Key"].startswith(PROBE_KEY_PREFIX) for u in ups)

    proc = start_compact(cfg, tmp_path)
    deadline = time.monotonic() + 60
    while not merging():
        assert proc.poll() is None and time.monotonic() < deadline, "no merge upload started"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)  # a merge's data object is half uploaded
    proc.wait(30)

    # the dead process's ZooKeeper session holds the topic until it expires (2 s)
    deadline = time.monotonic() + 30
    while True:
        done = run(["compact", "--json", "--config", str(cfg)], tmp_path, check=False, timeout=60)
        if done.returncode == 0 or time.monotonic() > deadline:
            break
        assert "owned by" in done.stdout, done.stdout + done.stderr
        time.sleep(0.5)
    assert done.returncode == 0, done.stdout + done.stderr
    total = sum(o["Size"] for o in s3.list_objects_v2(Bucket=s3_bucket.name)["Contents"])
    got, after = await read_all(settings)
    assert got == written  # nothing lost, nothing twice
    assert after <= math.ceil(total / (64 * KiB)) + 1 and after < before
    # the killed merge's multipart upload, if the kill came after it began (on a loaded
    # machine it may come before): gc sweeps whatever is left, and leaves none
    left = len(s3.list_multipart_uploads(Bucket=s3_bucket.name).get("Uploads", []))
    gc = json.loads(run(["gc", "--config", str(cfg), "--json", "--grace", "0"],
                        tmp_path).stdout)
    assert gc["ok"] and gc["deleted_segments"], gc
    assert gc["uploads_swept"] == left, (gc, left)
    assert not s3.list_multipart_uploads(Bucket=s3_bucket.name).get("Uploads")
    ver = json.loads(run(["verify", "--config", str(cfg), "--json"], tmp_path).stdout)
    assert ver["ok"] and ver["orphans"] == [], ver
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=s3_bucket.name)["Contents"]}
    got, _ = await read_all(settings)
    assert got == written
    md = await wiring.open_metadata(settings)
    try:
        info, _ = await managed_ledger.load(md, TOPIC.managed_ledger)
    finally:
        await md.close()
    assert keys == {k for s in catalog.segments(info) for k in (str(s.uid), f"{s.uid}-index")}
    assert not s3.list_multipart_uploads(Bucket=s3_bucket.name).get("Uploads")
