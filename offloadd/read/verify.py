"""``offloadd verify``: prove what is committed is complete, readable and right.

Per topic: committed segments are contiguous from the topic's first entry to the last offloaded
one (no gap, no overlap, no duplicate entry); every object reads back and every block passes its
checks (see :mod:`offloadd.read.reader`: magic, lengths, the CRC32C stamped in every block);
each data object has the length its index recorded; every object carries its user metadata
(Pulsar's readers refuse an object without ``s3managedledgeroffloaderformatversion``, and an
object offloadd wrote — its index records that — also needs offloadd's keys: a copy of a
filesystem tier that left the hidden ``.meta`` sidecars behind is an error, not an OK); and,
while the source still holds the
entries, every payload's CRC32C equals the source's. The catalog is also checked against the
source itself, not only against itself: every closed ledger must hold exactly the entries the
catalog recorded when it was closed (more means a second writer kept appending after another
process closed it — entries no segment will ever cover), and every committed segment's range
must be entries the source holds. Across the tier: no orphan objects (keys of
ours that no topic references and no retention record tracks), ignoring objects younger than
a grace period that a running daemon may be about to commit. And the topic's offload must not
be stuck failing (its owner's status record, as ``offloadd status`` shows it): sound objects
are not a healthy topic when nothing new reaches the tier.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import crc32c

from offloadd.blobstore.base import BlobStore
from offloadd.errors import NotFound, OffloaddError
from offloadd.ledger.base import EntryChecksums, SourceView, StoredEntries
from offloadd.metadata import managed_ledger, offload_status
from offloadd.metadata.base import MetadataStore
from offloadd.model import Position, TopicName, catalog
from offloadd.model.catalog import Segment, SegmentKind
from offloadd.model.keys import (
    parse_key,
    segment_key_pairs,
)
from offloadd.model.objects import BLOCK_CHECKSUM_KEY, FORMAT_VERSION_KEY
from offloadd.read.reader import TierReader
from offloadd.retention.gc import retained_uids


@dataclass
class TopicReport:
    topic: str
    segments: int = 0
    assigned: int = 0
    entries: int = 0
    bytes: int = 0
    first: str | None = None
    last_offloaded: str | None = None
    gaps: list[str] = field(default_factory=list)
    duplicates: int = 0
    checksum_mismatches: int = 0
    source_checked: int = 0
    source_mismatches: int = 0  # ledgers (or segment ranges) the source holds differently
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.gaps or self.duplicates or self.checksum_mismatches
                    or self.source_mismatches or self.errors)


@dataclass
class Report:
    topics: list[TopicReport]
    orphans: list[str]
    referenced_objects: int = 0

    @property
    def ok(self) -> bool:
        return all(t.ok for t in self.topics) and not self.orphans

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "topics": [dict(asdict(t), ok=t.ok) for t in self.topics],
            "orphans": self.orphans,
            "referenced_objects": self.referenced_objects,
        }


class _SourceCrcs:
    """Per-entry CRC32Cs kept by the source, when it keeps them."""

    def __init__(self, checksums: EntryChecksums | None) -> None:
        self.checksums = checksums

    async def get(self, ledger_id: int, first: int, last: int) -> Sequence[int] | None:
        if self.checksums is None:
            return None
        try:
            crcs = await self.checksums.read_crcs(ledger_id, first, last)
        except (NotFound, OffloaddError, OSError):
            return None
        return crcs if len(crcs) == last - first + 1 else None


async def _stored_entries(stored: StoredEntries | None, ledger_ids: Sequence[int],
                          rep: TopicReport) -> dict[int, int | None]:
    """What the source's own files hold per ledger (None: gone, or a source that cannot say)."""
    out: dict[int, int | None] = dict.fromkeys(ledger_ids)
    if stored is None:
        return out
    for lid in ledger_ids:
        try:
            out[lid] = await stored.stored_entries(lid)
        except OffloaddError as exc:
            rep.errors.append(f"ledger {lid}: cannot tell what the source holds: {exc}")
    return out


def _compare_closed(info: managed_ledger.ManagedLedgerInfo, held: dict[int, int | None],
                    rep: TopicReport) -> None:
    """A closed ledger must hold exactly the entries the catalog recorded when it was closed."""
    for li in info.ledgerInfo:
        n = held.get(li.ledgerId)
        if not li.HasField("entries") or n is None or n == li.entries:
            continue
        rep.source_mismatches += 1
        if n > li.entries:
            why = (f"entries {li.entries}..{n - 1} were written after it was closed (a second "
                   "writer on the store?) and no segment will ever cover them")
        else:
            why = f"entries {n}..{li.entries - 1} are missing from the source"
        rep.errors.append(f"ledger {li.ledgerId}: the catalog closed it at {li.entries} "
                          f"entries, but the source holds {n}: {why}")


