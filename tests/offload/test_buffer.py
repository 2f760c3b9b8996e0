"""The offload buffer: a byte budget shared by every topic."""

from __future__ import annotations

import asyncio

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
        assert buf.used == 0 and buf.try_reserve(100)
