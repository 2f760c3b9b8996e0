"""The wire codecs and the fake bookie against the bytes a real bookie and BookKeeper's Java
client exchanged (``conformance/bookkeeper/``), plus junk, truncation and round trips. The
reader's side is offloadd's (:mod:`~offloadd.ledger.bookkeeper.v2`, ``v3``, ``codec``); the
bookie's and writer's side is test code (:mod:`tests.fixtures.bookie_wire`)."""

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
from offloadd.ledger.bookkeeper import codec, v2, v3
from offloadd.ledger.bookkeeper.codec import DigestError, DigestType, Status
from offloadd.ledger.bookkeeper.v3 import ReadRequest, ReadResponse
from tests.bookkeeper.pcap import CAPTURES, conversation, raw_streams
from tests.fixtures import bookie_wire as wire
from tests.fixtures.bookie_wire import AddRequest, AddResponse
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
            req = wire.decode_request(raw)
            kinds.add(type(req))
            assert wire.encode_request(req) == codec.frame(raw)
        assert kinds == {AddRequest, ReadRequest}

    def test_every_response_reencodes_byte_identically_by_either_decoder(self) -> None:
        _, responses = conversation("bk-v3.pcap")
        assert len(responses) == 200
        for raw in responses:
            slow = wire.decode_any_response(raw)
            assert wire.encode_response(slow) == codec.frame(raw)
            if isinstance(slow, ReadResponse):  # what offloadd decodes, by either parser
                fast = v3.decode_response(raw, fast_min=0)
                assert v3.decode_response(raw, fast_min=1 << 30) == fast == slow

    def test_responses_match_requests_by_txn_id(self) -> None:
        requests, responses = conversation("bk-v3.pcap")
        for req_raw, resp_raw in zip(requests, responses, strict=True):
            req, resp = wire.decode_request(req_raw), wire.decode_any_response(resp_raw)
            assert resp.txn_id == req.txn_id
            assert isinstance(resp, ReadResponse) == isinstance(req, ReadRequest)

    def test_entry_bodies_verify_and_reencode(self) -> None:
        requests, responses = conversation("bk-v3.pcap")
        bodies = [r.body for r in map(wire.decode_request, requests)
                  if isinstance(r, AddRequest)]
        bodies += [r.body for r in map(wire.decode_any_response, responses)
                   if isinstance(r, ReadResponse) and r.body is not None]
        assert len(bodies) == 200
        for body in bodies:
            assert body is not None
            e = codec.decode_entry(body, CRC32C)
            assert bytes(e.payload) == f"entry-{e.entry_id}".encode()
            assert e.lac == e.entry_id - 1
            assert wire.encode_entry(CRC32C, e.ledger_id, e.entry_id, e.lac, e.length,
                                     e.payload) == bytes(body)

    def test_add_requests_carry_the_master_key_of_the_password(self) -> None:
        requests, _ = conversation("bk-v3.pcap")
        add = wire.decode_request(requests[0])
        assert isinstance(add, AddRequest)
        assert add.master_key == wire.master_key(PASSWORD)

    def test_documented_samples(self) -> None:
        s = _samples()
        req = wire.decode_request(s["v3 READ_ENTRY request"][4:])
        assert req == ReadRequest(101, 1, 0)
        assert v3.encode_read_request(req) == s["v3 READ_ENTRY request"]
        resp = v3.decode_response(s["v3 READ_ENTRY response"][4:])
        assert isinstance(resp, ReadResponse) and resp.max_lac == 98
        e = codec.decode_entry(resp.body or b"", CRC32C, ledger_id=1, entry_id=0)
        assert bytes(e.payload) == b"entry-0" and e.lac == -1 and e.length == 7
        for key in ("v3 ADD_ENTRY request",):
            assert wire.encode_request(wire.decode_request(s[key][4:])) == s[key]
        added = wire.decode_any_response(s["v3 ADD_ENTRY response"][4:])
        assert wire.encode_response(added) == s["v3 ADD_ENTRY response"]


