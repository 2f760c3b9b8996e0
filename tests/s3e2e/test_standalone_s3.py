"""The spine's standalone scenario with ``driver = "aws-s3"`` against a real-HTTP S3 server
(moto_server): verify passes, read-back matches the source, and the objects are Pulsar's — keys
``<uuid>`` / ``<uuid>-index``, the format-version metadata on every object, multipart parts made
of whole blocks."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.s3 import MotoBucket
from tests.s3e2e.helpers import (
    DEMO_POLICY,
    block_count,
    check_objects,
    read_crcs,
    run,
    s3_config,
    source_crcs,
    stored_objects,
    streaming_index,
    summary_of,
    verify_json,
)

pytestmark = pytest.mark.integration
MiB = 1024 * 1024
PART = 128 * 1024


def check_read_back(cwd: Path, cfg: Path, topics: list[str]) -> None:
    for topic in topics:
        assert read_crcs(cwd, cfg, topic) == source_crcs(cwd, topic), topic


@pytest.mark.parametrize(("seconds", "rate", "policy", "min_segments"), [
    # the short run rolls segments faster so that they still cross ledgers
    pytest.param(6, 1_000_000, DEMO_POLICY.replace("minutes = 0.1", "minutes = 0.03"), 2,
                 id="short"),
    pytest.param(30, 2_000_000, DEMO_POLICY, 3, id="spine", marks=pytest.mark.slow),
])
@pytest.mark.timeout(300)
def test_standalone_on_s3_verifies_with_pulsar_keys_metadata_and_parts_of_whole_blocks(
        tmp_path: Path, s3_bucket: MotoBucket, seconds: int, rate: int, policy: str,
        min_segments: int) -> None:
    # parts of 128 KiB (blocks are up to 1 MiB): several parts per segment crossing ledgers
    cfg = s3_config(tmp_path, s3_bucket.endpoint, s3_bucket.name, policy,
                    blobstore=f"part_size_bytes = {PART}")
    out = run(["standalone", "--json", "--config", str(cfg), "--duration", str(seconds), "--rate",
               str(rate), "--topics", "3"], tmp_path, timeout=240)
    summary = summary_of(out)
    assert summary["bytes_written"] >= seconds * rate * 0.8
    rep = verify_json(tmp_path, cfg)
    assert rep["ok"], rep
    assert len(rep["topics"]) == 3 and rep["orphans"] == []
    for t in rep["topics"]:
        assert t["source_checked"] == t["entries"] > 0 and t["segments"] >= min_segments
    parts = check_objects(s3_bucket, tmp_path, part_size=PART)
    assert max(parts.values()) > 1  # multipart for real, not one part per object
    # verify compared every payload with the source already; read one topic end to end too
    check_read_back(tmp_path, cfg, [rep["topics"][0]["topic"]])


@pytest.mark.timeout(180)
def test_default_sizes_give_unpadded_parts_of_at_least_8_mib_under_the_key_prefix(
        tmp_path: Path, s3_bucket: MotoBucket) -> None:
    """Offload policy left at its defaults: blocks sized by their content (a ledger's end cuts
    a short one, padded by no more than 4 bytes), grouped into parts of at least 8 MiB (S3's
    5 MiB minimum is met; moto here would accept less); stored bytes stay within 2 % of the
    payload; the driver puts every key under the prefix."""
    prefix = "tier/offloadd/"
    # only the embedded writer's ledger size is set: several ledgers make several blocks
    cfg = s3_config(tmp_path, s3_bucket.endpoint, s3_bucket.name,
                    "[source]\nrollover_bytes = 3000000\n", prefix=prefix)
    out = run(["standalone", "--json", "--config", str(cfg), "--duration", "7", "--rate", "2000000",
               "--topics", "1"], tmp_path, timeout=150)
    rep = verify_json(tmp_path, cfg)
    assert rep["ok"], rep
    parts = check_objects(s3_bucket, tmp_path, prefix)  # parts of at least 8 MiB but the last
    assert max(parts.values()) >= 2
    blocks = sum(block_count(streaming_index(s3_bucket, f"{key}-index")) for key in parts)
    assert sum(parts.values()) < blocks  # parts group blocks (a ledger's end cuts one short)
    stored = sum(o.size for o in stored_objects(s3_bucket).values())
    assert stored <= 1.02 * summary_of(out)["bytes_written"]
    check_read_back(tmp_path, cfg, [t["topic"] for t in rep["topics"]])
