"""The backfill against the production kinds of store: ZooKeeper for metadata, an HTTP S3
server (moto) for the tier — Spark tasks upload through the project's own S3 driver."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from offloadd import config, wiring
from offloadd.backfill.job import run_backfill
from offloadd.ledger.local import LocalLedgerSource
from offloadd.read.verify import verify
from tests.backfill.support import TOPIC, source_truth, write_config, write_ledgers
from tests.fixtures.s3 import MIN_PART_SIZE, MotoBucket, moto_server, s3_bucket
from tests.fixtures.zookeeper import zk_server

__all__ = ["moto_server", "s3_bucket", "zk_server"]  # fixtures

pytestmark = pytest.mark.integration


@pytest.mark.timeout(240)
async def test_backfill_on_zookeeper_and_s3_verifies_and_reads_back_as_a_dataframe(
        tmp_path: Path, zk_server: str, s3_bucket: MotoBucket, spark: Any) -> None:
    from pyspark.sql import functions as F

    tier = (f'driver = "aws-s3"\nbucket = "{s3_bucket.name}"\nendpoint = "{s3_bucket.endpoint}"\n'
            'access_key_id = "testing"\nsecret_access_key = "testing"\nprefix = "tier/"\n'
            f"min_part_size_bytes = {MIN_PART_SIZE}")
    cfg = write_config(tmp_path, segment_mbytes=0.5, block_bytes=64 * 1024,
                       metadata_url=f"zk://{zk_server}/backfill-{uuid.uuid4().hex}",
                       blobstore=tier, extra="")
    cfg.write_text(cfg.read_text().replace("[offload]\n", "[offload]\nmin_block_size_bytes = 0\n"))
    settings = config.load(cfg)
    await write_ledgers(settings, TOPIC, [(300, 1000), (5, 40_000), (800, 700), (60, 5000)])

    report = await run_backfill(settings, TOPIC, spark=lambda: spark)
    assert report.ok and report.offloaded_segments == report.new_segments >= 3

    md = await wiring.open_metadata(settings)
    bs = await wiring.open_blobstore(settings)
    try:
        # the driver applies [blobstore] prefix itself: callers use bare keys
        src = wiring.local_view(LocalLedgerSource(settings.source.path, md))
        rep = await verify(md, bs, src, [TOPIC], grace_s=0.0)
        keys = [o.key async for o in bs.list("")]
    finally:
        await bs.close()
        await md.close()
    assert rep.ok, rep.to_json()
    assert len(keys) == 2 * report.offloaded_segments

    df = (spark.read.format("offloadd").option("config", str(cfg)).option("topic", str(TOPIC))
          .load())
    row = df.agg(F.count("*").alias("n"), F.sum(F.crc32("payload")).alias("crc")).first()
    assert (row["n"], row["crc"]) == await source_truth(settings, TOPIC)