def _expected_begin(prev: Position | None, ledgers: Sequence[int],
                    entries: dict[int, int | None]) -> Position | None:
    """Where the segment after one ending at ``prev`` must begin (None: anywhere)."""
    if prev is None:
        return None
    n = entries.get(prev.ledger_id)
    if n is None or prev.entry_id + 1 < n:
        return Position(prev.ledger_id, prev.entry_id + 1)
    # the ledger is complete: next non-empty ledger, entry 0
    idx = ledgers.index(prev.ledger_id) if prev.ledger_id in ledgers else -1
    for lid in ledgers[idx + 1:]:
        if entries.get(lid) != 0:
            return Position(lid, 0)
    return None


async def _offload_failing(metadata: MetadataStore, topic: TopicName,
                           rep: TopicReport) -> None:
    """A topic whose offload is stuck failing is not well, however sound what it committed is:
    its owner's record (``offloadd status``'s source) says so until an attempt succeeds."""
    try:
        rec = await offload_status.read(metadata, topic.managed_ledger)
    except OffloaddError as exc:
        rep.errors.append(f"offload status unreadable: {exc}")
        return
    if rec is None or not rec.failed_attempts:
        return
    since = (time.strftime(" since %Y-%m-%dT%H:%M:%SZ", time.gmtime(rec.failing_since_ms / 1000))
             if rec.failing_since_ms else "")
    rep.errors.append(f"offload is failing: {rec.failed_attempts} failed attempt(s){since}, "
                      f"nothing offloaded since; last error: {rec.last_error or '-'}")


async def verify_topic(topic: TopicName, metadata: MetadataStore, blobstore: BlobStore,
                       reader: TierReader, source: SourceView | None,
                       referenced: set[uuid.UUID],
                       on_progress: Callable[[str], None] | None = None) -> TopicReport:
    rep = TopicReport(str(topic))
    await _offload_failing(metadata, topic, rep)
    try:
        info, _ = await managed_ledger.load(metadata, topic.managed_ledger)
    except OffloaddError as exc:
        rep.errors.append(str(exc))
        return rep
    segs = catalog.segments(info)
    for s in segs:
        referenced.add(s.uid)
    committed = [s for s in segs if s.complete]
    rep.assigned = len(segs) - len(committed)
    rep.segments = len(committed)
    ledgers = [li.ledgerId for li in info.ledgerInfo]
    entries: dict[int, int | None] = {
        li.ledgerId: (li.entries if li.HasField("entries") else None) for li in info.ledgerInfo}
    if source is not None:
        try:
            for d in await source.source.ledgers(topic):
                if d.ledger_id in entries and entries[d.ledger_id] is None:
                    entries[d.ledger_id] = None  # open: no end yet
        except OffloaddError:
            pass
    held = await _stored_entries(source.stored if source else None, ledgers, rep)
    _compare_closed(info, held, rep)
    crcs = _SourceCrcs(source.checksums if source else None)
    prev: Position | None = None
    if committed:
        rep.first = str(committed[0].begin)
        first_ledger = next((lid for lid in ledgers if entries.get(lid) != 0), None)
        if first_ledger is not None and committed[0].begin != Position(first_ledger, 0):
            rep.gaps.append(f"first segment begins at {committed[0].begin}, "
                            f"the topic at {first_ledger}:0")
    for n, seg in enumerate(committed):
        if on_progress is not None:
            on_progress(f"{topic}: segment {n + 1}/{len(committed)}")
        expect = _expected_begin(prev, ledgers, entries)
        if expect is not None and seg.begin != expect:
            if seg.begin < expect:
                rep.duplicates += 1
                rep.errors.append(f"segment {seg.uid} begins at {seg.begin}, overlapping the "
                                  f"previous one (expected {expect})")
            else:
                rep.gaps.append(f"{expect}..before {seg.begin}")
        await _verify_segment(seg, rep, blobstore, reader, crcs, held)
        prev = seg.end
    if prev is not None:
        rep.last_offloaded = str(prev)
    return rep


async def _verify_segment(seg: Segment, rep: TopicReport, blobstore: BlobStore,
                          reader: TierReader, crcs: _SourceCrcs,
                          held: dict[int, int | None]) -> None:
    await _verify_objects(seg, rep, blobstore, reader)
    got: dict[int, list[int]] = {}  # ledger -> payload crcs in order
    expect_pos: Position | None = None
    count = 0
    try:
        async for e in reader.read_segment(seg):
            if expect_pos is not None and e.position != expect_pos and not (
                    e.position.entry_id == 0 and e.position.ledger_id != expect_pos.ledger_id):
                if e.position < expect_pos:
                    rep.duplicates += 1
                else:
                    rep.gaps.append(f"inside segment {seg.uid}: {expect_pos} missing")
            expect_pos = Position(e.position.ledger_id, e.position.entry_id + 1)
            got.setdefault(e.position.ledger_id, []).append(crc32c.crc32c(e.payload))
            rep.bytes += len(e.payload)
            count += 1
    except OffloaddError as exc:
        rep.errors.append(f"segment {seg.uid}: {exc}")
        return
    if count != seg.entries:
        rep.errors.append(f"segment {seg.uid}: read {count} entries, metadata says {seg.entries}")
    rep.entries += count
    for r in seg.ranges:
        n = held.get(r.ledger_id)
        if n is not None and r.last >= n:
            rep.source_mismatches += 1
            rep.errors.append(f"segment {seg.uid}: covers ledger {r.ledger_id} up to entry "
                              f"{r.last}, but the source holds only {n} entries of it")
            continue
        want = await crcs.get(r.ledger_id, r.first, r.last)
        if want is None:
            continue
        have = got.get(r.ledger_id, [])
        rep.source_checked += len(want)
        bad = sum(1 for a, b in zip(have, want, strict=False) if a != b)
        if bad or len(have) != len(want):
            rep.checksum_mismatches += bad + abs(len(have) - len(want))
            rep.errors.append(f"segment {seg.uid}: {bad} entries of ledger {r.ledger_id} differ "
                              f"from the source")


