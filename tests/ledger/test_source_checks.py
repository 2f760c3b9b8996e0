"""Bit rot in the embedded store's files never reaches the tier (issue 13, defect 6).

Reads check every byte they hand out against the store's own checksums, by default: the ``.sum``
chunk CRCs over ``.log``, the ``.osum`` chunk CRCs over ``.off``, and each entry's frame header
and payload CRC32C (``.crc``) where no chunk record covers the bytes (a ledger still being
written, a ledger written before the records existed) or where a chunk does not match. The
damage here is hostile: every offset byte, header bytes, payloads, the records themselves, in
closed and open ledgers, with and without chunk records.
"""

from __future__ import annotations

import logging
import os
import struct
from pathlib import Path

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from offloadd.errors import FormatError, NotFound
from offloadd.ledger.local import (
    CHUNK,
    OFF_CHUNK,
    LocalLedgerSource,
    LocalLedgerWriter,
    RolloverPolicy,
    chunk_sums,
    ledger_files,
)
from offloadd.metadata.base import MetadataStore
from offloadd.metadata.memory import MemoryMetadataStore
from offloadd.model import FRAME_OVERHEAD, EntryRun, Position, TopicName

T = TopicName.parse("persistent://public/default/rot")
ENTRY = 1000
N = 300  # ~300 KB of frames: four whole 64 KiB chunks of .log, two of .off, and a tail


