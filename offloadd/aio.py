"""Small asyncio helpers the stages share."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

__all__ = ["first_of"]


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
