"""The lakehouse on ``aws-s3`` (a real-HTTP moto_server): the tier and the Iceberg warehouse in
the same bucket, the warehouse written through pyiceberg's PyArrow FileIO with the tier's endpoint
and credentials; the tables hold exactly what was sent, and ``offloadd query`` reads them there.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offloadd.lakehouse.tables import open_catalog
from tests.fixtures.s3 import MIN_PART_SIZE, MotoBucket
from tests.lakehouse.support import (
    digest,
    distinct_positions,
    run,
    settings_of,
    summary,
    table_rows,
    write_config,
)

pytestmark = pytest.mark.integration


@pytest.mark.timeout(300)
def test_standalone_on_s3_projects_into_a_warehouse_in_the_bucket(
        tmp_path: Path, s3_bucket: MotoBucket) -> None:
    cfg = write_config(tmp_path, blobstore=f"""driver = "aws-s3"
endpoint = "{s3_bucket.endpoint}"
bucket = "{s3_bucket.name}"
region = "us-east-1"
prefix = "tier/"
access_key_id = "testing"
secret_access_key = "testing"
min_part_size_bytes = {MIN_PART_SIZE}
""", lakehouse="enabled = true\ncommit_max_bytes = 1000000\n")
    out = run(["standalone", "--json", "--config", str(cfg), "--duration", "8", "--topics", "2",
               "--rate", "800000"], tmp_path, timeout=240)
    s = summary(out.stdout)
    settings = settings_of(cfg)
    topics = sorted(s["topics"])
    for topic in topics:
        rows = table_rows(settings, topic)
        assert digest(rows) == s["topics"][topic]["sent"], topic
        assert distinct_positions(rows) == rows.num_rows
    table = open_catalog(settings, create=False).load_table(("public", "default", "topic-0"))
    assert table.location().startswith(f"s3://{s3_bucket.name}/tier/lakehouse/")
    keys = [o["Key"] for o in s3_bucket.boto3().list_objects_v2(
        Bucket=s3_bucket.name, Prefix="tier/lakehouse/")["Contents"]]
    assert any(k.endswith(".parquet") for k in keys)
    assert any(k.endswith(".metadata.json") for k in keys)
    # the tier's own tools leave the warehouse alone: verify sees no orphans in it
    rep = json.loads(run(["verify", "--config", str(cfg), "--json", "--orphan-grace", "0"],
                         tmp_path).stdout)
    assert rep["ok"] and rep["orphans"] == [], rep
    q = json.loads(run(["query", "--config", str(cfg), "--json",
                        "SELECT count(*) AS n FROM topic_1 WHERE key IS NOT NULL"],
                       tmp_path).stdout)
    rows = table_rows(settings, topics[1])
    assert q == [{"n": rows.num_rows - rows.column("key").null_count}]
    # issue 24 item 4 on S3: after maintain (grace 0) the warehouse holds what the tables
    # reference and nothing else; `status` counts it
    env_cfg = write_config(tmp_path, blobstore=cfg.read_text().split("[blobstore]\n", 1)[1]
                           .split("[source]", 1)[0], name="maintain.toml",
                           lakehouse="enabled = true\ncompact_min_files = 2\n"
                           "snapshot_max_age_minutes = 0.0001\nreader_grace_minutes = 0\n")
    done = json.loads(run(["lakehouse", "maintain", "--json", "--config", str(env_cfg)],
                          tmp_path).stdout)
    assert sum(r["files_deleted"] for r in done) > 0, done
    from offloadd.lakehouse.cleanup import referenced

    cat = open_catalog(settings, create=False)
    wanted = set()
    for topic in ("topic-0", "topic-1"):
        wanted |= referenced(cat.load_table(("public", "default", topic)))
    pages = s3_bucket.boto3().get_paginator("list_objects_v2").paginate(
        Bucket=s3_bucket.name, Prefix="tier/lakehouse/")
    # (keys ending in "/" are the directory markers pyarrow's S3 filesystem writes: no data)
    left = {f"{s3_bucket.name}/{o['Key']}" for p in pages for o in p.get("Contents", [])
            if not o["Key"].endswith("/")}
    assert left == wanted
    for topic in topics:
        assert digest(table_rows(settings, topic)) == s["topics"][topic]["sent"], topic
    st = json.loads(run(["status", "--config", str(cfg), "--json"], tmp_path, check=False).stdout)
    assert st["lakehouse"]["warehouse"]["files"] == len(left)
