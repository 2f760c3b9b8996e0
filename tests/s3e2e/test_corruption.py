"""Corrupted bytes in stored objects: ``offloadd read`` and ``offloadd verify`` fail, naming the
object (and the block, for a data object), and never hand out a wrong entry.

One offload run (module scope) fills a bucket; each test corrupts one object in the server —
re-put with one byte changed and the same user metadata, as bit rot or a bad copy would leave it —
and puts the original back afterwards. The sweeps flip every byte of an index and the bytes of
the data blocks that carry structure, in process, and check the reader's one promise: an error,
or exactly the right entries.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import crc32c
import pytest

from offloadd.blobstore.base import Buffers, MultipartUpload, ObjectInfo
from offloadd.blobstore.s3 import S3BlobStore
from offloadd.errors import OffloaddError
from offloadd.format import HEADER_LEN, StreamingIndex
from offloadd.metadata import managed_ledger
from offloadd.metadata.embedded import EmbeddedMetadataStore
from offloadd.model import TopicName, catalog
from offloadd.model.catalog import Segment
from offloadd.read.reader import TierReader
from tests.fixtures.s3 import MotoBucket
from tests.s3e2e.helpers import (
    BLOCKS_POLICY,
    committed_uids,
    get_bytes,
    put_bytes,
    run,
    s3_config,
    source_crcs,
    streaming_index,
)

pytestmark = pytest.mark.integration

TOPIC = "persistent://public/default/topic-0"
POLICY = BLOCKS_POLICY


@dataclass(frozen=True)
class Offloaded:
    cwd: Path
    cfg: Path
    bucket: MotoBucket
    uid: str  # a committed segment with several blocks
    index: StreamingIndex
    source: list[tuple[str, int]]


@pytest.fixture(scope="module")
def offloaded(s3_server: str, tmp_path_factory: pytest.TempPathFactory) -> Offloaded:
    cwd = tmp_path_factory.mktemp("corruption")
    bucket = MotoBucket(s3_server, f"offloadd-corruption-{os.getpid()}")
    bucket.boto3().create_bucket(Bucket=bucket.name)
    cfg = s3_config(cwd, s3_server, bucket.name, POLICY)
    run(["standalone", "--json", "--config", str(cfg), "--duration", "3", "--rate", "500000",
         "--topics",
         "1"], cwd, timeout=120)
    uid = committed_uids(cwd)[TopicName.parse(TOPIC).managed_ledger][0]
    index = streaming_index(bucket, f"{uid}-index")
    assert sum(len(s.blocks) for s in index.sections) >= 4
    return Offloaded(cwd, cfg, bucket, uid, index, source_crcs(cwd, TOPIC))


@contextlib.contextmanager
def corrupted(bucket: MotoBucket, key: str, *at: int) -> Iterator[None]:
    """``key`` with the bytes ``at`` flipped in the server, metadata kept; restored on exit."""
    original, metadata = get_bytes(bucket, key)
    bad = bytearray(original)
    for i in at:
        bad[i] ^= 0xFF
    put_bytes(bucket, key, bytes(bad), metadata)
    try:
        yield
    finally:
        put_bytes(bucket, key, original, metadata)


def printed_entries(stdout: str) -> list[tuple[str, int]]:
    return [(pos, crc32c.crc32c(base64.b64decode(b)))
            for pos, b in (ln.split("\t") for ln in stdout.splitlines())]


def read_and_verify(o: Offloaded) -> tuple[str, str]:
    """Run read and verify, which must both fail; their error output. Whatever read printed
    before failing must be right."""
    read = run(["read", "--config", str(o.cfg), "--topic", TOPIC], o.cwd, check=False)
    assert read.returncode == 1, read
    got = printed_entries(read.stdout)
    assert got == o.source[:len(got)]
    ver = run(["verify", "--config", str(o.cfg)], o.cwd, check=False)
    assert ver.returncode == 1, ver
    assert "verify: FAILED" in ver.stdout
    return read.stderr, ver.stdout


@pytest.mark.timeout(120)
def test_a_corrupt_data_block_fails_read_and_verify_naming_the_object_and_block(
        offloaded: Offloaded) -> None:
    blocks = [b for s in offloaded.index.sections for b in s.blocks]
    block = blocks[len(blocks) // 2]
    with corrupted(offloaded.bucket, offloaded.uid, block.offset + HEADER_LEN + 40):
        read_err, verify_out = read_and_verify(offloaded)
    where = f"{offloaded.uid} (block {block.part_id} at byte {block.offset})"
    for said in (read_err, verify_out):
        assert where in said and "checksum mismatch" in said, said


@pytest.mark.timeout(120)
def test_a_damaged_checksum_mark_does_not_switch_the_check_off(offloaded: Offloaded) -> None:
    """Bit rot over a block's checksum mark (header bytes 36..39) and its payload: the mark is
    not trusted to say whether the block is checked, the object's metadata is."""
    blocks = [b for s in offloaded.index.sections for b in s.blocks]
    block = blocks[len(blocks) // 2]
    with corrupted(offloaded.bucket, offloaded.uid, block.offset + 37,
                   block.offset + HEADER_LEN + 40):
        read_err, verify_out = read_and_verify(offloaded)
    where = f"{offloaded.uid} (block {block.part_id} at byte {block.offset})"
    for said in (read_err, verify_out):
        assert where in said and "checksum mark damaged" in said, said


@pytest.mark.timeout(120)
def test_a_corrupt_index_fails_read_and_verify_naming_the_index(offloaded: Offloaded) -> None:
    key = f"{offloaded.uid}-index"
    raw, _ = get_bytes(offloaded.bucket, key)
    # the top byte of the last block's offset (the table's last row ends the object)
    with corrupted(offloaded.bucket, key, len(raw) - 8):
        read_err, verify_out = read_and_verify(offloaded)
    for said in (read_err, verify_out):
        assert f"{key} at byte {len(raw) - 8}" in said, said


@pytest.mark.timeout(120)
def test_verify_catches_index_corruption_the_decoder_cannot_see(offloaded: Offloaded) -> None:
    """A part id is not checked against anything, so only the index's own checksum can tell."""
    key = f"{offloaded.uid}-index"
    raw, _ = get_bytes(offloaded.bucket, key)
    # the last row is (int64 first entry, int32 part id, int64 offset): the part id's low byte
    with corrupted(offloaded.bucket, key, len(raw) - 9):
        ver = run(["verify", "--config", str(offloaded.cfg)], offloaded.cwd, check=False)
    assert ver.returncode == 1 and key in ver.stdout, ver.stdout


# ---- sweeps: every flip either fails or reads right --------------------------------------------
class FlipOne:
    """Serves a segment's two objects, fetched once from the S3 server, with byte ``at`` of
    ``key`` flipped (the reader's checks are the subject here, not the transport)."""

    name = "aws-s3"

    def __init__(self, objects: dict[str, ObjectInfo], data: dict[str, bytes]) -> None:
        self.objects = objects
        self.data = data
        self.key = ""
        self.at = -1

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        data = self.data[key][start:end]
        if key == self.key and start <= self.at < start + len(data):
            flipped = bytearray(data)
            flipped[self.at - start] ^= 0xFF
            return bytes(flipped)
        return data

    async def head(self, key: str) -> ObjectInfo:
        return self.objects[key]

    async def start_upload(self, key: str, metadata: Mapping[str, str]) -> MultipartUpload:
        raise AssertionError("read-only")

    async def put(self, key: str, data: Buffers, metadata: Mapping[str, str], *,
                  crc32c: int | None = None) -> ObjectInfo:
        raise AssertionError("read-only")

    async def delete(self, key: str) -> None:
        raise AssertionError("read-only")

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        for info in self.objects.values():
            yield info

    def driver_properties(self) -> dict[str, str]:
        return {}

    async def close(self) -> None:
        pass


async def read_all(md: EmbeddedMetadataStore, store: FlipOne, seg: Segment
                   ) -> list[tuple[str, bytes]] | None:
    """The segment's entries, or None when the reader refused (an OffloaddError)."""
    try:
        return [(str(e.position), bytes(e.payload))
                async for e in TierReader(md, store, prefetch=2).read_segment(seg)]
    except OffloaddError:
        return None


@pytest.mark.timeout(120)
async def test_no_single_byte_flip_in_the_index_or_block_structure_yields_a_wrong_entry(
        offloaded: Offloaded) -> None:
    md = await EmbeddedMetadataStore.open(str(offloaded.cwd / "data" / "metadata"))
    s3 = await S3BlobStore.open(offloaded.bucket.options())
    try:
        keys = [offloaded.uid, f"{offloaded.uid}-index"]
        infos = {k: await s3.head(k) for k in keys}
        store = FlipOne(infos, {k: await s3.get_range(k, 0, infos[k].size) for k in keys})
        info, _ = await managed_ledger.load(md, TopicName.parse(TOPIC).managed_ledger)
        (seg,) = [s for s in catalog.segments(info) if str(s.uid) == offloaded.uid]
        good = await read_all(md, store, seg)
        assert good is not None and len(good) == seg.entries
        index_len = infos[f"{offloaded.uid}-index"].size
        data_len = offloaded.index.data_object_length
        flips = [(f"{offloaded.uid}-index", at) for at in range(index_len)]
        for b in [b for s in offloaded.index.sections for b in s.blocks][:3]:
            end = offloaded.index.block_end(b)
            # every header field, the first frame's length and id, a payload byte in the
            # middle, the padding's last byte
            inside = [*range(44), *range(HEADER_LEN, HEADER_LEN + 16)]
            flips += [(offloaded.uid, b.offset + at) for at in inside]
            flips += [(offloaded.uid, (b.offset + end) // 2), (offloaded.uid, end - 1)]
        assert all(at < data_len for key, at in flips if key == offloaded.uid)
        wrong, missed = [], 0
        for key, at in flips:
            store.key, store.at = key, at
            got = await read_all(md, store, seg)
            if got is not None and got != good:
                wrong.append((key, at))
            missed += got is not None
        assert wrong == []
        # most flips are caught; the rest land where readers never look (header zeros, the
        # index's part ids and timestamps), so the entries come out right anyway
        assert missed < len(flips) / 2, (missed, len(flips))
    finally:
        await asyncio.gather(s3.close(), md.close())
