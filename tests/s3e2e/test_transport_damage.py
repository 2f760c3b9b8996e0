"""Damage in transit is not corruption of the stored object: an S3 answer that comes back short,
padded or with a bit flipped (framed as a whole, clean answer: only the reader's checks see it)
is read again before the object is called corrupt, and each re-read is counted. One damaged
answer costs a re-read, not a whole ``read``/``verify``; damage that stays is still the clear
corruption error naming the object.

A standalone run fills a moto bucket once (module scope); each test reads it back through the
fault proxy (``tests/fixtures/faultproxy.py``), which damages the answers it is told to.
"""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import crc32c
import pytest

from offloadd.blobstore.s3 import S3BlobStore
from offloadd.errors import FormatError
from offloadd.metadata import managed_ledger
from offloadd.metadata.embedded import EmbeddedMetadataStore
from offloadd.model import TopicName, catalog
from offloadd.read.reader import TierReader
from tests.fixtures.faultproxy import FaultPlan, FaultProxy
from tests.fixtures.s3 import MotoBucket, moto_server
from tests.s3e2e.helpers import BLOCKS_POLICY, committed_uids, run, s3_config, source_crcs

__all__ = ["moto_server"]

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOPIC = "persistent://public/default/topic-0"
POLICY = BLOCKS_POLICY


@dataclass(frozen=True)
class Offloaded:
    cwd: Path
    bucket: MotoBucket
    uid: str  # a committed segment with several blocks
    source: list[tuple[str, int]]  # (position, payload CRC32C) of every entry of the topic


@pytest.fixture(scope="module")
def offloaded(moto_server: str, tmp_path_factory: pytest.TempPathFactory) -> Offloaded:
    cwd = tmp_path_factory.mktemp("transport")
    bucket = MotoBucket(moto_server, f"offloadd-transport-{os.getpid()}")
    bucket.boto3().create_bucket(Bucket=bucket.name)
    cfg = s3_config(cwd, moto_server, bucket.name, POLICY)
    run(["standalone", "--json", "--config", str(cfg), "--duration", "3", "--rate", "500000",
         "--topics",
         "1"], cwd, timeout=120)
    uid = committed_uids(cwd)[TopicName.parse(TOPIC).managed_ledger][0]
    return Offloaded(cwd, bucket, uid, source_crcs(cwd, TOPIC))


@pytest.fixture
def proxy(offloaded: Offloaded) -> Iterator[FaultProxy]:
    with FaultProxy(offloaded.bucket.endpoint, seed=7) as p:
        yield p


class Probe:
    def __init__(self) -> None:
        self.errors = 0
        self.rereads = 0

    def index_read(self, seconds: float) -> None: pass
    def data_read(self, seconds: float) -> None: pass
    def read_offload(self, nbytes: int) -> None: pass
    def read_error(self) -> None: self.errors += 1
    def reread(self) -> None: self.rereads += 1


async def read_segment(o: Offloaded, proxy: FaultProxy, probe: Probe, prefetch: int = 2
                       ) -> list[tuple[str, int]]:
    """The segment's entries (position, payload CRC32C), read through the proxy."""
    md = await EmbeddedMetadataStore.open(str(o.cwd / "data" / "metadata"))
    s3 = await S3BlobStore.open(o.bucket.options(endpoint=proxy.url, max_attempts=1))
    try:
        info, _ = await managed_ledger.load(md, TopicName.parse(TOPIC).managed_ledger)
        (seg,) = [s for s in catalog.segments(info) if str(s.uid) == o.uid]
        reader = TierReader(md, s3, prefetch=prefetch, range_bytes=64 * 1024, probe=probe)
        return [(str(e.position), crc32c.crc32c(e.payload))
                async for e in reader.read_segment(seg)]
    finally:
        await asyncio.gather(s3.close(), md.close())


def data_gets(proxy: FaultProxy, uid: str) -> list[str]:
    return [fault for _, method, path, fault in proxy.log
            if method == "GET" and path.split("?")[0].endswith(f"/{uid}")]


