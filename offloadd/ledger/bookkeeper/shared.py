"""One piece of asyncio plumbing the BookKeeper source needs in several places."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["single_flight"]

K = TypeVar("K")
V = TypeVar("V")


async def single_flight(flights: dict[K, asyncio.Future[V]], key: K,
                        start: Callable[[], Awaitable[V]]) -> V:
    """``start()``'s result, started once for ``key`` however many callers ask meanwhile; a
    caller that is cancelled does not cancel it for the others."""
    fut = flights.get(key)
    if fut is None:
        fut = asyncio.ensure_future(start())
        flights[key] = fut
        fut.add_done_callback(lambda _: flights.pop(key, None))
    return await asyncio.shield(fut)
