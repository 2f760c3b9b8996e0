"""Writing the mirror node of a topic in offloadd's store, with as few round trips as it takes.

The edit itself is :func:`~offloadd.ledger.bookkeeper.layout.mirror_edit` (pure); this module
applies it. A topic's first mirror write in a process does not know whether the node exists
(offloadd ran before, or this is a new topic): :func:`existing_mirrors` answers that for many
topics of a namespace with one children read of its directory, so a fresh topic's mirror is
one ``create`` carrying the whole edit (not create-empty, read, write: three round trips) and a
known one is one read, plus one compare-and-set write if Pulsar's list moved since.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from offloadd.errors import Conflict, NotFound, OffloaddError
from offloadd.ledger.bookkeeper.layout import MirrorChange, PulsarList, mirror_edit
from offloadd.ledger.bookkeeper.metrics import BookKeeperMetrics
from offloadd.ledger.bookkeeper.topics import log_mirror_change
from offloadd.metadata import cas, managed_ledger
from offloadd.metadata.base import MetadataStore, Versioned
from offloadd.model import TopicName
from offloadd.model.keys import managed_ledger_path

__all__ = ["LIST_FROM", "apply_list", "existing_mirrors", "write_mirror"]

log = logging.getLogger(__name__)

# A namespace's directory is listed when at least this many of its topics are seen at once (a
# restart, a first start): below, a listing costs more than guessing "absent" and being wrong.
LIST_FROM = 8

Edit = Callable[[managed_ledger.ManagedLedgerInfo], bool]


def _split(topic: TopicName) -> tuple[str, str]:
    parent, _, name = managed_ledger_path(topic.managed_ledger).rpartition("/")
    return parent, name


async def existing_mirrors(store: MetadataStore, topics: Iterable[TopicName]
                           ) -> dict[TopicName, bool]:
    """Whether each topic's mirror node exists, for the namespaces with at least
    :data:`LIST_FROM` of ``topics`` (one children read each, concurrently); the others are
    left out (unknown). A hint only: a wrong one costs :func:`write_mirror` a round trip."""
    by_dir: dict[str, list[tuple[TopicName, str]]] = {}
    for topic in topics:
        parent, name = _split(topic)
        by_dir.setdefault(parent, []).append((topic, name))
    listed = [(d, named) for d, named in by_dir.items() if len(named) >= LIST_FROM]

    async def kids(d: str) -> set[str] | None:
        try:
            return set(await store.children(d))
        except NotFound:
            return set()
        except OffloaddError as exc:  # no hint then; the writes find out one by one
            log.debug("listing %s for the mirror failed: %s", d, exc)
            return None

    out: dict[TopicName, bool] = {}
    for (_, named), names in zip(listed, await asyncio.gather(*(kids(d) for d, _ in listed)),
                                 strict=True):
        if names is not None:
            out.update((topic, name in names) for topic, name in named)
    return out


async def write_mirror(store: MetadataStore, topic: TopicName, edit: Edit, *,
                       absent: bool) -> None:
    """Apply ``edit`` to the topic's mirror node by compare-and-set, creating the node if it is
    missing (even when ``edit`` changes nothing: the offloader loads it before it asks for
    anything). ``absent``: the node is believed missing, so the edit of an empty node is
    created in one request (and on ``Conflict`` applied the ordinary way)."""
    ml = topic.managed_ledger
    path = managed_ledger_path(ml)
    if absent:
        fresh = managed_ledger.ManagedLedgerInfo()
        edit(fresh)
        try:
            await store.create(path, fresh.SerializeToString())
            return
        except Conflict:
            pass  # there after all (another process, or an earlier run)

    def apply(node: Versioned | None) -> bytes | None:
        info = managed_ledger.decode(node.data, path) if node is not None \
            else managed_ledger.ManagedLedgerInfo()
        changed = edit(info)
        return info.SerializeToString() if changed or node is None else None

    await cas.update(store, path, apply, create=True)


async def apply_list(store: MetadataStore, topic: TopicName, listed: PulsarList,
                     info: managed_ledger.ManagedLedgerInfo, *, now_ms: int,
                     ends: dict[int, tuple[int, int]], metrics: BookKeeperMetrics,
                     absent: bool) -> None:
    """Mirror ``listed`` (derived from Pulsar's ``info``) into the topic's node; ``ends``: the
    (last entry, bytes) of ledgers seen closed whose close the mirror may not hold yet, each
    dropped once the mirror holds it (or its loss)."""
    changes: list[MirrorChange] = []
    # a ledger deleted before it was seen closed is reported with its end unknown: what was
    # readable while it was open is only a lower bound of what it held
    known = dict(ends)
    # a ledger Pulsar's own offloader moved to its tier is not lost when it leaves BookKeeper
    theirs = {li.ledgerId for li in info.ledgerInfo
              if li.HasField("offloadContext") and li.offloadContext.complete}

    def edit(mirror: managed_ledger.ManagedLedgerInfo) -> bool:
        change = mirror_edit(mirror, listed, now_ms, known, exempt=theirs)
        changes[:] = [change]
        return change.changed

    await write_mirror(store, topic, edit, absent=absent)
    change = changes[0] if changes else None
    if change is None:
        return
    if not change.stale:
        for p in listed.ledgers:  # the mirror holds their ends now
            if p.closed:
                ends.pop(p.ledger_id, None)
    log_mirror_change(topic, listed.version, change, metrics)
    if not change.stale:
        for lid in change.dropped:
            ends.pop(lid, None)
