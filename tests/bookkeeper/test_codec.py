"""The wire codec and the fake bookie against the bytes a real bookie and BookKeeper's Java
client exchanged (``conformance/bookkeeper/``), plus junk, truncation and round trips."""

from __future__ import annotations

import asyncio
import os
import re
import zlib

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from offloadd._proto import bookkeeper_protocol_pb2 as pb
from offloadd.errors import FormatError
from offloadd.ledger.bookkeeper import codec
from offloadd.ledger.bookkeeper.codec import (
    AddRequest,
    AddResponse,
    DigestError,
    DigestType,
    ReadRequest,
    ReadResponse,
)
from tests.bookkeeper.pcap import CAPTURES, conversation, raw_streams
from tests.fixtures.fake_bookie import FakeBookie

# The captures live in the shared/ folder beside the checkout; CI always has it, so there a
# missing folder is a failure, not a skip.
needs_captures = pytest.mark.skipif(
    not CAPTURES.is_dir() and os.environ.get("CI") != "true",
    reason=f"BookKeeper captures not found at {CAPTURES} (set OFFLOADD_SHARED)")

PASSWORD = b"pw"
CRC32C = codec.digest_for(DigestType.CRC32C, PASSWORD)


def _samples() -> dict[str, bytes]:
    out = {}
    for line in (CAPTURES / "wire-samples.txt").read_text().splitlines():
        m = re.match(r"\[(v\d)\] (\w+ \w+)\s+\(\d+B\): ([0-9a-f]+)$", line)
        if m:
            out[f"{m.group(1)} {m.group(2)}"] = bytes.fromhex(m.group(3))
    return out


@needs_captures
class TestCapturedV3:
    """Every v3 frame of the capture decodes into our types and encodes back to its bytes."""

    def test_every_request_reencodes_byte_identically(self) -> None:
        requests, _ = conversation("bk-v3.pcap")
        assert len(requests) == 200
        kinds = set()
        for raw in requests:
            req = codec.decode_request(raw)
            kinds.add(type(req))
            assert codec.encode_request(req) == codec.frame(raw)
        assert kinds == {AddRequest, ReadRequest}

    def test_every_response_reencodes_byte_identically_by_either_decoder(self) -> None:
        _, responses = conversation("bk-v3.pcap")
        assert len(responses) == 200
        for raw in responses:
            slow = codec.decode_response(raw, fast_min=1 << 30)
            fast = codec.decode_response(raw, fast_min=0)
            assert slow == fast
            assert codec.encode_response(slow) == codec.frame(raw)
            assert codec.encode_response(fast) == codec.frame(raw)

    def test_responses_match_requests_by_txn_id(self) -> None:
        requests, responses = conversation("bk-v3.pcap")
        for req_raw, resp_raw in zip(requests, responses, strict=True):
            req, resp = codec.decode_request(req_raw), codec.decode_response(resp_raw)
            assert resp.txn_id == req.txn_id and resp.op == req.op

    def test_entry_bodies_verify_and_reencode(self) -> None:
        requests, responses = conversation("bk-v3.pcap")
        bodies = [r.body for r in map(codec.decode_request, requests)
                  if isinstance(r, AddRequest)]
        bodies += [r.body for r in map(codec.decode_response, responses)
                   if isinstance(r, ReadResponse)]
        assert len(bodies) == 200
        for body in bodies:
            assert body is not None
            e = codec.decode_entry(body, CRC32C)
            assert bytes(e.payload) == f"entry-{e.entry_id}".encode()
            assert e.lac == e.entry_id - 1
            assert codec.encode_entry(CRC32C, e.ledger_id, e.entry_id, e.lac, e.length,
                                      e.payload) == bytes(body)

    def test_add_requests_carry_the_master_key_of_the_password(self) -> None:
        requests, _ = conversation("bk-v3.pcap")
        add = codec.decode_request(requests[0])
        assert isinstance(add, AddRequest)
        assert add.master_key == codec.master_key(PASSWORD)

    def test_documented_samples(self) -> None:
        s = _samples()
        req = codec.decode_request(s["v3 READ_ENTRY request"][4:])
        assert req == ReadRequest(101, 1, 0)
        assert codec.encode_read_request(req) == s["v3 READ_ENTRY request"]
        resp = codec.decode_response(s["v3 READ_ENTRY response"][4:])
        assert isinstance(resp, ReadResponse) and resp.max_lac == 98
        e = codec.decode_entry(resp.body or b"", CRC32C, ledger_id=1, entry_id=0)
        assert bytes(e.payload) == b"entry-0" and e.lac == -1 and e.length == 7
        for key in ("v3 ADD_ENTRY request",):
            assert codec.encode_request(codec.decode_request(s[key][4:])) == s[key]
        assert codec.encode_response(codec.decode_response(s["v3 ADD_ENTRY response"][4:])) \
            == s["v3 ADD_ENTRY response"]