@needs_captures
class TestCapturedV2:
    """Protocol v2, what offloadd reads with: its requests are the Java client's bytes, the real
    bookie's answers parse and verify, and every frame of the capture round-trips."""

    def test_every_frame_reencodes_byte_identically(self) -> None:
        requests, responses = conversation("bk-v2.pcap")
        for raw in requests:
            assert wire.encode_v2(wire.decode_v2_request(raw)) == codec.frame(raw)
        for raw in responses:
            assert wire.encode_v2(wire.decode_v2_response(raw)) == codec.frame(raw)

    def test_offloadds_read_requests_are_the_java_clients_bytes(self) -> None:
        requests, _ = conversation("bk-v2.pcap")
        decoded = [wire.decode_v2_request(r) for r in requests]
        reads = [r for r in decoded if isinstance(r, wire.V2ReadRequest)]
        assert len(reads) == 100 and {r.ledger_id for r in reads} == {2}
        ids = [r.entry_id for r in reads]
        theirs = b"".join(codec.frame(r) for r in requests[-100:])
        assert v2.encode_reads(2, ids) == theirs
        assert v2.encode_reads(2, [0]) == _samples()["v2 READ_ENTRY request"]

    def test_the_bookies_answers_parse_in_one_pass_and_verify(self) -> None:
        _, responses = conversation("bk-v2.pcap")
        reads = b"".join(codec.frame(r) for r in responses[100:])  # after the 100 add answers
        got = list(v2.iter_responses(memoryview(reads), "capture"))
        assert len(got) == 100 and got[-1][0] == len(reads)
        assert {(op, status, ledger) for _, op, status, ledger, _, _, _ in got} == \
            {(v2.READ, Status.EOK, 2)}
        ids = [entry for _, _, _, _, entry, _, _ in got]
        checked = codec.check_bodies([body for *_, body in got], ids, 2, CRC32C, "capture")
        assert not checked.failed
        assert [bytes(p or b"") for p in checked.payloads] == \
            [f"entry-{e}".encode() for e in ids]
        assert checked.tail == (99, 98, sum(len(f"entry-{e}") for e in range(100)))

    def test_read_responses_hold_verifiable_entries(self) -> None:
        _, responses = conversation("bk-v2.pcap")
        reads = [r for r in map(wire.decode_v2_response, responses)
                 if isinstance(r, wire.V2ReadResponse)]
        assert len(reads) == 100
        for r in reads:
            e = codec.decode_entry(r.body, CRC32C, ledger_id=r.ledger_id, entry_id=r.entry_id)
            assert bytes(e.payload) == f"entry-{r.entry_id}".encode()

    def test_documented_samples(self) -> None:
        s = _samples()
        (_, op, status, ledger, entry, _, body), = v2.iter_responses(
            memoryview(s["v2 READ_ENTRY response"]), "sample")
        assert (op, status, ledger, entry) == (v2.READ, Status.EOK, 2, 0)
        assert body is not None
        assert bytes(codec.decode_entry(body, CRC32C, ledger_id=2, entry_id=0).payload) == \
            b"entry-0"
        for key in ("v2 ADD_ENTRY request", "v2 ADD_ENTRY response"):
            msg = (wire.decode_v2_request if "request" in key else wire.decode_v2_response)(
                s[key][4:])
            assert wire.encode_v2(msg) == s[key]