def payload(i: int) -> bytes:
    return (i.to_bytes(4, "big") * (ENTRY // 4 + 1))[:ENTRY - 7] + bytes([i % 251]) * 7


@pytest.fixture
def metadata() -> MetadataStore:
    return MemoryMetadataStore()


async def write(path: Path, md: MetadataStore, n: int = N, *, close: bool = True,
                batch: int = 37) -> Position:
    writer = LocalLedgerWriter(path, md, RolloverPolicy(max_entries=10**6))
    pos = Position(-1, -1)
    for i in range(0, n, batch):
        pos = await writer.append(T, [payload(j) for j in range(i, min(i + batch, n))])
    if close:
        await writer.close()
    return pos


def flip(path: Path, at: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0x10
    path.write_bytes(bytes(raw))


def entries(run: EntryRun) -> list[bytes]:
    o = run.offsets
    return [bytes(run.data[o[i] + FRAME_OVERHEAD:o[i + 1]]) for i in range(run.count)]


async def read_all(source: LocalLedgerSource, ledger_id: int, n: int = N) -> list[bytes]:
    """Every entry, in reads of ~100 KB as the offloader makes them (runs start mid-chunk)."""
    out: list[bytes] = []
    while len(out) < n:
        run = await source.read(T, ledger_id, len(out), n - 1, max_bytes=100_000)
        out += entries(run)
    return out


class TestChunkRecords:
    """What the writer records: one CRC32C per whole chunk, whatever the batches were."""

    @settings(max_examples=60, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.lists(st.integers(1, 3 * CHUNK), min_size=1, max_size=12), st.integers(1, 4096))
    def test_records_are_the_crc_of_every_whole_chunk(self, sizes: list[int],
                                                      chunk: int) -> None:
        data = os.urandom(sum(sizes))
        records, partial, start = b"", 0, 0
        for n in sizes:
            more, partial = chunk_sums(data[start:start + n], start, partial, chunk)
            records += more
            start += n
        whole = len(data) // chunk
        want = b"".join(struct.pack("<I", crc32c.crc32c(data[k * chunk:(k + 1) * chunk]))
                        for k in range(whole))
        assert records == want
        assert partial == crc32c.crc32c(data[whole * chunk:])

    async def test_the_writer_keeps_sum_and_osum_with_the_files(
            self, tmp_path: Path, metadata: MetadataStore) -> None:
        pos = await write(tmp_path, metadata)
        f = ledger_files(tmp_path, pos.ledger_id)
        log, off = f.log.read_bytes(), f.off.read_bytes()
        assert f.sum.read_bytes() == chunk_sums(log, 0, 0)[0]
        assert f.osum.read_bytes() == chunk_sums(off, 0, 0, OFF_CHUNK)[0]
        assert len(log) // CHUNK == 4 and len(off) // OFF_CHUNK == 2


class TestRotIsCaught:
    """Damage anywhere a read depends on raises FormatError naming topic, ledger, entry and
    file; damage nowhere a read depends on changes nothing."""

    async def test_a_flipped_payload_bit_in_a_chunk_covered_range(
            self, tmp_path: Path, metadata: MetadataStore) -> None:
        pos = await write(tmp_path, metadata)
        f = ledger_files(tmp_path, pos.ledger_id)
        victim = 150  # in the third chunk
        start = struct.unpack("<q", f.off.read_bytes()[8 * victim:8 * victim + 8])[0]
        flip(f.log, start + FRAME_OVERHEAD + 500)
        source = LocalLedgerSource(tmp_path, metadata)  # checks by default
        with pytest.raises(FormatError) as err:
            await read_all(source, pos.ledger_id)
        said = str(err.value)
        assert f"{f.log} (topic {T}, ledger {pos.ledger_id}) at byte {start}" in said, said
        assert f"entry {victim}: payload CRC32C" in said and "never skipped" in said, said
        trusting = LocalLedgerSource(tmp_path, metadata, verify_crc=False)
        assert (await read_all(trusting, pos.ledger_id))[victim] != payload(victim)

    async def test_a_flipped_bit_in_a_frame_header(self, tmp_path: Path,
                                                   metadata: MetadataStore) -> None:
        pos = await write(tmp_path, metadata)
        f = ledger_files(tmp_path, pos.ledger_id)
        start = struct.unpack("<q", f.off.read_bytes()[8 * 70:8 * 71])[0]
        flip(f.log, start + 11)  # the low byte of the entry id
        with pytest.raises(FormatError, match=r"entry 70: its frame header says entry 86 of"):
            await read_all(LocalLedgerSource(tmp_path, metadata), pos.ledger_id)

    async def test_every_bit_flip_in_the_offsets_is_caught_or_harmless(
            self, tmp_path: Path, metadata: MetadataStore) -> None:
        pos = await write(tmp_path, metadata)
        f = ledger_files(tmp_path, pos.ledger_id)
        good = f.off.read_bytes()
        wrong, unnamed = 0, []
        for at in range(0, len(good), 3):  # every third byte of every record
            flip(f.off, at)
            try:
                got = await read_all(LocalLedgerSource(tmp_path, metadata), pos.ledger_id)
                wrong += got != [payload(i) for i in range(N)]
            except FormatError as exc:
                if str(f.log) not in str(exc) and str(f.off) not in str(exc):
                    unnamed.append(str(exc))
            except NotFound as exc:  # the last record: its frame no longer fits the log
                if f"of ledger {pos.ledger_id} are not all readable" not in str(exc):
                    unnamed.append(str(exc))
            f.off.write_bytes(good)
        assert wrong == 0
        assert unnamed == []

    async def test_flips_across_the_log_are_caught(self, tmp_path: Path,
                                                   metadata: MetadataStore) -> None:
        pos = await write(tmp_path, metadata)
        f = ledger_files(tmp_path, pos.ledger_id)
        good = f.log.read_bytes()
        for at in range(5, len(good), 2999):
            flip(f.log, at)
            with pytest.raises(FormatError, match=rf"topic {T}, ledger {pos.ledger_id}\) at "
                                                  r"byte \d+: entry \d+: "):
                await read_all(LocalLedgerSource(tmp_path, metadata), pos.ledger_id)
            f.log.write_bytes(good)

    async def test_the_tail_of_a_ledger_still_being_written_is_checked_entry_by_entry(
            self, tmp_path: Path, metadata: MetadataStore) -> None:
        pos = await write(tmp_path, metadata, close=False)
        f = ledger_files(tmp_path, pos.ledger_id)
        last = struct.unpack("<q", f.off.read_bytes()[-8:])[0]
        assert last > 4 * CHUNK  # past the last whole chunk: no record covers it
        flip(f.log, last + FRAME_OVERHEAD + 3)
        with pytest.raises(FormatError, match=rf"entry {N - 1}: payload CRC32C"):
            await read_all(LocalLedgerSource(tmp_path, metadata), pos.ledger_id)

    async def test_a_ledger_written_without_chunk_records_is_checked_entry_by_entry(
            self, tmp_path: Path, metadata: MetadataStore) -> None:
        pos = await write(tmp_path, metadata)
        f = ledger_files(tmp_path, pos.ledger_id)
        f.sum.unlink()
        f.osum.unlink()
        source = LocalLedgerSource(tmp_path, metadata)
        assert await read_all(source, pos.ledger_id) == [payload(i) for i in range(N)]
        start = struct.unpack("<q", f.off.read_bytes()[8 * 20:8 * 21])[0]
        flip(f.log, start + 100)
        with pytest.raises(FormatError, match=r"entry 20: payload CRC32C"):
            await read_all(source, pos.ledger_id)

    async def test_a_rotten_chunk_record_alone_is_reported_and_the_entries_still_read(
            self, tmp_path: Path, metadata: MetadataStore,
            caplog: pytest.LogCaptureFixture) -> None:
        pos = await write(tmp_path, metadata)
        f = ledger_files(tmp_path, pos.ledger_id)
        flip(f.sum, 5)
        flip(f.osum, 2)
        with caplog.at_level(logging.WARNING, "offloadd.ledger.local"):
            got = await read_all(LocalLedgerSource(tmp_path, metadata), pos.ledger_id)
        assert got == [payload(i) for i in range(N)]
        assert f"do not match their chunk checksum in {f.sum}" in caplog.text
        assert f"do not match their chunk checksum in {f.osum}" in caplog.text


async def test_a_crashed_writers_ledger_keeps_consistent_records(
        tmp_path: Path, metadata: MetadataStore) -> None:
    """Torn bytes past the last whole entry are cut from every file, records included, so the
    next writer's close leaves a ledger every read of which checks out."""
    pos = await write(tmp_path, metadata, close=False)
    f = ledger_files(tmp_path, pos.ledger_id)
    with f.log.open("ab") as log:  # a dead writer's torn batch: frames and a record, no offset
        log.write(os.urandom(3 * CHUNK))
    with f.sum.open("ab") as s:
        s.write(os.urandom(12))
    nxt = LocalLedgerWriter(tmp_path, metadata)
    await nxt.append(T, [b"after the crash"])
    await nxt.close()
    assert f.sum.read_bytes() == chunk_sums(f.log.read_bytes(), 0, 0)[0]
    got = await read_all(LocalLedgerSource(tmp_path, metadata), pos.ledger_id)
    assert got == [payload(i) for i in range(N)]
