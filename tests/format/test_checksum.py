"""The per-block CRC32C: who decides that a block must carry one (the object's metadata, never
the block's own mark)."""

from __future__ import annotations

import struct

import pytest

from offloadd.errors import FormatError
from offloadd.format import StreamingObjectBuilder
from offloadd.format.block import HEADER_LEN
from offloadd.format.checksum import CHECKSUM_OFFSET, stamp_block, verify_block_checksum
from offloadd.model import EntryRun
from offloadd.model.objects import blocks_checksummed, object_metadata


def block() -> bytearray:
    """One stamped streaming block holding entries 0 and 1 of ledger 7."""
    frames = b"".join(struct.pack(">iq", len(p), i) + p for i, p in enumerate([b"abc", b"de"]))
    run = EntryRun(7, 0, memoryview(frames), [0, 15, 29])
    (block,) = StreamingObjectBuilder(max_block_size=4096, min_block_size=0).add_run(run)
    return bytearray(b"".join(bytes(b) for b in stamp_block(block).buffers))


class TestRequiredChecksums:
    """A block of an object whose metadata says "checksummed" must carry a valid mark and CRC."""

    def test_a_stamped_block_passes(self) -> None:
        b = block()
        assert verify_block_checksum(b, 0, len(b), "obj", required=True)

    def test_a_damaged_mark_is_an_error_when_required(self) -> None:
        b = block()
        b[CHECKSUM_OFFSET + 1] ^= 0x01
        b[HEADER_LEN + 13] ^= 0x01  # and a payload byte
        with pytest.raises(FormatError, match="at byte 36: block checksum mark damaged"):
            verify_block_checksum(b, 0, len(b), "obj", required=True)

    def test_without_trusted_metadata_an_unmarked_block_is_read_unchecked(self) -> None:
        b = block()
        b[CHECKSUM_OFFSET:CHECKSUM_OFFSET + 8] = bytes(8)  # as Pulsar writes it: zeros
        assert verify_block_checksum(b, 0, len(b), "obj") is False

    def test_a_payload_flip_under_a_good_mark_is_a_mismatch(self) -> None:
        b = block()
        b[HEADER_LEN + 13] ^= 0x01
        with pytest.raises(FormatError, match="block checksum mismatch"):
            verify_block_checksum(b, 0, len(b), "obj")


def test_offloadd_metadata_says_checksummed_and_pulsars_does_not() -> None:
    assert blocks_checksummed(object_metadata("t/ns/persistent/x", "index"))
    # an object offloadd wrote before the explicit key existed
    assert blocks_checksummed({"offloadd-format-version": "1"})
    assert not blocks_checksummed({"s3managedledgeroffloaderformatversion": "1",
                                   "role": "index", "managedledgername": "t/ns/persistent/x"})