@pytest.mark.parametrize("kind", ["short", "pad", "flip"])
@pytest.mark.parametrize("what", ["index", "data"])
async def test_one_damaged_answer_is_read_again_and_the_read_succeeds(
        offloaded: Offloaded, proxy: FaultProxy, kind: str, what: str) -> None:
    proxy.plan = FaultPlan(target=f"GET /{offloaded.bucket.name}/{offloaded.uid}",
                           spare=None if what == "index" else "-index", script=(kind,))
    probe = Probe()
    got = await read_segment(offloaded, proxy, probe)
    assert proxy.injected[kind] == 1
    assert (probe.rereads, probe.errors) == (1, 0)
    first = offloaded.source.index(got[0])
    assert got == offloaded.source[first:first + len(got)]
    if what == "data":
        assert len(data_gets(proxy, offloaded.uid)) >= 3  # several ranged reads, one damaged


async def test_damage_that_stays_is_the_corruption_error(offloaded: Offloaded,
                                                         proxy: FaultProxy) -> None:
    proxy.plan = FaultPlan(target=f"GET /{offloaded.bucket.name}/{offloaded.uid}",
                           spare="-index", flip=1.0)
    probe = Probe()
    with pytest.raises(FormatError) as err:
        await read_segment(offloaded, proxy, probe, prefetch=0)
    assert offloaded.uid in str(err.value) and "-index" not in str(err.value)
    assert "block" in str(err.value)
    # read again, the same damage came back: no further re-read, one error
    assert probe.rereads == 1 and probe.errors == 1


async def test_changing_damage_is_read_again_a_bounded_number_of_times(
        offloaded: Offloaded, proxy: FaultProxy) -> None:
    # the first data answer and its re-reads damaged, each differently: short, padded, flipped
    proxy.plan = FaultPlan(target=f"GET /{offloaded.bucket.name}/{offloaded.uid}",
                           spare="-index", script=("short", "pad", "flip", "short"))
    probe = Probe()
    with pytest.raises(FormatError, match="checksum mismatch"):  # the last answer's damage
        await read_segment(offloaded, proxy, probe, prefetch=0)
    assert probe.errors == 1 and probe.rereads == 2  # TierReader's default: two re-reads


def printed(stdout: str) -> list[tuple[str, int]]:
    return [(pos, crc32c.crc32c(base64.b64decode(b)))
            for pos, b in (ln.split("\t") for ln in stdout.splitlines())]


def test_read_and_verify_get_past_one_damaged_answer(offloaded: Offloaded,
                                                     proxy: FaultProxy) -> None:
    """The CLI end to end through the proxy: one damaged data answer each, both succeed."""
    cfg = s3_config(offloaded.cwd, proxy.url, offloaded.bucket.name, POLICY, name="proxy.toml",
                    blobstore="max_attempts = 1")
    target = f"GET /{offloaded.bucket.name}/{offloaded.uid}"
    proxy.plan = FaultPlan(target=target, spare="-index", script=("flip",))
    read = run(["read", "--config", str(cfg), "--topic", TOPIC], offloaded.cwd, check=False)
    assert read.returncode == 0, read.stderr[-2000:]
    assert printed(read.stdout) == offloaded.source
    assert proxy.injected["flip"] == 1, proxy.log[:8]
    assert "reading it again" in read.stderr
    proxy.plan = FaultPlan(target=target, spare="-index", script=("short",))
    ver = run(["verify", "--config", str(cfg)], offloaded.cwd, check=False)
    assert ver.returncode == 0, ver.stdout[-2000:] + ver.stderr[-2000:]
    assert proxy.injected["short"] == 1
    # damage that stays fails them, naming the object
    proxy.plan = FaultPlan(target=target, spare="-index", flip=1.0)
    read = run(["read", "--config", str(cfg), "--topic", TOPIC], offloaded.cwd, check=False)
    assert read.returncode == 1 and offloaded.uid in read.stderr
