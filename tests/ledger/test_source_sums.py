"""The embedded source hands on the chunk CRC32Cs its check computed (``EntryRun.sums``), and
blocks stamped from them are byte for byte those stamped by reading every byte (issue 22, "one
pass per byte"); the check itself still refuses a damaged entry."""

from __future__ import annotations

import struct
from dataclasses import replace
from pathlib import Path
from typing import cast

import crc32c
import pytest

from offloadd.blobstore.memory import MemoryBlobStore
from offloadd.errors import Fatal, FormatError
from offloadd.format import StreamingObjectBuilder
from offloadd.format.block import parse_block_header
from offloadd.format.checksum import stamp_blocks, verify_block_checksum
from offloadd.ledger.base import LedgerSource
from offloadd.ledger.local import (
    CHUNK,
    LocalLedgerSource,
    LocalLedgerWriter,
    RolloverPolicy,
    ledger_files,
)
from offloadd.metadata.memory import MemoryMetadataStore
from offloadd.model import FRAME_OVERHEAD, EntryRun, PieceSums, Position, TopicName
from offloadd.model.catalog import LedgerRange
from offloadd.model.keys import streaming_data_key
from offloadd.offload.attempt import Uploads, open_streaming
from offloadd.offload.buffer import OffloadBuffer
from offloadd.offload.parts import DEFAULT_PART_SIZE
from offloadd.offload.runs import RunReader

T = TopicName.parse("persistent://public/default/sums")
ENTRY = 20_000
N = 60  # ~1.2 MB: 18 whole 64 KiB chunks and a tail no record covers yet


