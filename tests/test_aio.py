"""``offloadd.aio``: the small asyncio helpers, under the cancellations the daemon delivers."""

from __future__ import annotations

import asyncio

import pytest

from offloadd.aio import to_the_end

pytestmark = pytest.mark.timeout(10)


async def test_a_clean_up_survives_repeated_cancellation_and_passes_it_on() -> None:
    steps: list[int] = []
    started = asyncio.Event()

    async def clean_up() -> None:
        started.set()
        for i in range(5):
            await asyncio.sleep(0.01)
            steps.append(i)

    task = asyncio.create_task(to_the_end(clean_up()))
    await started.wait()
    task.cancel()  # ownership lost
    await asyncio.sleep(0.015)
    task.cancel()  # then shutdown
    with pytest.raises(asyncio.CancelledError):
        await task
    assert steps == [0, 1, 2, 3, 4]


async def test_without_cancellation_it_returns_and_errors_propagate() -> None:
    async def fine() -> None:
        await asyncio.sleep(0)

    async def broken() -> None:
        await asyncio.sleep(0)
        raise RuntimeError("delete failed")

    await to_the_end(fine())
    with pytest.raises(RuntimeError, match="delete failed"):
        await to_the_end(broken())


async def test_an_error_after_a_cancellation_still_surfaces() -> None:
    async def broken() -> None:
        await asyncio.sleep(0.02)
        raise RuntimeError("delete failed")

    task = asyncio.create_task(to_the_end(broken()))
    await asyncio.sleep(0.005)
    task.cancel()
    with pytest.raises(RuntimeError, match="delete failed"):
        await task