@needs_captures
class TestFakeBookieAgainstCapture:
    """Replaying the Java client's bytes to the fake bookie yields the real bookie's bytes."""

    @pytest.mark.timeout(20)
    @pytest.mark.parametrize("capture", ["bk-v3.pcap", "bk-v2.pcap"])
    async def test_replayed_conversation_is_answered_byte_for_byte(self, capture: str) -> None:
        sent, answered = raw_streams(capture)
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
        body = wire.encode_entry(d, 9, 4, 3, 100, b"hello world")
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
        body = wire.encode_entry(codec.digest_for(DigestType.HMAC, b"a"), 1, 0, -1, 1, b"x")
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
        body = wire.encode_entry(CRC32C, 1, 5, 4, 1, b"x")
        with pytest.raises(FormatError, match="expected 1:6"):
            codec.decode_entry(body, CRC32C, ledger_id=1, entry_id=6)

    @pytest.mark.parametrize("junk", [b"", b"\xff\xff", b"\x0a\x02\x08\x03", b"hello world"])
    def test_junk_requests_and_responses(self, junk: bytes) -> None:
        with pytest.raises(FormatError):
            wire.decode_request(junk)
        with pytest.raises(FormatError):
            v3.decode_response(junk)

    def test_a_v2_header_in_a_v3_decoder_is_refused(self) -> None:
        with pytest.raises(FormatError):
            wire.decode_request(bytes.fromhex("0202000000000000000000020000000000000000"))

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
            expected = v3.decode_response(junk, fast_min=1 << 30)
        except FormatError:
            expected = None
        try:
            got = v3.decode_response(junk, fast_min=0)
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
        assert v3.encode_read_request(req) == codec.frame(msg.SerializeToString())
        assert wire.decode_request(v3.encode_read_request(req)[4:]) == req

    @given(st.integers(0, 2**40), _i64, st.lists(_i64, min_size=1, max_size=20))
    @settings(max_examples=100, deadline=None)
    def test_batched_plain_reads(self, txn: int, ledger: int, entries: list[int]) -> None:
        one_by_one = b"".join(v3.encode_read_request(ReadRequest(txn + i, ledger, e))
                              for i, e in enumerate(entries))
        assert v3.encode_plain_reads(txn, ledger, entries) == one_by_one

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
        data = wire.encode_response(resp)
        assert data == codec.frame(msg.SerializeToString())
        for fast_min in (0, 1 << 30):
            assert v3.decode_response(data[4:], fast_min=fast_min) == resp

    def test_add_response_round_trip(self) -> None:
        resp = AddResponse(7, 0, 0, 3, 4)
        assert wire.decode_any_response(wire.encode_response(resp)[4:]) == resp


_ids = st.lists(_i64, min_size=1, max_size=40)


