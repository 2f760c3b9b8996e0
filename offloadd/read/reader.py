"""Read offloaded entries back by position, across segments, ledgers and both formats.

A topic's committed segments come from its ``ManagedLedgerInfo`` (:mod:`offloadd.model.catalog`);
streaming segments (PIP-76) and ledgers offloaded whole (PIP-17) interleave in one log order, and
the reader hands out one ordered stream whatever mix holds it. For each object the index is read
once (LRU-cached), then its blocks are fetched by ranged GETs of whole blocks, ``prefetch`` GETs
in flight ahead of the consumer. A GET takes consecutive blocks until it holds ``range_bytes``
(the last of an object: what is left; a block larger than that: alone): the same rule the writer
cuts multipart parts by (``offload/parts.py``), so with ``range_bytes`` = the part size each GET
is one part of an object offloadd wrote, and small blocks do not cost a request each.
Every block is checked before any of its entries is returned: magic,
lengths, ledger and first entry against the index, the per-block CRC32C, and the consecutive
entry ids inside — wrong bytes raise ``FormatError`` naming the object and block, never a wrong
entry. Whether a block must carry a CRC32C comes from the index — its user metadata, or the
record in its own bytes that a copy cannot drop apart from the pair (``format/checksum.py``;
every block of an object offloadd wrote carries one) — never from the block's own possibly
damaged bytes. Only pairs with neither (Pulsar's own) may have blocks without one, and then all
of them: an object some of whose blocks carry the mark and one does not is refused (before any
entry of a ranged read holding both is returned).

An answer that fails those checks is read again (at most ``rereads`` times, each counted in
``ReadProbe.reread``) before the object is called corrupt: a short, padded or bit-flipped answer
is most often the transport's (a proxy, a connection cut and re-framed, a bad NIC), and one such
answer must not fail a whole ``read``, ``verify``, compaction or lakehouse sync. An answer
byte-identical to the last damaged one is what the store holds: no further re-read.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import crc32c

from offloadd.blobstore.base import BlobStore
from offloadd.errors import FormatError, NotFound
from offloadd.format import (
    HEADER_LEN,
    BlockHeader,
    IndexEntry,
    LedgerIndex,
    StreamingIndex,
    decode_index,
    iter_block_entries,
    parse_block_header,
)
from offloadd.format.checksum import CHECKSUM_OFFSET, verify_block_checksum
from offloadd.metadata import managed_ledger
from offloadd.metadata.base import MetadataStore
from offloadd.model import Position, TopicName, catalog
from offloadd.model.catalog import Segment, SegmentKind
from offloadd.model.keys import (
    ledger_data_key,
    ledger_index_key,
    streaming_data_key,
    streaming_index_key,
)
from offloadd.model.objects import FORMAT_VERSION_KEY, blocks_checksummed


@dataclass(frozen=True)
class Entry:
    position: Position
    payload: memoryview


log = logging.getLogger(__name__)

# A ranged GET's size: [blobstore] part_size_bytes' default
DEFAULT_RANGE_BYTES = 8 * 1024 * 1024
# Re-reads of an answer that fails its checks before the object is called corrupt
DEFAULT_REREADS = 2

_T = TypeVar("_T")


@dataclass(frozen=True)
class _BlockRef:
    data_key: str
    ledger_id: int
    block: IndexEntry
    end: int
    checksummed: bool  # the index (metadata or own bytes) says every block carries a CRC32C


# A block, its checked entries (id, payload), and whether it carries the checksum mark
_Checked = tuple[_BlockRef, list[tuple[int, memoryview]], bool]


def _ranges(refs: list[_BlockRef], range_bytes: int) -> list[list[_BlockRef]]:
    """``refs`` (in object order) grouped into ranged GETs of consecutive whole blocks, each
    cut once it holds ``range_bytes``."""
    out: list[list[_BlockRef]] = []
    cur: list[_BlockRef] = []
    for ref in refs:
        if cur and (ref.data_key != cur[-1].data_key or ref.block.offset != cur[-1].end):
            out.append(cur)
            cur = []
        cur.append(ref)
        if cur[-1].end - cur[0].block.offset >= range_bytes:
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return out


class ReadProbe(Protocol):
    """What the reader reports: the read half of a topic's probe
    (:class:`offloadd.metrics.TopicProbe` implements it)."""

    def index_read(self, seconds: float) -> None: ...
    def data_read(self, seconds: float) -> None: ...
    def read_offload(self, nbytes: int) -> None: ...
    def read_error(self) -> None: ...
    def reread(self) -> None: ...


class NullReadProbe:
    def index_read(self, seconds: float) -> None: pass
    def data_read(self, seconds: float) -> None: pass
    def read_offload(self, nbytes: int) -> None: pass
    def read_error(self) -> None: pass
    def reread(self) -> None: pass


class TierReader:
    def __init__(self, metadata: MetadataStore, blobstore: BlobStore, *, prefetch: int = 4,
                 index_cache: int = 256,
                 probe: ReadProbe | None = None,
                 clock: Callable[[], float] = time.perf_counter,
                 range_bytes: int = DEFAULT_RANGE_BYTES,
                 rereads: int = DEFAULT_REREADS) -> None:
        self.metadata = metadata
        self.blobstore = blobstore
        self.prefetch = max(prefetch, 0)
        self.range_bytes = max(range_bytes, 1)
        self.rereads = max(rereads, 0)
        self.probe: ReadProbe = probe or NullReadProbe()
        self._clock = clock
        self._cache: collections.OrderedDict[str, tuple[StreamingIndex | LedgerIndex, bool]] = (
            collections.OrderedDict())
        self._cache_size = index_cache

    async def segments(self, topic: TopicName, *, committed_only: bool = True) -> list[Segment]:
        try:
            info, _ = await managed_ledger.load(self.metadata, topic.managed_ledger)
        except NotFound as exc:
            # the caller named a topic, not a metadata path: say which topic is missing
            raise NotFound(f"topic {topic} does not exist: {exc}") from exc
        segs = catalog.segments(info)
        return [s for s in segs if s.complete] if committed_only else segs

    async def read(self, topic: TopicName, start: Position | None = None,
                   count: int | None = None) -> AsyncGenerator[Entry, None]:
        """Entries from ``start`` (or the first offloaded one), in log order, at most ``count``.

        ``NotFound`` when ``start`` is not an offloaded entry: past the last one, or before the
        first (deleted by retention, or never offloaded), or in no ledger range of the tier. The
        reader never starts somewhere else than asked.
        """
        left = count
        segs = await self.segments(topic)
        if start is not None:
            _check_start(topic, segs, start)
        for seg in segs:
            if start is not None and seg.end < start:
                continue
            async for e in self.read_segment(seg, start):
                if left is not None:
                    if left <= 0:
                        return
                    left -= 1
                yield e
            if left is not None and left <= 0:
                return

    async def read_segment(self, seg: Segment, start: Position | None = None
                           ) -> AsyncGenerator[Entry, None]:
        groups = _ranges(await self._block_refs(seg, start), self.range_bytes)
        pending: collections.deque[asyncio.Task[list[_Checked]]] = collections.deque()
        i = 0
        marks: dict[str, tuple[_BlockRef, bool]] = {}  # see _same_marks
        try:
            while i < len(groups) or pending:
                while i < len(groups) and len(pending) <= self.prefetch:
                    pending.append(asyncio.create_task(self._fetch(groups[i])))
                    i += 1
                checked = await pending.popleft()
                self._same_marks(checked, marks)
                for ref, entries, _ in checked:
                    rng = next(r for r in seg.ranges if r.ledger_id == ref.ledger_id)
                    for entry_id, payload in entries:
                        pos = Position(ref.ledger_id, entry_id)
                        if entry_id < rng.first or entry_id > rng.last:
                            continue
                        if start is not None and pos < start:
                            continue
                        yield Entry(pos, payload)
        finally:
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)

    async def _get(self, ref: _BlockRef, end: int) -> bytes:
        """Bytes ``ref.block.offset .. end`` of the block's data object, timed and counted."""
        t0 = self._clock()
        try:
            data = await self.blobstore.get_range(ref.data_key, ref.block.offset, end)
        except Exception:
            self.probe.read_error()
            raise
        self.probe.data_read(self._clock() - t0)
        self.probe.read_offload(len(data))
        return data

    async def _checked(self, what: str, fetch: Callable[[], Awaitable[bytes]],
                       check: Callable[[bytes], _T], data: bytes | None = None) -> _T:
        """``check(await fetch())``, fetched again (at most ``rereads`` times) while ``check``
        raises ``FormatError``: damage in transit is not called corruption of the stored object
        before a re-read shows it again. The last error is raised (and counted) when every
        answer failed, or at once when an answer repeats the last one byte for byte (the store
        holds those bytes: reading them again changes nothing). ``data``: the first answer,
        when the caller already has it."""
        if data is None:
            data = await fetch()
        tries = 0
        while True:
            try:
                return check(data)
            except FormatError as exc:
                if tries >= self.rereads:
                    self.probe.read_error()
                    raise
                tries += 1
                self.probe.reread()
                log.warning("%s failed its checks (%s); reading it again (%d of %d) before "
                            "calling the stored object corrupt", what, exc, tries, self.rereads)
                again = await fetch()
                if again == data:
                    self.probe.read_error()
                    raise
                data = again

    async def _fetch(self, group: list[_BlockRef]) -> list[_Checked]:
        """One ranged GET of the consecutive blocks of ``group``, every block checked (a GET
        whose answer fails the checks is made again, see :meth:`_checked`)."""
        first, end = group[0], group[-1].end
        want = end - first.block.offset

        def check(data: bytes) -> list[_Checked]:
            if len(data) != want:
                bad = next((r for r in group if r.end - first.block.offset > len(data)),
                           group[-1])
                how = "truncated" if len(data) < want else "followed by extra bytes"
                raise FormatError(first.data_key, first.block.offset + min(len(data), want),
                                  f"block {bad.block.part_id} is {how}: got {len(data)} of "
                                  f"{want} bytes (one ranged read of blocks "
                                  f"{first.block.part_id}..{group[-1].block.part_id})")
            buf = memoryview(data)
            base = first.block.offset
            return [(ref, *self._entries(ref, buf[ref.block.offset - base:ref.end - base]))
                    for ref in group]

        return await self._checked(
            f"{first.data_key} (blocks {first.block.part_id}..{group[-1].block.part_id})",
            lambda: self._get(first, end), check)

    @staticmethod
    def _where(ref: _BlockRef) -> str:
        return f"{ref.data_key} (block {ref.block.part_id} at byte {ref.block.offset})"

    @staticmethod
    def _header(buf: bytes | memoryview, ref: _BlockRef, where: str, *, whole: bool = True
                ) -> BlockHeader:
        """The block's header, checked against what the index says of the block; ``whole``:
        ``buf`` holds the whole block, not only its head."""
        hdr = parse_block_header(buf, 0, where, whole=whole)
        if hdr.block_len != ref.end - ref.block.offset:
            raise FormatError(where, 12, f"block length {hdr.block_len} disagrees with the "
                              f"index ({ref.end - ref.block.offset})")
        if hdr.first_entry_id != ref.block.first_entry_id:
            raise FormatError(where, 20, f"first entry {hdr.first_entry_id} but the index "
                              f"says {ref.block.first_entry_id}")
        if hdr.ledger_id is not None and hdr.ledger_id != ref.ledger_id:
            raise FormatError(where, 28, f"ledger {hdr.ledger_id} but the index says "
                              f"{ref.ledger_id}")
        return hdr

    def _same_marks(self, checked: list[_Checked],
                    first: dict[str, tuple[_BlockRef, bool]]) -> None:
        """A pair nothing says is checksummed (Pulsar's own) has no block with the mark, or
        all of its blocks have it (offloadd's, whose records were lost): one block without it
        among marked ones is a damaged mark, refused as the trusted record would refuse it.
        ``first``: per data object, its first block read and whether that one had the mark."""
        for ref, _, marked in checked:
            if ref.checksummed:
                continue
            seen, seen_marked = first.setdefault(ref.data_key, (ref, marked))
            if seen_marked != marked:
                bad = seen if marked else ref
                self.probe.read_error()
                raise FormatError(self._where(bad), CHECKSUM_OFFSET, "block checksum mark "
                                  f"damaged: block {bad.block.part_id} lacks the mark (header "
                                  "bytes 36..39) that other blocks of the object carry, so it "
                                  "cannot be checked and is not trusted")

    def _entries(self, ref: _BlockRef, buf: bytes | memoryview
                 ) -> tuple[list[tuple[int, memoryview]], bool]:
        where = self._where(ref)
        hdr = self._header(buf, ref, where)
        marked = verify_block_checksum(buf, 0, hdr.block_len, where, required=ref.checksummed)
        out = list(iter_block_entries(buf, 0, where))
        if not out:
            raise FormatError(where, HEADER_LEN, "block holds no entry")
        if out[0][0] != ref.block.first_entry_id:
            raise FormatError(where, HEADER_LEN, "first entry id disagrees with the header")
        return out, marked

    async def check_segment(self, seg: Segment, head_bytes: int = 64 * 1024) -> None:
        """Read ``seg``'s index and the head of its last block back from the tier: proof that a
        reader can fetch it (keys, credentials, decryption all work) and that the block the
        index points at starts as the index says. Cheap: the index plus ``head_bytes``.
        Raises what a read would (``FormatError``, the store's errors)."""
        refs = await self._block_refs(seg, None)
        if not refs:
            raise FormatError(str(seg.uid), 0, "the segment's index lists no block")
        ref = refs[-1]
        end = min(ref.end, ref.block.offset + max(head_bytes, HEADER_LEN))
        where = self._where(ref)

        def check(data: bytes) -> None:
            if len(data) != end - ref.block.offset:
                raise FormatError(where, len(data), f"got {len(data)} of "
                                  f"{end - ref.block.offset} bytes")
            # only the head was fetched: a block longer than that is the normal case (production
            # blocks are up to 64 MiB), so the block's length is checked against the index only
            self._header(data, ref, where, whole=False)

        await self._checked(where, lambda: self._get(ref, end), check)

    async def index(self, key: str) -> StreamingIndex | LedgerIndex:
        return (await self._index(key))[0]

    async def _index(self, key: str) -> tuple[StreamingIndex | LedgerIndex, bool]:
        """The decoded index and whether its metadata or its own bytes say every block carries
        a CRC32C."""
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        t0 = self._clock()
        info = await self.blobstore.head(key)
        version = info.metadata.get(FORMAT_VERSION_KEY)
        if version is not None and version != "1":
            # Pulsar's readers refuse a version they do not know; so do we, rather than guess
            self.probe.read_error()
            raise FormatError(key, 0, f"unknown object format version {version!r} "
                              f"({FORMAT_VERSION_KEY}); this offloadd reads version 1")
        want = info.metadata.get("offloadd-crc32c")

        def check(raw: bytes) -> StreamingIndex | LedgerIndex:
            idx = decode_index(raw, key)  # structural damage: an error naming the byte
            if want is not None and f"{crc32c.crc32c(raw):08x}" != want.lower():
                # damage the structure cannot show (a part id, a timestamp)
                raise FormatError(key, 0, f"index checksum mismatch: CRC32C "
                                  f"{crc32c.crc32c(raw):08x}, recorded {want} (the stored index "
                                  "is corrupt)")
            return idx

        async def fetch() -> bytes:
            try:
                return await self.blobstore.get_range(key, 0, info.size)
            except Exception:
                self.probe.read_error()
                raise

        raw = await fetch()
        self.probe.index_read(self._clock() - t0)
        idx = await self._checked(key, fetch, check, raw)
        # the metadata, or the record in the index's own bytes (which a copy cannot drop)
        entry = (idx, blocks_checksummed(info.metadata) or idx.records_checksums)
        self._cache[key] = entry
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return entry

    async def _block_refs(self, seg: Segment, start: Position | None) -> list[_BlockRef]:
        refs: list[_BlockRef] = []
        if seg.kind is SegmentKind.STREAMING:
            key = streaming_index_key(seg.uid)
            idx, checked = await self._index(key)
            if not isinstance(idx, StreamingIndex):
                raise FormatError(key, 0, "expected a streaming index, found a ledger-based one")
            data_key = streaming_data_key(seg.uid)
            for r in seg.ranges:
                try:
                    section = idx.section(r.ledger_id)
                except NotFound:
                    raise FormatError(key, 0, f"index has no section for ledger {r.ledger_id} "
                                      f"of segment {seg.uid}") from None
                if section.last_entry_id < r.last:
                    raise FormatError(key, 0, f"index ends ledger {r.ledger_id} at entry "
                                      f"{section.last_entry_id}, metadata says {r.last}")
                refs.extend(_BlockRef(data_key, r.ledger_id, b, idx.block_end(b), checked)
                            for b in section.blocks)
        else:
            (r,) = seg.ranges
            key = ledger_index_key(seg.uid, r.ledger_id)
            lidx, checked = await self._index(key)
            if not isinstance(lidx, LedgerIndex):
                raise FormatError(key, 0, "expected a ledger-based index, found a streaming one")
            data_key = ledger_data_key(seg.uid, r.ledger_id)
            refs.extend(_BlockRef(data_key, r.ledger_id, b, lidx.block_end(b), checked)
                        for b in lidx.blocks)
        if start is not None:
            refs = [ref for i, ref in enumerate(refs)
                    if not _block_before(ref, refs[i + 1] if i + 1 < len(refs) else None, start)]
        return refs


