"""Reads checksummed as they are read (``check.read_summed``, issue 22 "one pass per byte"):
the chunk CRC32Cs it computes a piece at a time are those of the bytes, the chunk comparison
made from them decides as the one that reads the bytes again, and a flipped byte read through
it into a buffer (the offloader's path) still names its entry."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from bisect import bisect_right
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from offloadd.errors import FormatError
from offloadd.ledger.local import (
    CHUNK,
    LocalLedgerSource,
    LocalLedgerWriter,
    RolloverPolicy,
    chunk_sums,
    ledger_files,
)
from offloadd.ledger.local.check import compare_chunks, read_summed
from offloadd.ledger.local.records import rebased
from offloadd.metadata.memory import MemoryMetadataStore
from offloadd.model import FRAME_OVERHEAD, Position, TopicName

T = TopicName.parse("persistent://public/default/summed")
ENTRY = 1000
N = 300  # ~300 KB of frames: four whole 64 KiB chunks of .log and a tail no record covers


@contextmanager
def a_file(data: bytes) -> Iterator[tuple[Path, int]]:
    with tempfile.TemporaryDirectory(prefix="offloadd-summed-") as d:
        path = Path(d) / "data"
        path.write_bytes(data)
        fd = os.open(path, os.O_RDONLY)
        try:
            yield path, fd
        finally:
            os.close(fd)


@st.composite
def reads(draw: st.DrawFn) -> tuple[bytes, int, int, int, int]:
    """File bytes, a chunk, a piece, and a range of the file to read."""
    data = draw(st.binary(min_size=1, max_size=3000))
    chunk = draw(st.integers(1, 300))
    piece = draw(st.sampled_from([chunk, 3 * chunk, 7 * chunk])
                 | st.integers(1, 900))  # a multiple of the chunk, as the source's, or not
    offset = draw(st.integers(0, len(data) - 1))
    n = draw(st.integers(1, len(data) - offset))
    return data, chunk, piece, offset, n


@pytest.mark.timeout(120)
@settings(max_examples=300, deadline=None)
@given(reads())
def test_the_crcs_are_those_of_each_chunk_up_to_the_reads_end(
        case: tuple[bytes, int, int, int, int]) -> None:
    data, chunk, piece, offset, n = case
    with a_file(data) as (path, fd):
        buf = bytearray(n + 17)
        view, crcs = read_summed(fd, buf, n, offset, path, chunk, piece)
    assert bytes(view) == data[offset:offset + n] and view.obj is buf
    end = offset + n
    want = [crc32c.crc32c(data[k * chunk:min((k + 1) * chunk, end)])
            for k in range(offset // chunk, -(-end // chunk))]
    assert list(crcs) == want


@pytest.mark.timeout(120)
@settings(max_examples=300, deadline=None)
@given(reads(), st.data())
def test_comparing_from_them_decides_as_reading_again(
        case: tuple[bytes, int, int, int, int], more: st.DataObject) -> None:
    """Same chunks found bad, same covered end, same sums handed on; with damage anywhere in
    the file after its records were made, and records only up to some published end."""
    data, chunk, piece, offset, n = case
    records, _ = chunk_sums(data, 0, 0, chunk)
    damaged = bytearray(data)
    for at in more.draw(st.lists(st.integers(0, len(data) - 1), max_size=3)):
        damaged[at] ^= 1 << more.draw(st.integers(0, 7))
    published = more.draw(st.integers(0, len(data)))
    with a_file(bytes(damaged)) as (path, fd):
        sums = path.with_suffix(".sum")
        sums.write_bytes(records)
        view, crcs = read_summed(fd, bytearray(n), n, offset, path, chunk, piece)
        assert compare_chunks(fd, path, sums, chunk, offset, view, published, crcs) == \
            compare_chunks(fd, path, sums, chunk, offset, view, published)


def payload(i: int) -> bytes:
    return (i.to_bytes(4, "big") * (ENTRY // 4 + 1))[:ENTRY]


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A closed ledger's files (reads need no metadata): its directory and id."""
    path = tmp_path_factory.mktemp("ledger")

    async def write() -> Position:
        writer = LocalLedgerWriter(path, MemoryMetadataStore(),
                                   RolloverPolicy(max_entries=10**6))
        pos = Position(-1, -1)
        for i in range(0, N, 37):
            pos = await writer.append(T, [payload(j) for j in range(i, min(i + 37, N))])
        await writer.close()
        return pos

    return path, asyncio.run(write()).ledger_id