# The user metadata every object needs (Pulsar's readers refuse one without it), and what an
# object offloadd wrote carries besides (model/objects.py)
_PULSAR_KEYS = (FORMAT_VERSION_KEY,)
_OUR_KEYS = (FORMAT_VERSION_KEY, BLOCK_CHECKSUM_KEY)
_OUR_INDEX_KEYS = (*_OUR_KEYS, "offloadd-data-length", "offloadd-crc32c")


async def _verify_objects(seg: Segment, rep: TopicReport, blobstore: BlobStore,
                          reader: TierReader) -> None:
    """Each object of ``seg`` carries its user metadata, and a streaming data object has the
    length its index's metadata records (every byte of it is checked block by block, CRC32C
    included, by the read)."""
    pairs = segment_key_pairs(seg.uid, None if seg.kind is SegmentKind.STREAMING
                              else [r.ledger_id for r in seg.ranges])
    for idx_key, data_key in pairs:
        try:
            ours = (await reader.index(idx_key)).records_checksums
            idx_meta = (await blobstore.head(idx_key)).metadata
            data = await blobstore.head(data_key)
        except OffloaddError as exc:
            rep.errors.append(f"{idx_key}: {exc}")  # the read names it too, in detail
            continue
        for key, meta, needed in ((idx_key, idx_meta, _OUR_INDEX_KEYS if ours else _PULSAR_KEYS),
                                  (data_key, data.metadata, _OUR_KEYS if ours else _PULSAR_KEYS)):
            missing = [k for k in needed if k not in meta]
            if missing:
                rep.errors.append(
                    f"{key}: its user metadata is missing ({', '.join(missing)}): Pulsar's "
                    "readers refuse the object, and what it records (checksums, lengths) cannot "
                    "be checked. On a filesystem tier: was it copied without its hidden .meta "
                    "directory (cp -r tier/*)? Copy .meta back, or the whole directory")
        want = idx_meta.get("offloadd-data-length")
        if seg.kind is SegmentKind.STREAMING and want is not None and want != str(data.size):
            rep.errors.append(f"{data_key}: {data.size} bytes, the index records {want}")


async def find_orphans(blobstore: BlobStore, referenced: set[uuid.UUID], grace_s: float
                       ) -> list[str]:
    now = time.time()
    orphans = []
    async for obj in blobstore.list():
        parsed = parse_key(obj.key)
        if parsed is None or parsed.uid in referenced:
            continue
        if now - obj.mtime < grace_s:
            continue
        orphans.append(obj.key)
    return orphans


async def verify(metadata: MetadataStore, blobstore: BlobStore, source: SourceView | None,
                 topics: Sequence[TopicName], *, grace_s: float = 300.0,
                 check_orphans: bool = True,
                 on_progress: Callable[[str], None] | None = None) -> Report:
    """``on_progress`` hears a short description of each step (a terminal status line)."""
    reader = TierReader(metadata, blobstore)
    referenced: set[uuid.UUID] = set()
    reports = []
    for i, t in enumerate(topics):
        if on_progress is not None:
            on_progress(f"topic {i + 1}/{len(topics)} {t}")
        reports.append(await verify_topic(t, metadata, blobstore, reader, source, referenced,
                                          on_progress=on_progress))
    if on_progress is not None and check_orphans:
        on_progress("looking for orphan objects")
    if check_orphans:  # objects of topics not verified now are not orphans
        for name in await managed_ledger.list_names(metadata):
            try:
                info, _ = await managed_ledger.load(metadata, name)
            except OffloaddError:
                continue
            referenced.update(s.uid for s in catalog.segments(info))
        # segments retention still tracks or is deleting (their ledgers are gone) are not
        # orphans: gc removes them, and retries until it has
        try:
            referenced.update(await retained_uids(metadata))
        except OffloaddError as exc:
            reports.append(TopicReport("(retention records)", errors=[str(exc)]))
    orphans = await find_orphans(blobstore, referenced, grace_s) if check_orphans else []
    return Report(reports, orphans, len(referenced))
