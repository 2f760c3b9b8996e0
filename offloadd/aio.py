"""Small asyncio helpers the stages share."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

__all__ = ["first_of", "retrieved", "to_the_end"]

T = TypeVar("T")


async def first_of(*aws: Awaitable[object], timeout: float | None = None) -> None:
    """Until the first of ``aws`` is done, or ``timeout``. The others are cancelled and awaited
    before this returns (also when it is itself cancelled), so no waiter outlives the call: a
    leaked ``Event.wait()`` would keep its event's waiter list growing on every pass."""
    waits = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
        await asyncio.gather(*waits, return_exceptions=True)


async def to_the_end(work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` to its end even if this call is cancelled, however many times, then pass the
    cancellation on. For clean-ups that must not stop half-way (deleting what a failed attempt
    wrote); ``work`` must bound its own duration, since nothing here cuts it short."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():
                raise
            cancelled = True
    task.result()
    if cancelled:
        raise asyncio.CancelledError


def retrieved(fut: asyncio.Future[T]) -> asyncio.Future[T]:
    """``fut``, with its exception (if it ends with one) marked as retrieved when it ends.

    For a future under ``asyncio.shield``: once the awaiter is cancelled or times out, nobody
    awaits the inner future, and when it later fails Python 3.11 logs "Future exception was
    never retrieved" as it is collected (noise at every stop with requests in flight). Its
    failure has been dealt with by then (the awaiter's timeout or cancellation)."""
    fut.add_done_callback(_retrieve)
    return fut


def _retrieve(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()