async def read_into_buffers(path: Path, ledger_id: int) -> list[bytes]:
    """Every entry, in reads of ~100 KB into a buffer as the offloader makes them."""
    source = LocalLedgerSource(path, MemoryMetadataStore())
    out: list[bytes] = []
    into = bytearray(1 << 17)
    while len(out) < N:
        run = await source.read(T, ledger_id, len(out), N - 1, max_bytes=100_000, into=into)
        assert run.data.obj is into  # read_summed's path
        o = run.offsets
        out += [bytes(run.data[o[i] + FRAME_OVERHEAD:o[i + 1]]) for i in range(run.count)]
    return out


@pytest.mark.timeout(120)
def test_reads_into_a_buffer_are_right(ledger: tuple[Path, int]) -> None:
    path, ledger_id = ledger
    assert asyncio.run(read_into_buffers(path, ledger_id)) == [payload(i) for i in range(N)]


@pytest.mark.timeout(240)
@settings(max_examples=60, deadline=None)
@given(st.floats(0, 1, exclude_max=True), st.integers(0, 7))
def test_a_flipped_byte_names_its_entry(ledger: tuple[Path, int], where: float,
                                        bit: int) -> None:
    path, ledger_id = ledger
    with tempfile.TemporaryDirectory(prefix="offloadd-summed-") as d:
        copy = Path(d)
        for f in ledger_files(path, ledger_id).all():
            shutil.copy(f, copy / f.name)
        log = ledger_files(copy, ledger_id).log
        raw = bytearray(log.read_bytes())
        at = int(where * len(raw))
        raw[at] ^= 1 << bit
        log.write_bytes(bytes(raw))
        starts = rebased(ledger_files(copy, ledger_id).off.read_bytes(), 0)
        victim = bisect_right(starts, at) - 1
        with pytest.raises(FormatError, match=rf"ledger {ledger_id}\) at byte "
                                              rf"{starts[victim]}: entry {victim}: "):
            asyncio.run(read_into_buffers(copy, ledger_id))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("verify", [True, False])
def test_reads_into_a_buffer_hand_on_their_whole_chunks_crcs(ledger: tuple[Path, int],
                                                             verify: bool) -> None:
    """Checked or not, a read into a buffer hands on the CRC32Cs it made of the whole chunks
    inside it, for the block stamp to combine."""
    path, ledger_id = ledger

    async def pieces() -> int:
        source = LocalLedgerSource(path, MemoryMetadataStore(), verify_crc=verify)
        into, nxt, count = bytearray(1 << 17), 0, 0
        while nxt < N:
            run = await source.read(T, ledger_id, nxt, N - 1, max_bytes=100_000, into=into)
            if run.sums is not None:
                starts, crcs = run.sums.starts, run.sums.crcs
                assert len(starts) == len(crcs) + 1
                for k, crc in enumerate(crcs):
                    assert starts[k + 1] - starts[k] == CHUNK
                    assert crc == crc32c.crc32c(run.data[starts[k]:starts[k + 1]])
                count += len(crcs)
            nxt = run.last_entry_id + 1
        return count

    # 4 whole chunks in the log, runs of ~100 KB: chunk 0 lies inside the first run, chunk 2
    # (bytes 131,072..196,608) inside the second
    assert asyncio.run(pieces()) >= 2
