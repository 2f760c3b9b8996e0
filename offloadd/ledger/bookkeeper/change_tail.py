"""The newest entry of Pulsar's ``__change_events`` before BookKeeper confirms it to readers.

BookKeeper tells readers an entry is confirmed only with the writer's next add (or the ledger's
close): the newest entry of an open ledger is past every bookie's last-add-confirmed. A topic
policy change is usually the only write to its namespace's system topic for hours, so a reader
bound by the LAC would apply it only at the ledger's rollover (4 h by default).

The broker, though, acknowledged that entry once ``ack_quorum`` bookies of its write set
stored it, and BookKeeper's recovery keeps any such entry: :func:`durable_entry` asks the
bookies of the entry's write set for their last entry (``read_last``, no fencing, nothing
written) and returns the payload when ``ack_quorum`` of them hold that very entry with the same
bytes, digest-checked. Used only for the topic policies
(:class:`~offloadd.ledger.change_events.ChangeEvents`' ``peek``), never for offloading.
"""

from __future__ import annotations

import asyncio
import logging

from offloadd.errors import OffloaddError
from offloadd.ledger.bookkeeper.source import BookKeeperLedgerSource
from offloadd.model import TopicName

log = logging.getLogger(__name__)

__all__ = ["durable_entry"]


async def durable_entry(source: BookKeeperLedgerSource, topic: TopicName, ledger_id: int,
                        entry_id: int) -> bytes | None:
    """Entry ``entry_id`` of ``topic``'s open ledger ``ledger_id`` if ``ack_quorum`` bookies
    of its write set hold it, while it is not readable yet; else None (also on any error)."""
    try:
        led = await source._ledger(ledger_id)
        if led is None or led.meta.closed or entry_id <= led.readable_last:
            return None  # gone, or readable through the source: nothing to peek at
        bookies = led.meta.bookies_for(entry_id)
        answers = await asyncio.gather(*(source.client.read_last(b, led) for b in bookies),
                                       return_exceptions=True)
    except OffloaddError as exc:
        log.debug("%s: entry %d:%d not peeked at: %s", topic, ledger_id, entry_id, exc)
        return None
    copies: dict[bytes, int] = {}
    for a in answers:
        if isinstance(a, BaseException) or a[1] is None or a[1].entry_id != entry_id:
            continue
        payload = bytes(a[1].payload)
        copies[payload] = copies.get(payload, 0) + 1
    for payload, n in copies.items():
        if n >= led.meta.ack_quorum:
            return payload
    return None