def payload(i: int) -> bytes:
    return (i.to_bytes(4, "big") * (ENTRY // 4 + 1))[:ENTRY]


async def write(path: Path, md: MemoryMetadataStore) -> Position:
    writer = LocalLedgerWriter(path, md, RolloverPolicy(max_entries=10**6))
    pos = Position(-1, -1)
    for i in range(0, N, 7):
        pos = await writer.append(T, [payload(j) for j in range(i, min(i + 7, N))])
    await writer.close()
    return pos


async def runs(source: LocalLedgerSource, ledger_id: int, max_bytes: int) -> list[EntryRun]:
    out: list[EntryRun] = []
    nxt = 0
    while nxt < N:
        run = await source.read(T, ledger_id, nxt, N - 1, max_bytes=max_bytes)
        out.append(run)
        nxt = run.last_entry_id + 1
    return out


def blocks(run: EntryRun, *, with_sums: bool) -> list[bytes]:
    builder = StreamingObjectBuilder(max_block_size=150_000, min_block_size=0)
    blocks = stamp_blocks(builder.add_run(run), run.sums if with_sums else None)
    return [b"".join(bytes(b) for b in p.buffers) for p in blocks]


@pytest.mark.parametrize("max_bytes", [300_000, 1_000_000, 10**7])
async def test_checked_runs_carry_the_crcs_of_their_whole_chunks(
        tmp_path: Path, max_bytes: int) -> None:
    md = MemoryMetadataStore()
    pos = await write(tmp_path, md)
    got = await runs(LocalLedgerSource(tmp_path, md), pos.ledger_id, max_bytes)
    pieces = 0
    for run in got:
        if run.sums is None:  # no whole recorded chunk lies inside it (the ledger's tail)
            continue
        starts, crcs = run.sums.starts, run.sums.crcs
        assert len(starts) == len(crcs) + 1 and starts[0] >= 0 and starts[-1] <= len(run.data)
        for k, crc in enumerate(crcs):
            assert starts[k + 1] - starts[k] == CHUNK
            assert crc == crc32c.crc32c(run.data[starts[k]:starts[k + 1]])
        pieces += len(crcs)
    # every whole chunk of the log inside some run is handed on (a run boundary costs at most
    # the chunk it cuts)
    log_chunks = ledger_files(tmp_path, pos.ledger_id).log.stat().st_size // CHUNK
    assert pieces >= log_chunks - (len(got) - 1) > 0


@pytest.mark.parametrize("max_bytes", [300_000, 10**7])
async def test_blocks_stamped_from_the_sums_are_the_same_bytes_and_check_out(
        tmp_path: Path, max_bytes: int) -> None:
    md = MemoryMetadataStore()
    pos = await write(tmp_path, md)
    checked = await runs(LocalLedgerSource(tmp_path, md), pos.ledger_id, max_bytes)
    trusting = await runs(LocalLedgerSource(tmp_path, md, verify_crc=False), pos.ledger_id,
                          max_bytes)
    assert all(r.sums is None for r in trusting)  # no check, no pass: the stamp reads
    for a, b in zip(checked, trusting, strict=True):
        derived, read = blocks(a, with_sums=True), blocks(b, with_sums=False)
        assert derived == read
        for block in derived:
            assert verify_block_checksum(block, 0, len(block), "obj", required=True)


async def test_a_damaged_entry_is_still_refused_before_any_block_is_made(
        tmp_path: Path) -> None:
    md = MemoryMetadataStore()
    pos = await write(tmp_path, md)
    f = ledger_files(tmp_path, pos.ledger_id)
    victim = 30  # well inside the chunk-covered bytes
    start = struct.unpack("<q", f.off.read_bytes()[8 * victim:8 * victim + 8])[0]
    raw = bytearray(f.log.read_bytes())
    raw[start + FRAME_OVERHEAD + 1234] ^= 0x04
    f.log.write_bytes(bytes(raw))
    with pytest.raises(FormatError, match=rf"entry {victim}: payload CRC32C"):
        await runs(LocalLedgerSource(tmp_path, md), pos.ledger_id, 300_000)


async def offload(source: LedgerSource, ledger_id: int) -> bytes:
    """The whole offload path into a memory store: reads into the buffer, blocks, stamps,
    parts; the data object's bytes."""
    store = MemoryBlobStore()
    buf = OffloadBuffer(1 << 24)
    reader = RunReader(source, buf, T)
    uploads = Uploads(store, T.managed_ledger, 2, part_size=DEFAULT_PART_SIZE)
    att = await open_streaming(uploads, max_block_size=150_000, opened_at=0.0)
    async for run in reader.runs(LedgerRange(ledger_id, 0, N - 1), 300_000,
                                 att.wait_for_room):
        att.feed(run, 1)
    await att.seal()
    key = streaming_data_key(att.uid)
    return bytes(await store.get_range(key, 0, (await store.head(key)).size))


def block_checks(data: bytes) -> list[bool]:
    """Whether each block's stamped CRC32C matches its bytes."""
    out, at = [], 0
    while at < len(data):
        n = parse_block_header(data, at, "obj").block_len
        try:
            out.append(verify_block_checksum(data, at, n, "obj", required=True))
        except FormatError:
            out.append(False)
        at += n
    return out


class Rewritten:
    """A source whose runs pass through :meth:`edit` on their way out."""

    def __init__(self, inner: LocalLedgerSource) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def edit(self, run: EntryRun) -> EntryRun:
        raise NotImplementedError

    async def read(self, topic: TopicName, ledger_id: int, first: int, last: int, *,
                   max_bytes: int | None = None, into: bytearray | None = None) -> EntryRun:
        return self.edit(await self.inner.read(topic, ledger_id, first, last,
                                               max_bytes=max_bytes, into=into))


class Stripped(Rewritten):
    """A source that hands on no piece CRCs: the stamp reads every byte again."""

    def edit(self, run: EntryRun) -> EntryRun:
        return replace(run, sums=None)


class Skewed(Rewritten):
    """A source whose piece CRCs are off by one bit: shows which CRCs the stamp is made of."""

    def edit(self, run: EntryRun) -> EntryRun:
        if run.sums is None:
            return run
        return replace(run, sums=PieceSums(run.sums.starts, [c ^ 1 for c in run.sums.crcs]))


async def test_the_offload_path_stamps_from_the_sources_crcs(tmp_path: Path) -> None:
    md = MemoryMetadataStore()
    pos = await write(tmp_path, md)
    one_pass = await offload(LocalLedgerSource(tmp_path, md), pos.ledger_id)
    two_passes = await offload(cast(LedgerSource, Stripped(LocalLedgerSource(tmp_path, md))),
                               pos.ledger_id)
    assert one_pass == two_passes  # the same bytes written, checksums included
    assert all(block_checks(one_pass))
    # without the check, reads into the buffer still hand on the CRCs they made as they read
    unchecked = await offload(LocalLedgerSource(tmp_path, md, verify_crc=False), pos.ledger_id)
    assert unchecked == two_passes
    # the stamp is combined from the piece CRCs: skewed ones show in the blocks' CRCs, and so
    # in the part's CRC32C combined from them, which the store refuses as S3 would
    for verify in (True, False):
        with pytest.raises(Fatal, match="BadDigest"):
            await offload(cast(LedgerSource, Skewed(LocalLedgerSource(tmp_path, md,
                                                                      verify_crc=verify))),
                          pos.ledger_id)