@needs_captures
class TestCapturedV2:
    """The legacy protocol's frames decode and re-encode too (the captures use CRC32C)."""

    def test_every_frame_reencodes_byte_identically(self) -> None:
        requests, responses = conversation("bk-v2.pcap")
        for raw in requests:
            assert codec.encode_v2(codec.decode_v2_request(raw)) == codec.frame(raw)
        for raw in responses:
            assert codec.encode_v2(codec.decode_v2_response(raw)) == codec.frame(raw)

    def test_read_responses_hold_verifiable_entries(self) -> None:
        _, responses = conversation("bk-v2.pcap")
        reads = [r for r in map(codec.decode_v2_response, responses)
                 if isinstance(r, codec.V2ReadResponse)]
        assert len(reads) == 100
        for r in reads:
            e = codec.decode_entry(r.body, CRC32C, ledger_id=r.ledger_id, entry_id=r.entry_id)
            assert bytes(e.payload) == f"entry-{r.entry_id}".encode()


@needs_captures
class TestFakeBookieAgainstCapture:
    """Replaying the Java client's bytes to the fake bookie yields the real bookie's bytes."""

    @pytest.mark.timeout(20)
    async def test_replayed_conversation_is_answered_byte_for_byte(self) -> None:
        sent, answered = raw_streams("bk-v3.pcap")
        bookie = await FakeBookie().start()
        try:
            reader, writer = await asyncio.open_connection(bookie.host, bookie.port)
            writer.write(sent)
            await writer.drain()
            got = await asyncio.wait_for(reader.readexactly(len(answered)), 10)
            writer.close()
            await writer.wait_closed()
        finally:
            await bookie.kill()
        ours, _ = codec.split_frames(got)
        theirs, _ = codec.split_frames(answered)
        assert len(ours) == len(theirs) == 200
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert bytes(a) == bytes(b), f"response {i} differs: {bytes(a).hex()} vs " \
                f"{bytes(b).hex()}"


class TestDigests:
    """Each digest type covers the 32-byte header and the payload."""

    HEADER = bytes(range(32))

    def test_crc32_is_a_long_with_the_crc_in_its_low_half(self) -> None:
        d = codec.digest_for(DigestType.CRC32, b"")
        sig = d.sign(self.HEADER, b"payload")
        assert len(sig) == 8 and sig[:4] == b"\0\0\0\0"
        assert int.from_bytes(sig, "big") == zlib.crc32(self.HEADER + b"payload")

    def test_crc32c_is_four_bytes(self) -> None:
        sig = CRC32C.sign(self.HEADER, b"payload")
        assert int.from_bytes(sig, "big") == crc32c.crc32c(self.HEADER + b"payload")

    def test_hmac_is_keyed_by_the_mac_digest_of_the_password(self) -> None:
        import hashlib
        import hmac

        d = codec.digest_for(DigestType.HMAC, b"secret")
        key = hashlib.sha1(b"mac" + b"secret").digest()
        assert d.sign(self.HEADER, b"p") == hmac.new(key, self.HEADER + b"p",
                                                     hashlib.sha1).digest()

    @pytest.mark.parametrize("kind", list(DigestType))
    def test_every_type_round_trips_and_catches_a_flipped_byte(self, kind: DigestType) -> None:
        d = codec.digest_for(kind, b"pw")
        body = codec.encode_entry(d, 9, 4, 3, 100, b"hello world")
        e = codec.decode_entry(body, d, ledger_id=9, entry_id=4)
        assert (e.ledger_id, e.entry_id, e.lac, e.length) == (9, 4, 3, 100)
        assert bytes(e.payload) == b"hello world"
        damaged = bytearray(body)
        damaged[-1] ^= 1
        if kind is DigestType.DUMMY:
            codec.decode_entry(bytes(damaged), d)
        else:
            with pytest.raises(DigestError):
                codec.decode_entry(bytes(damaged), d)

    def test_hmac_with_the_wrong_password_is_a_digest_error(self) -> None:
        body = codec.encode_entry(codec.digest_for(DigestType.HMAC, b"a"), 1, 0, -1, 1, b"x")
        with pytest.raises(DigestError, match="password"):
            codec.decode_entry(body, codec.digest_for(DigestType.HMAC, b"b"))

    def test_unknown_digest_type_is_refused(self) -> None:
        with pytest.raises(FormatError):
            codec.digest_for(9, b"")


