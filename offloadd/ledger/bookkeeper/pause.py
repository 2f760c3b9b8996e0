"""Waiting on a bookie with a timeout that a pause of this process cannot trip.

A request's timeout is a timer on the event loop. When the process stops running — ``SIGSTOP``,
a stopped or migrated VM, CPU steal, a long blocking call in the loop — every timer that fell due
meanwhile fires as soon as it runs again, in the same loop iteration as (and before the waiting
tasks see) the answers that arrived meanwhile. Every request to every bookie then times out at
once and every healthy bookie is quarantined, although none of them was slow: we were.

:func:`wait_answered` tells the two apart by the clock: a timer that fires more than
``tolerance`` seconds after its deadline means the loop was not running (the monotonic clock
jumped past the deadline while nothing ran), so the bookie is given a fresh ``timeout`` from
then instead of a failure. A wait only ends in ``TimeoutError`` when its timer fired on time,
i.e. when the bookie really had ``timeout`` seconds of a running process to answer in.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["MAX_STALLS", "Stalls", "stall_tolerance", "wait_answered"]

MAX_STALLS = 8  # fresh windows one wait may get; a loop that stalls for ever still fails


def stall_tolerance(timeout: float) -> float:
    """How late a timer may fire before the lateness counts as a stall: scheduling noise of a
    busy host stays under it, a pause worth a bookie's timeout does not."""
    return max(0.2, min(1.0, timeout / 4))


async def wait_answered(fut: asyncio.Future[Any], timeout: float, *, tolerance: float,
                        on_stall: Callable[[float], None] | None = None) -> float:
    """Wait until ``fut`` is done, for at most ``timeout`` seconds of this process running.

    Returns the seconds the loop was seen stalled meanwhile (0.0: none); ``on_stall(seconds)``
    is called for each stall seen. ``TimeoutError`` when ``fut`` is not done after a window
    whose timer fired on time. ``fut`` itself is never cancelled (a late answer still finds
    it); its result or exception is left to the caller."""
    loop = asyncio.get_running_loop()
    stalled = 0.0
    deadline = loop.time() + timeout
    for _ in range(MAX_STALLS + 1):
        if not fut.done():
            await asyncio.wait((fut,), timeout=max(deadline - loop.time(), 0.0))
        now = loop.time()
        late = now - deadline
        if fut.done():
            if late > tolerance:  # answered meanwhile, seen only once we ran again
                stalled += late
                if on_stall is not None:
                    on_stall(late)
            return stalled
        if late <= tolerance:
            break
        stalled += late
        if on_stall is not None:
            on_stall(late)
        deadline = now + timeout
    raise TimeoutError


class Stalls:
    """The stalls one client's waits see: every wait in flight sees the same stall, which is
    counted (``count()``) and logged once."""

    def __init__(self, timeout: float, count: Callable[[], None]) -> None:
        self.tolerance = stall_tolerance(timeout)
        self._count = count
        self._seen_at = float("-inf")  # loop time the last stall was counted

    async def wait(self, fut: asyncio.Future[Any], timeout: float) -> float:
        """:func:`wait_answered` with this tolerance; the seconds stalled meanwhile."""
        return await wait_answered(fut, timeout, tolerance=self.tolerance, on_stall=self._seen)

    def _seen(self, seconds: float) -> None:
        now = asyncio.get_running_loop().time()
        if now - self._seen_at > self.tolerance:
            self._count()
            log.warning("this process did not run for %.1fs (paused, stopped or starved): "
                        "bookie requests in flight are given their timeout again, no bookie "
                        "is blamed", seconds)
        self._seen_at = now