class TestV2ReadSide:
    """offloadd's v2 encoders and its one-pass parser agree with the message-by-message
    codec of the bookie's side, and refuse what is not an answer to a read."""

    @given(_i64, _ids)
    @settings(max_examples=200, deadline=None)
    def test_reads_in_one_buffer_are_the_requests_one_by_one(self, ledger: int,
                                                             ids: list[int]) -> None:
        one_by_one = b"".join(wire.encode_v2(wire.V2ReadRequest(ledger, e)) for e in ids)
        assert v2.encode_reads(ledger, ids) == one_by_one

    @given(_i64, _i64, _i64, st.integers(-(2**31), 2**31 - 1), _i64)
    @settings(max_examples=100, deadline=None)
    def test_batched_read_request(self, ledger: int, first: int, rid: int, count: int,
                                  size: int) -> None:
        data = v2.encode_batch_read(ledger, first, rid, count, size)
        assert wire.decode_v2_request(data[4:]) == wire.V2BatchReadRequest(ledger, first, rid,
                                                                           count, size)
        assert wire.encode_v2(wire.decode_v2_request(data[4:])) == data

    _answers = st.lists(st.one_of(
        st.builds(wire.V2ReadResponse, st.sampled_from([0, 1, 2, 101]), _i64, _i64,
                  st.binary(max_size=80)),
        st.builds(wire.V2BatchReadResponse, st.sampled_from([0, 2, 100]), _i64, _i64, _i64,
                  st.lists(st.binary(max_size=60), max_size=5))), max_size=8)

    @given(_answers, st.integers(0, 50))
    @settings(max_examples=200, deadline=None)
    def test_one_pass_over_a_stream_of_answers(self, answers: list[object], cut: int) -> None:
        data = b"".join(wire.encode_v2(a) for a in answers)  # type: ignore[arg-type]
        got = list(v2.iter_responses(memoryview(data), "test"))
        assert len(got) == len(answers)
        for (_, op, status, ledger, entry, rid, body), a in zip(got, answers, strict=True):
            assert status == v2.status_of(a.rc)  # type: ignore[attr-defined]
            if isinstance(a, wire.V2ReadResponse):
                assert (op, ledger, entry, rid) == (v2.READ, a.ledger_id, a.entry_id, 0)
                assert (bytes(body) if body is not None else None) == \
                    (a.body if a.rc == 0 else None)
            else:
                assert isinstance(a, wire.V2BatchReadResponse)
                assert (op, ledger, entry, rid) == (v2.BATCH_READ, a.ledger_id,
                                                    a.first_entry_id, a.request_id)
                if a.rc == 0:
                    assert body is not None
                    assert [bytes(b) for b in v2.split_batch(body, "t")] == \
                        [bytes(b) for b in a.bodies]
        # a stream cut short: the complete answers before the cut, nothing of the rest
        short = data[:max(len(data) - cut, 0)]
        ends = [end for end, *_ in v2.iter_responses(memoryview(short), "test")]
        assert ends == [end for end, *_ in got if end <= len(short)]

    def test_an_answer_to_something_else_is_refused(self) -> None:
        add = wire.encode_v2(wire.V2AddResponse(0, 1, 2))
        with pytest.raises(FormatError, match="not an answer to a read"):
            list(v2.iter_responses(memoryview(add), "test"))

    def test_a_batched_answer_naming_more_bytes_than_it_has_is_refused(self) -> None:
        with pytest.raises(FormatError, match="entry of 9 bytes"):
            v2.split_batch(memoryview(b"\0\0\0\x09abc"), "test")
        with pytest.raises(FormatError, match="inside an entry size"):
            v2.split_batch(memoryview(b"\0\0"), "test")

    def test_v2_status_codes_map_onto_v3s(self) -> None:
        assert v2.status_of(0) == Status.EOK and v2.status_of(2) == Status.ENOENTRY
        assert v2.status_of(1) == Status.ENOLEDGER and v2.status_of(100) == Status.EBADREQ
        assert v2.status_of(12345) == Status.EIO


class TestCheckBodies:
    """The one-pass check finds exactly what decoding entry by entry finds."""

    @pytest.mark.parametrize("kind", list(DigestType))
    def test_agrees_with_decode_entry(self, kind: DigestType) -> None:
        d = codec.digest_for(kind, b"pw")
        bodies: list[memoryview | None] = []
        ids = []
        for e in range(12):
            body = bytearray(wire.encode_entry(d, 5, e, e - 1, 10 * (e + 1), bytes([e]) * 10))
            if e == 3:
                body[-1] ^= 1  # payload damaged
            if e == 5:
                body = body[:20]  # truncated
            bodies.append(memoryview(bytes(body)))
            ids.append(e if e != 7 else 8)  # entry 7 arrives where 8 was asked for
        bodies.append(None)
        ids.append(12)
        checked = codec.check_bodies(bodies, ids, 5, d, "test")
        for k, got in enumerate(bodies):
            if got is None:
                assert checked.payloads[k] is None and k not in checked.failed
                continue
            try:
                entry = codec.decode_entry(got, d, ledger_id=5, entry_id=ids[k])
            except DigestError:
                assert checked.failed[k][0] == "digest"
                continue
            except FormatError:
                assert checked.failed[k][0] == "format"
                continue
            assert bytes(checked.payloads[k] or b"") == bytes(entry.payload)
        if kind is DigestType.DUMMY:
            assert set(checked.failed) == {5, 7}
        else:
            assert set(checked.failed) == {3, 5, 7}
        assert checked.tail == (11, 10, 120)
