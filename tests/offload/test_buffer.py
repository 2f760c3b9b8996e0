"""The offload buffer: a byte budget shared by every topic."""

from __future__ import annotations

import asyncio

import pytest

from offloadd.offload.buffer import OffloadBuffer


class TestBuffer:
    """Reservations wait FIFO for room; an oversize request passes when the buffer is empty."""

    async def test_reservations_wait_for_room_in_order(self) -> None:
        buf = OffloadBuffer(100)
        await buf.reserve(80)
        order: list[int] = []

        async def want(n: int) -> None:
            await buf.reserve(n)
            order.append(n)

        t1 = asyncio.create_task(want(30))
        t2 = asyncio.create_task(want(10))  # fits, but must not overtake the first waiter
        await asyncio.sleep(0.01)
        assert order == []
        buf.release(80)
        await asyncio.wait_for(asyncio.gather(t1, t2), 1)
        assert order == [30, 10] and buf.used == 40

    async def test_an_oversize_request_is_admitted_into_an_empty_buffer(self) -> None:
        buf = OffloadBuffer(100)
        await asyncio.wait_for(buf.reserve(250), 1)
        assert buf.used == 250 and buf.high_water == 250

    async def test_a_cancelled_waiter_gives_way(self) -> None:
        buf = OffloadBuffer(100)
        await buf.reserve(100)
        t = asyncio.create_task(buf.reserve(50))
        await asyncio.sleep(0.01)
        t.cancel()
        await asyncio.gather(t, return_exceptions=True)
        buf.release(100)
        assert buf.used == 0
        await asyncio.wait_for(buf.reserve(100), 1)  # the cancelled 50 holds no place
        assert buf.used == 100


class TestParked:
    """Bytes waiting for a part to fill stay counted; when nothing but them is held, a read is
    admitted past the cap (waiting could only deadlock), one at a time."""

    async def test_everything_parked_admits_one_read_past_the_cap(self) -> None:
        buf = OffloadBuffer(100)
        await buf.reserve(60)
        await buf.reserve(40)  # full: 60 parked below, 40 in flight
        buf.park(60)
        first = asyncio.create_task(buf.reserve(50))
        second = asyncio.create_task(buf.reserve(50))
        await asyncio.sleep(0.01)
        assert not first.done()  # 40 bytes in flight will free room: wait for them
        buf.park(40)  # now everything held is parked
        await asyncio.wait_for(first, 1)
        assert buf.used == 150 and buf.high_water == 150
        await asyncio.sleep(0.01)
        assert not second.done()  # the admitted read is not parked: one at a time
        buf.unpark(40)
        buf.release(40)
        buf.release(50)
        await asyncio.wait_for(second, 1)  # 60 parked + 50 fits the cap again
        assert buf.used == 110 and buf.parked == 60
        second.result()

    def test_unpark_more_than_parked_is_a_bug(self) -> None:
        buf = OffloadBuffer(100)
        buf.park(10)
        with pytest.raises(AssertionError):
            buf.unpark(11)