def _check_start(topic: TopicName, segs: list[Segment], start: Position) -> None:
    if any(seg.contains(start) for seg in segs):
        return
    if not segs:
        raise NotFound(f"{topic} has no offloaded entries yet, so none from {start}")
    first, last = segs[0].begin, segs[-1].end
    if start > last:
        raise NotFound(f"{start} is past the last offloaded entry of {topic} ({last}); "
                       f"offloaded entries are {first}..{last}")
    if start < first:
        raise NotFound(f"{start} is before the first offloaded entry of {topic} ({first}): "
                       "it was deleted by retention or never offloaded; offloaded entries "
                       f"are {first}..{last}")
    after = next(seg.begin for seg in segs if seg.begin > start)
    raise NotFound(f"{start} is not an offloaded entry of {topic} (no such entry in its "
                   f"ledger, or a range deleted by retention); the next offloaded entry is "
                   f"{after}")


def _block_before(ref: _BlockRef, nxt: _BlockRef | None, start: Position) -> bool:
    """True when every entry of ``ref`` lies before ``start`` (the next block of the same
    ledger starts at or before it)."""
    if ref.ledger_id < start.ledger_id:
        return True
    if ref.ledger_id > start.ledger_id:
        return False
    return nxt is not None and nxt.ledger_id == ref.ledger_id and \
        nxt.block.first_entry_id <= start.entry_id
