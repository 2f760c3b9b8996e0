"""Pulsar's compressed ManagedLedgerInfo envelope, built here from its documented layout.

::

    [0x47 0x78][int32 M][M bytes: ManagedLedgerInfoMetadata][body compressed with its type]
"""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from offloadd._proto import mldataformats_pb2 as pb
from offloadd.errors import FormatError
from offloadd.format.compression import Compression as CompressionType
from offloadd.metadata.envelope import unwrap
from offloadd.metadata.managed_ledger import decode as decode_managed_ledger_info


def varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def metadata(compression: int, size: int) -> bytes:
    # ManagedLedgerInfoMetadata: field 1 (varint) compressionType, field 2 (varint) size.
    return b"\x08" + varint(compression) + b"\x10" + varint(size)


def envelope(meta: bytes, body: bytes) -> bytes:
    return struct.pack(">hi", 0x4778, len(meta)) + meta + body


def java_deflate(data: bytes) -> bytes:
    """What Pulsar's ZLIB codec writes: zlib header, SYNC_FLUSH, never finished."""
    deflater = zlib.compressobj()
    return deflater.compress(data) + deflater.flush(zlib.Z_SYNC_FLUSH)


def sample_info(ledgers: int = 3) -> pb.ManagedLedgerInfo:
    info = pb.ManagedLedgerInfo()
    for i in range(ledgers):
        li = info.ledgerInfo.add()
        li.ledgerId, li.entries, li.size, li.timestamp = 10 + i, 100 * i, 4096 * i, 1_700_000_000
    info.properties.add(key="k", value="v")
    return info


class TestBareProtobuf:
    """A value without the magic is the ManagedLedgerInfo itself."""

    def test_bare_protobuf_decodes_unchanged(self) -> None:
        info = sample_info()
        assert decode_managed_ledger_info(info.SerializeToString()) == info

    def test_empty_value_is_an_empty_managed_ledger(self) -> None:
        # Pulsar creates the znode empty before the first ledger exists.
        assert decode_managed_ledger_info(b"") == pb.ManagedLedgerInfo()

    def test_junk_that_is_not_an_envelope_is_a_format_error(self) -> None:
        with pytest.raises(FormatError):
            decode_managed_ledger_info(b"\xff\xff\xff\xff", "/managed-ledgers/t")


class TestEnvelope:
    """The enveloped forms Pulsar writes decode to the same ManagedLedgerInfo."""

    def test_golden_uncompressed_envelope(self) -> None:
        # One ledger (id 7, 3 entries) wrapped with compressionType NONE, size 6.
        data = bytes.fromhex("4778" "00000004" "0800" "1006" "0a04" "0807" "1003")
        info = decode_managed_ledger_info(data)
        assert [(li.ledgerId, li.entries) for li in info.ledgerInfo] == [(7, 3)]

    def test_zlib_envelope_as_pulsar_writes_it_decodes(self) -> None:
        raw = sample_info(50).SerializeToString()
        body = java_deflate(raw)
        data = envelope(metadata(CompressionType.ZLIB, len(raw)), body)
        assert decode_managed_ledger_info(data) == sample_info(50)

    def test_finished_zlib_stream_also_decodes(self) -> None:
        raw = sample_info().SerializeToString()
        data = envelope(metadata(CompressionType.ZLIB, len(raw)), zlib.compress(raw))
        assert unwrap(data) == raw

    def test_unknown_metadata_fields_are_skipped(self) -> None:
        raw = sample_info().SerializeToString()
        meta = metadata(CompressionType.NONE, len(raw)) + b"\x1a\x02hi" + b"\x25\x00\x00\x00\x00"
        assert unwrap(envelope(meta, raw)) == raw

    @pytest.mark.parametrize("kind", [CompressionType.LZ4, CompressionType.ZSTD,
                                      CompressionType.SNAPPY])
    def test_codecs_without_a_decoder_are_refused_by_name(self, kind: CompressionType) -> None:
        data = envelope(metadata(kind, 10), b"\x00" * 10)
        with pytest.raises(FormatError, match=kind.name):
            decode_managed_ledger_info(data, "/managed-ledgers/t")

    @given(st.lists(st.tuples(st.integers(0, 2**62), st.integers(0, 2**40)), max_size=40),
           st.sampled_from([CompressionType.NONE, CompressionType.ZLIB]))
    def test_any_info_round_trips_through_an_envelope(
            self, ledgers: list[tuple[int, int]], kind: CompressionType) -> None:
        info = pb.ManagedLedgerInfo()
        for ledger_id, entries in ledgers:
            info.ledgerInfo.add(ledgerId=ledger_id, entries=entries)
        raw = info.SerializeToString()
        body = java_deflate(raw) if kind is CompressionType.ZLIB else raw
        assert decode_managed_ledger_info(envelope(metadata(kind, len(raw)), body)) == info


class TestBrokenEnvelopes:
    """Truncated or inconsistent envelopes raise FormatError naming the znode."""

    raw = sample_info().SerializeToString()

    @pytest.mark.parametrize("data", [
        pytest.param(b"\x47\x78\x00\x00", id="header-cut"),
        pytest.param(envelope(metadata(0, 5), b"")[:8], id="metadata-cut"),
        pytest.param(struct.pack(">hi", 0x4778, 1000) + b"\x08\x00", id="metadata-length-lies"),
        pytest.param(envelope(b"\x08\x02", raw), id="size-missing"),
        pytest.param(envelope(metadata(9, 4), b"abcd"), id="unknown-compression"),
        pytest.param(envelope(metadata(0, -1), b""), id="negative-size"),
        pytest.param(envelope(b"\x08\x00\x10\x80", raw), id="varint-cut"),
        pytest.param(envelope(b"\x0f\x00" + metadata(0, 1), b"x"), id="bad-wire-type"),
        pytest.param(envelope(metadata(CompressionType.ZLIB, 10), b"not zlib"), id="bad-zlib"),
    ])
    def test_malformed_envelope_is_a_format_error(self, data: bytes) -> None:
        with pytest.raises(FormatError, match="/managed-ledgers/t"):
            decode_managed_ledger_info(data, "/managed-ledgers/t")

    def test_body_shorter_than_announced_is_refused(self) -> None:
        data = envelope(metadata(CompressionType.NONE, len(self.raw) + 1), self.raw)
        with pytest.raises(FormatError, match="uncompressed"):
            unwrap(data)

    def test_zlib_body_longer_than_announced_is_refused(self) -> None:
        data = envelope(metadata(CompressionType.ZLIB, len(self.raw) - 1),
                        java_deflate(self.raw))
        with pytest.raises(FormatError, match="uncompressed"):
            unwrap(data)
