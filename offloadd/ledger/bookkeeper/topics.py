"""What the BookKeeper source holds per watched topic, and which topics list which ledger.

:class:`WatchedTopic` is one topic's Pulsar ledger list (from its data watch or a fresh read),
how far the mirror follows it, and the descriptions of a list whose ledgers are all closed.
:class:`Listers` indexes ledgers by the topics whose lists name them, updated as each list
changes, so forgetting a ledger nobody lists costs the change, not a pass over every topic (that
pass, on every ``ledgers()`` call, was quadratic in topics). :func:`log_mirror_change` says what
a mirror edit did.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from offloadd.ledger.bookkeeper.layout import MirrorChange
from offloadd.ledger.bookkeeper.ledgers import STAMPS, KnownLedger
from offloadd.ledger.bookkeeper.metrics import BookKeeperMetrics
from offloadd.metadata import managed_ledger
from offloadd.metadata.base import Versioned
from offloadd.metadata.zookeeper import Watch
from offloadd.model import LedgerDesc, TopicName
from offloadd.model.losses import describe_lost

__all__ = ["Listers", "WatchedTopic", "log_mirror_change", "unread_entries"]

# the source logs these lines: operators filter by its logger
log = logging.getLogger("offloadd.ledger.bookkeeper.source")


@dataclass
class WatchedTopic:
    topic: TopicName
    info: managed_ledger.ManagedLedgerInfo | None = None
    ids: tuple[int, ...] = ()  # the ledgers ``info`` lists, in order (set with it)
    version: int = -1
    mzxid: int = -1  # of the read ``info`` came from: newer reads only replace it
    node: Versioned | None = None  # that read
    # the descriptions of ``info`` once every ledger in it is closed (they never change then),
    # with their ids: ledgers() is asked each second per topic by the offloader and lag loops
    settled: tuple[managed_ledger.ManagedLedgerInfo, tuple[LedgerDesc, ...],
                   frozenset[int]] | None = None
    watch: Watch | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    mirrored_mzxid: int | None = None  # the newest read of Pulsar's list applied to the mirror
    mirrored_closed: frozenset[int] = frozenset()  # ledgers BookKeeper had closed by then
    read_pos: tuple[int, int] | None = None
    mirror_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    stamp: int = field(default_factory=lambda: next(STAMPS))  # of its last change (wake)

    def wake(self) -> None:
        self.stamp = next(STAMPS)
        event, self.changed = self.changed, asyncio.Event()
        event.set()

    def set_info(self, info: managed_ledger.ManagedLedgerInfo | None) -> None:
        self.info = info
        self.ids = tuple(li.ledgerId for li in info.ledgerInfo) if info is not None else ()

    def ledger_ids(self) -> list[int]:
        return list(self.ids)

    def stamp_with(self, ledgers: Mapping[int, KnownLedger]) -> int:
        """The newest stamp of the list and of the ledgers it lists (those ``ledgers``
        holds): any change the topic's ledger descriptions can show stamps one of them."""
        stamp = self.stamp
        for lid in self.ids:
            led = ledgers.get(lid)
            if led is not None and led.stamp > stamp:
                stamp = led.stamp
        return stamp

    @property
    def mirror_current(self) -> bool:
        return self.mirrored_mzxid is not None and self.mirrored_mzxid >= self.mzxid


class Listers:
    """Ledger id -> the topics whose lists name it; and the ledgers loaded while none did."""

    def __init__(self) -> None:
        self._by_ledger: dict[int, set[TopicName]] = {}
        self._unlisted: set[int] = set()

    def relist(self, topic: TopicName, before: Iterable[int], after: Iterable[int]
               ) -> list[int]:
        """``topic``'s list changed from ``before`` to ``after``: the ledgers no topic lists
        any more."""
        old, new = set(before), set(after)
        for lid in new - old:
            self._by_ledger.setdefault(lid, set()).add(topic)
        orphans = []
        for lid in old - new:
            topics = self._by_ledger.get(lid)
            if topics is not None:
                topics.discard(topic)
                if topics:
                    continue
                del self._by_ledger[lid]
            orphans.append(lid)
        return orphans

    def of(self, ledger_id: int) -> Iterable[TopicName]:
        return self._by_ledger.get(ledger_id, ())

    def loaded(self, ledger_id: int) -> None:
        """A ledger was loaded: if no list names it, :meth:`take_unlisted` will say so."""
        if ledger_id not in self._by_ledger:
            self._unlisted.add(ledger_id)

    def take_unlisted(self) -> list[int]:
        """The ledgers loaded while unlisted that still are (each said once)."""
        unlisted, self._unlisted = self._unlisted, set()
        return [lid for lid in unlisted if lid not in self._by_ledger]

    def clear(self) -> None:
        self._by_ledger.clear()
        self._unlisted.clear()


def unread_entries(read_pos: tuple[int, int], descs: Sequence[LedgerDesc]) -> int:
    """Readable entries past ``read_pos`` (ledger, entry): the topic's LAC lag."""
    rl, re = read_pos
    lag = 0
    for d in descs:
        if d.ledger_id == rl:
            lag += max(d.last_entry_id - re, 0)
        elif d.ledger_id > rl:
            lag += d.entries
    return lag


def log_mirror_change(topic: TopicName, version: int, change: MirrorChange,
                      metrics: BookKeeperMetrics) -> None:
    """Log (and count) what one mirror edit from Pulsar's list at ``version`` did."""
    if change.stale:
        log.debug("topic %s: Pulsar's ledger list at version %d is older than the one the "
                  "mirror follows; left as it is", topic, version)
        return
    if change.added or change.dropped or change.closed:
        log.info("topic %s: mirrored Pulsar's ledger list at version %d (added %s, closed "
                 "%s, dropped %s)", topic, version, change.added, change.closed,
                 change.dropped)
    if change.cleared:
        log.warning("topic %s: withdrew the loss records of ledgers %s: Pulsar still lists "
                    "them (an earlier offloadd recorded them from a stale ledger list)",
                    topic, change.cleared)
    if change.lost:
        log.error("topic %s: data lost to retention: Pulsar deleted %s before offloadd "
                  "offloaded it", topic, describe_lost(change.lost))
        metrics.data_lost(str(topic), len(change.lost),
                          sum(lost.entries for lost in change.lost))
