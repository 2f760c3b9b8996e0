"""One connection's receiving side, without a socket: answers cut anywhere by the network land in
the right slots, late ones are dropped, junk drops the connection, and a sink knows when it is
complete."""

from __future__ import annotations

import asyncio
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from offloadd.ledger.bookkeeper.codec import Status
from offloadd.ledger.bookkeeper.connection import (
    LOST,
    PENDING,
    PROTOCOL,
    SHORT,
    Sink,
    V2Connection,
    V3Connection,
    short_runs,
    with_slots,
)
from offloadd.ledger.bookkeeper.v3 import ReadResponse
from tests.fixtures import bookie_wire as wire


class _Transport:
    """Enough of a transport for a protocol under test."""

    def __init__(self) -> None:
        self.aborted = False
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return self.aborted

    def abort(self) -> None:
        self.aborted = True

    def close(self) -> None:
        self.aborted = True


def _open(conn: Any) -> _Transport:
    t = _Transport()
    conn.connection_made(t)
    return t


def _feed(conn: Any, data: bytes, cuts: list[int]) -> None:
    """``data`` as the network might deliver it: cut at ``cuts``."""
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    for a, b in pairwise(points):
        conn.data_received(data[a:b])


def _sink(n: int) -> Sink:
    return Sink(n, asyncio.get_running_loop().create_future())


class TestV2Answers:
    @given(st.lists(st.binary(max_size=300), min_size=1, max_size=12),
           st.lists(st.integers(0, 10_000), max_size=30), st.randoms())
    @settings(max_examples=60, deadline=None)
    async def test_answers_cut_anywhere_land_in_their_slots(
            self, bodies: list[bytes], cuts: list[int], rnd: Any) -> None:
        conn = V2Connection("b:1")
        _open(conn)
        sink = _sink(len(bodies))
        ids = [100 + 3 * k for k in range(len(bodies))]
        conn.expect(9, ids, range(len(ids)), sink)
        order = list(range(len(bodies)))
        rnd.shuffle(order)  # a bookie's answers may overtake each other
        data = b"".join(wire.encode_v2(wire.V2ReadResponse(0, 9, ids[k], bodies[k]))
                        for k in order)
        _feed(conn, data, cuts)
        assert sink.future.done() and sink.codes == [0] * len(bodies)
        assert [bytes(b or b"") for b in sink.bodies] == bodies
        assert not conn.reads.get(9)

    @given(st.lists(st.binary(min_size=1, max_size=200), min_size=1, max_size=6),
           st.integers(0, 5), st.lists(st.integers(0, 5000), max_size=20))
    @settings(max_examples=60, deadline=None)
    async def test_a_batched_answer_fills_its_run_and_marks_the_rest_short(
            self, bodies: list[bytes], missing: int, cuts: list[int]) -> None:
        conn = V2Connection("b:1")
        _open(conn)
        n = len(bodies) + missing
        sink = _sink(n)
        conn.expect_batch(77, sink, 0, n)
        _feed(conn, wire.encode_v2(wire.V2BatchReadResponse(0, 9, 40, 77, bodies)), cuts)
        assert sink.future.done()
        assert sink.codes == [0] * len(bodies) + [SHORT] * missing
        assert short_runs(sink, list(range(40, 40 + n))) == \
            ([(40 + len(bodies), missing, len(bodies))] if missing else [])

    async def test_an_error_answer_to_a_batch_covers_its_whole_run(self) -> None:
        conn = V2Connection("b:1")
        _open(conn)
        sink = _sink(3)
        conn.expect_batch(5, sink, 0, 3)
        conn.data_received(wire.encode_v2(wire.V2BatchReadResponse(100, 9, 40, 5)))
        assert sink.codes == [Status.EBADREQ] * 3 and conn.batch_refused

    async def test_two_reads_of_one_entry_are_answered_in_turn(self) -> None:
        conn = V2Connection("b:1")
        _open(conn)
        a, b = _sink(1), _sink(1)
        conn.expect(9, [5], [0], a)
        conn.expect(9, [5], [0], b)
        answer = wire.encode_v2(wire.V2ReadResponse(0, 9, 5, b"x" * 40))
        conn.data_received(answer)
        assert a.future.done() and not b.future.done()
        conn.data_received(answer)
        assert b.future.done() and not conn.again

    async def test_a_late_answer_finds_nobody(self) -> None:
        conn = V2Connection("b:1")
        _open(conn)
        sink = _sink(2)
        conn.expect(9, [1, 2], [0, 1], sink)
        conn.forget(sink, 9, [1, 2])
        conn.data_received(wire.encode_v2(wire.V2ReadResponse(0, 9, 1, b"y" * 40)))
        assert sink.codes == [PENDING, PENDING]

    @pytest.mark.parametrize("junk", [
        wire.encode_v2(wire.V2AddResponse(0, 9, 1)),  # not an answer to a read
        b"\0\0\0\x08" + b"\x02\x02\0\0" + b"\0" * 4,  # a read answer too short to hold one
        b"\x7f\xff\xff\xff" + b"\0" * 40,  # a frame larger than any entry
    ])
    async def test_junk_fails_every_read_and_drops_the_connection(self, junk: bytes) -> None:
        conn = V2Connection("b:1")
        t = _open(conn)
        sink = _sink(2)
        conn.expect(9, [1, 2], [0, 1], sink)
        conn.data_received(junk)
        assert t.aborted and conn.closed
        assert sink.codes == [PROTOCOL, PROTOCOL] and sink.detail

    async def test_a_lost_connection_fails_what_waits_on_it(self) -> None:
        conn = V2Connection("b:1")
        _open(conn)
        sink = _sink(3)
        conn.expect(9, [1], [0], sink)
        conn.expect_batch(3, sink, 1, 2)
        conn.connection_lost(None)
        assert sink.codes == [LOST] * 3 and sink.future.done()


class TestV3Answers:
    @given(st.lists(st.binary(max_size=5000), min_size=1, max_size=6),
           st.lists(st.integers(0, 40_000), max_size=30))
    @settings(max_examples=40, deadline=None)
    async def test_answers_cut_anywhere_land_by_txn_id(self, bodies: list[bytes],
                                                       cuts: list[int]) -> None:
        conn = V3Connection("b:1")
        _open(conn)
        sink = _sink(len(bodies))
        conn.expect(500, sink, len(bodies))
        data = b"".join(wire.encode_response(ReadResponse(500 + k, 0, 0, 9, k, body, 7))
                        for k, body in reversed(list(enumerate(bodies))))
        _feed(conn, data, cuts)
        assert [bytes(b or b"") for b in sink.bodies] == bodies
        assert sink.max_lac == 7 and not conn.pending


def test_slots_count_on_across_runs() -> None:
    assert with_slots([(10, 2), (20, 3), (30, 1)]) == [(10, 2, 0), (20, 3, 2), (30, 1, 5)]


async def test_a_reopened_sink_waits_again() -> None:
    sink = _sink(2)
    sink.put(0, 0, None)
    sink.put(1, SHORT, None)
    assert sink.future.done()
    sink.reopen([1])
    assert not sink.future.done() and sink.remaining == 1
    sink.put(1, 0, None)
    assert sink.future.done()
    sink.reopen([])
    assert sink.future.done()