class TestJunk:
    """Bytes that are not BookKeeper's are refused with FormatError, never misread."""

    def test_truncated_entry_body(self) -> None:
        with pytest.raises(FormatError, match="shorter"):
            codec.decode_entry(b"\0" * 35, CRC32C)

    def test_entry_of_another_id(self) -> None:
        body = codec.encode_entry(CRC32C, 1, 5, 4, 1, b"x")
        with pytest.raises(FormatError, match="expected 1:6"):
            codec.decode_entry(body, CRC32C, ledger_id=1, entry_id=6)

    @pytest.mark.parametrize("junk", [b"", b"\xff\xff", b"\x0a\x02\x08\x03", b"hello world"])
    def test_junk_requests_and_responses(self, junk: bytes) -> None:
        with pytest.raises(FormatError):
            codec.decode_request(junk)
        with pytest.raises(FormatError):
            codec.decode_response(junk)

    def test_a_v2_header_in_a_v3_decoder_is_refused(self) -> None:
        with pytest.raises(FormatError):
            codec.decode_request(bytes.fromhex("0202000000000000000000020000000000000000"))

    def test_oversized_frame_is_refused(self) -> None:
        with pytest.raises(FormatError, match="exceeds"):
            codec.split_frames(b"\x7f\xff\xff\xff" + b"x" * 10)

    def test_partial_frames_wait_for_more(self) -> None:
        frames, used = codec.split_frames(codec.frame(b"abc") + b"\0\0\0\x05ab")
        assert [bytes(f) for f in frames] == [b"abc"] and used == 7

    @given(st.binary(max_size=64))
    @settings(max_examples=200, deadline=None)
    def test_fast_response_parser_never_disagrees_with_protobuf(self, junk: bytes) -> None:
        try:
            expected = codec.decode_response(junk, fast_min=1 << 30)
        except FormatError:
            expected = None
        try:
            got = codec.decode_response(junk, fast_min=0)
        except FormatError:
            got = None
        if expected is not None and got is not None:
            assert got == expected


_i64 = st.integers(-(2**63), 2**63 - 1)
_u64 = st.integers(0, 2**64 - 1)
_opt = st.one_of(st.none(), _i64)


class TestHandWrittenEncodersMatchProtobuf:
    """The hot-path encoders produce exactly what the generated protobuf code would."""

    @given(_u64, _i64, _i64, st.one_of(st.none(), st.binary(max_size=20)), _opt, _opt,
           st.one_of(st.none(), st.sampled_from([1, 2])),
           st.one_of(st.none(), st.integers(0, 2**32 - 1)))
    @settings(max_examples=300, deadline=None)
    def test_read_request(self, txn: int, ledger: int, entry: int, key: bytes | None,
                          prev: int | None, timeout: int | None, flag: int | None,
                          prio: int | None) -> None:
        req = ReadRequest(txn, ledger, entry, key, prev, timeout, flag, prio)
        msg = pb.Request()
        msg.header.version, msg.header.operation, msg.header.txnId = 3, 1, txn  # type: ignore[assignment]
        if prio is not None:
            msg.header.priority = prio
        r = msg.readRequest
        r.ledgerId, r.entryId = ledger, entry
        if key is not None:
            r.masterKey = key
        if prev is not None:
            r.previousLAC = prev
        if timeout is not None:
            r.timeOut = timeout
        if flag is not None:
            r.flag = flag  # type: ignore[assignment]
        assert codec.encode_read_request(req) == codec.frame(msg.SerializeToString())
        assert codec.decode_request(codec.encode_read_request(req)[4:]) == req

    @given(st.integers(0, 2**40), _i64, st.lists(_i64, min_size=1, max_size=20))
    @settings(max_examples=100, deadline=None)
    def test_batched_plain_reads(self, txn: int, ledger: int, entries: list[int]) -> None:
        one_by_one = b"".join(codec.encode_read_request(ReadRequest(txn + i, ledger, e))
                              for i, e in enumerate(entries))
        assert codec.encode_plain_reads(txn, ledger, entries) == one_by_one

    @given(_u64, st.sampled_from([0, 402, 403, 501]), st.one_of(st.none(), st.sampled_from(
        [0, 402, 403])), _i64, _i64, st.one_of(st.none(), st.binary(max_size=300)), _opt, _opt)
    @settings(max_examples=300, deadline=None)
    def test_read_response(self, txn: int, status: int, rstatus: int | None, ledger: int,
                           entry: int, body: bytes | None, max_lac: int | None,
                           ts: int | None) -> None:
        resp = ReadResponse(txn, status, rstatus, ledger if rstatus is not None else 0,
                            entry if rstatus is not None else 0,
                            body if rstatus is not None else None,
                            max_lac if rstatus is not None else None,
                            ts if rstatus is not None else None)
        msg = pb.Response()
        msg.header.version, msg.header.operation, msg.header.txnId = 3, 1, txn  # type: ignore[assignment]
        msg.status = status  # type: ignore[assignment]
        if rstatus is not None:
            r = msg.readResponse
            r.status, r.ledgerId, r.entryId = rstatus, ledger, entry  # type: ignore[assignment]
            if body is not None:
                r.body = body
            if max_lac is not None:
                r.maxLAC = max_lac
            if ts is not None:
                r.lacUpdateTimestamp = ts
        wire = codec.encode_response(resp)
        assert wire == codec.frame(msg.SerializeToString())
        for fast_min in (0, 1 << 30):
            assert codec.decode_response(wire[4:], fast_min=fast_min) == resp

    def test_add_response_round_trip(self) -> None:
        resp = AddResponse(7, 0, 0, 3, 4)
        assert codec.decode_response(codec.encode_response(resp)[4:]) == resp
