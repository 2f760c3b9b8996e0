"""Following the tail of an open ledger: how the source learns its last-add-confirmed entry and
makes it readable (see :mod:`.ledgers` for what "readable" means).

First sight of an open ledger: every bookie of its current ensemble is asked for its last entry
(v3, entry ``-1``); entries before the last ensemble change were confirmed when it changed. From
then on every entry header and ``maxLAC`` read teaches a newer LAC; while the offloader waits, a
bookie of the next entry's write set is long-polled (v3). A learnt LAC becomes readable once
that entry's cumulative length is known (one read of it).
"""

from __future__ import annotations

import asyncio
import logging

from offloadd.errors import FormatError, NotFound, Retriable
from offloadd.ledger.bookkeeper.client import BookieClient
from offloadd.ledger.bookkeeper.connection import BookieError
from offloadd.ledger.bookkeeper.ledgers import KnownLedger

log = logging.getLogger(__name__)

__all__ = ["advance", "follow", "learn_lac"]


async def learn_lac(client: BookieClient, led: KnownLedger) -> None:
    """First sight of an open ledger: ask its current ensemble for their last entries (once,
    however many callers ask meanwhile)."""
    if led.lac_learnt:
        return
    if led.lac_task is None or led.lac_task.done():
        led.lac_task = asyncio.ensure_future(_ask_lac(client, led))
    await asyncio.shield(led.lac_task)


async def _ask_lac(client: BookieClient, led: KnownLedger) -> None:
    first, ensemble = led.meta.segments[-1]
    # bookies that just failed would only make every caller wait for their timeouts
    ask = [b for b in ensemble if not client.replicas.is_down(b)] or list(ensemble)
    results = await asyncio.gather(*(client.read_last(b, led) for b in ask),
                                   return_exceptions=True)
    answers = [r for r in results if not isinstance(r, BaseException)]
    if not answers:
        errs = "; ".join(str(r) for r in results)
        raise Retriable(f"ledger {led.ledger_id}: no bookie of its ensemble answered for "
                        f"its last-add-confirmed ({errs})")
    # entries before the last ensemble change were confirmed when the ensemble changed
    led.learn(max([first - 1, *(hint for hint, _ in answers)]))
    for _, entry in answers:
        if entry is not None:
            led.note(entry.entry_id, entry.lac, entry.length)
    led.lac_learnt = True


async def advance(client: BookieClient, led: KnownLedger) -> None:
    """Make the learnt LAC readable: learn that entry's cumulative length (one read)."""
    if led.meta.closed or led.known[0] >= led.lac:
        return
    async with led.probe_lock:
        target = led.lac
        if led.known[0] >= target:
            return
        try:
            got = await client.read_entries(led, target, target)
        except (NotFound, Retriable, FormatError) as exc:
            log.warning("ledger %d: could not read entry %d to advance the readable tail "
                        "(%s); staying at %d", led.ledger_id, target, exc, led.known[0])
            return
        led.learn(got.lac)
        led.note(*got.tail)


async def follow(client: BookieClient, led: KnownLedger, deadline: float,
                 long_poll_max_s: float) -> None:
    """Long-poll for the LAC to pass what is readable (until ``deadline``, loop time); then
    make it readable."""
    loop = asyncio.get_running_loop()
    try:
        await learn_lac(client, led)
        if led.lac <= led.readable_last:
            remaining = min(deadline - loop.time(), long_poll_max_s)
            if remaining <= 0:
                return
            previous = led.lac
            bookie = client.replicas.order(led.meta.bookies_for(previous + 1))[0]
            try:
                hint, entry = await client.long_poll(bookie, led, previous, remaining)
            except (BookieError, Retriable, FormatError):
                # counted: a bookie refusing our long polls would otherwise leave the tail
                # re-read every 0.5 s without a trace
                client.metrics.long_poll_failed()
                raise
            led.learn(hint)
            if entry is not None:
                led.note(entry.entry_id, entry.lac, entry.length)
        await advance(client, led)
    except (BookieError, Retriable, FormatError, NotFound) as exc:
        log.debug("ledger %d: long poll failed: %s", led.ledger_id, exc)
        await asyncio.sleep(max(min(deadline - loop.time(), 0.5), 0.0))
