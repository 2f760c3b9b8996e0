"""Checks a run read from a ledger against the store's checksums (:class:`RunCheck`).

See :mod:`offloadd.ledger.local`: the frames are checked chunk by chunk against ``.sum`` and the
offsets that cut them against ``.osum`` (reading at most a chunk more at each end), and only
where no chunk record covers them (or a chunk does not match, so the error names the entry)
entry by entry: frame header and payload CRC32C.

The chunk CRC32Cs computed over the run's bytes are handed on with the run (``EntryRun.sums``,
the chunks lying wholly inside it): the block checksum is combined from them
(``format/checksum.py``) instead of a second pass over the same bytes.

A run read into a buffer is checksummed as it is read (:func:`read_summed`): a piece at a time,
each piece's chunk CRC32Cs computed right after its read, while the kernel's copy has left its
bytes in the CPU's cache. A whole run (up to a 64 MiB block) fits no cache, and the one CRC32C
pass over it from memory cost about twice as much.
"""

from __future__ import annotations

import logging
import operator
import os
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from itertools import repeat
from pathlib import Path
from typing import NoReturn

import crc32c

from offloadd.errors import FormatError
from offloadd.ledger.base import ReadArray
from offloadd.ledger.local.files import LedgerFiles, opened, pread
from offloadd.ledger.local.records import (
    CHUNK,
    CRC_SIZE,
    OFF_CHUNK,
    OFF_SIZE,
    chunk_crcs,
    slices,
    uint32s,
)
from offloadd.model import FRAME, FRAME_OVERHEAD, EntryRun, PieceSums, TopicName

log = logging.getLogger(__name__)

# Bytes read per call by read_summed: a multiple of the chunk, and well within a core's L2
# (1 MiB measured best here against 256 KiB and 4 MiB; each call is one more syscall, 64 per
# 64 MiB block).
PIECE = 16 * CHUNK


def read_summed(fd: int, buf: ReadArray, n: int, offset: int, name: Path,
                chunk: int = CHUNK, piece: int = PIECE) -> tuple[memoryview, array[int]]:
    """Read bytes ``offset .. offset + n`` of the file at ``fd`` into the front of ``buf`` (as
    ``pread_into``) and return a view of them with the CRC32C of each ``chunk`` of the file
    they touch, chunk ``offset // chunk`` first: of the bytes of that chunk that lie before
    ``offset + n``, from the chunk's start (so the first one covers the bytes before
    ``offset`` too, read for it).

    Each ``piece`` of the file (any length; a multiple of the chunk cuts no chunk but the first
    and the last) is checksummed right after its read, while the read has left it in the
    CPU's cache (see the module docstring)."""
    view = memoryview(buf)[:n]
    k0 = offset // chunk
    # the CRC32C of the chunk in progress, from its start (the bytes before offset read for it)
    crc = crc32c.crc32c(pread(fd, offset - k0 * chunk, k0 * chunk, name))
    out = array("I")
    at = 0
    while at < n:
        stop = min(n, ((offset + at) // piece + 1) * piece - offset)
        got = at
        while got < stop:
            k = os.preadv(fd, [view[got:stop]], offset + got)
            if k == 0:
                raise FormatError(str(name), offset,
                                  f"wanted {n} bytes, file ends after {got}")
            got += k
        # the chunk in progress is carried on up to the first boundary, then whole chunks, then
        # what is left of the piece starts the next chunk
        edge = min(stop, -(-(offset + at) // chunk) * chunk - offset)
        if edge > at:
            crc = crc32c.crc32c(view[at:edge], crc)
            if (offset + edge) % chunk == 0:
                out.append(crc)
                crc = 0
        whole = (stop - edge) // chunk
        out.extend(map(crc32c.crc32c, slices(view, range(edge, edge + whole * chunk, chunk),
                                             chunk)))
        rest = edge + whole * chunk
        if rest < stop:
            crc = crc32c.crc32c(view[rest:stop], crc)
        at = stop
    if (offset + n) % chunk:
        out.append(crc)
    return view, out


class RunCheck:
    """Checks one run read from a ledger against the store's checksums (see the module
    docstring); raises :class:`FormatError` naming topic, ledger, entry and file.

    Two things are checked: the frames (``.log`` bytes, against ``.sum``) and the offsets that
    cut them (the run's ``.off`` records, against ``.osum``): a rotten offset would cut blocks
    mid-frame as surely as a rotten byte would corrupt an entry.
    """

    def __init__(self, topic: TopicName, files: LedgerFiles, base: int, run: EntryRun) -> None:
        """``run`` was read from ``files`` at byte ``base`` of the log."""
        self.topic, self.files, self.base = topic, files, base
        self.ledger_id, self.first = run.ledger_id, run.first_entry_id
        self.view, self.offsets = run.data, run.offsets
        self.crcs: Sequence[int] = run.crcs if run.crcs is not None else ()
        self.end = base + len(run.data)

    def run(self, log_fd: int, raw: memoryview, published: tuple[int, int],
            log_crcs: array[int] | None = None) -> PieceSums | None:
        """``raw``: the ``.off`` records the run's offsets were made of; ``published``:
        (entries, end of their frames) — records past it may be cut; ``log_crcs``: the chunk
        CRC32Cs :func:`read_summed` computed as it read the run, if it did. Returns the CRC32Cs
        of the whole chunks of the run's bytes, as computed from them (the run's ``sums``)."""
        count = len(self.offsets) - 1
        # the frames
        bad, covered, sums = compare_chunks(log_fd, self.files.log, self.files.sum, CHUNK,
                                             self.base, self.view, published[1], log_crcs)
        for k in bad:
            lo = max(k * CHUNK, self.base) - self.base
            hi = min((k + 1) * CHUNK, self.end) - self.base
            self.entries(bisect_right(self.offsets, lo) - 1, bisect_left(self.offsets, hi))
            self.suspect(self.files.log, self.files.sum, k, CHUNK)
        # the run's .off records: where its frames start, and the next one's start (the
        # ledger's last entry's end comes from its frame header, checked with the frames)
        with opened(self.files.off) as off_fd:
            off_bad, off_covered, _ = compare_chunks(off_fd, self.files.off, self.files.osum,
                                                      OFF_CHUNK, OFF_SIZE * self.first, raw,
                                                      OFF_SIZE * published[0])
        for k in off_bad:
            lo = k * OFF_CHUNK // OFF_SIZE - self.first
            self.entries(max(lo - 1, 0), min(lo + OFF_CHUNK // OFF_SIZE, count))
            self.suspect(self.files.off, self.files.osum, k, OFF_CHUNK)
        # what no record covers yet (a ledger being written, or written before the records
        # existed), entry by entry: from the first entry whose frame or offset is uncovered
        uncovered = min(bisect_right(self.offsets, covered - self.base) - 1,
                        max(off_covered // OFF_SIZE - self.first - 1, 0))
        self.entries(max(uncovered, 0), count)
        return sums

    def suspect(self, data: Path, sums: Path, k: int, chunk: int) -> None:
        log.warning("topic %s: ledger %d: bytes %d..%d of %s do not match their chunk "
                    "checksum in %s, yet every entry read from them checks out; the damage is "
                    "elsewhere in the chunk or in its record", self.topic, self.ledger_id,
                    k * chunk, (k + 1) * chunk, data, sums)

    def entries(self, i: int, j: int) -> None:
        """Check entries ``i .. j-1`` of the run one by one: frame header and payload CRC32C.
        The comparisons run in C (``map``); only a failure loops in Python, to name it."""
        if i >= j:
            return
        view, offsets = self.view, self.offsets
        starts, ends = offsets[i:j], offsets[i + 1:j + 1]
        lengths = list(map(operator.sub, map(operator.sub, ends, starts),
                           repeat(FRAME_OVERHEAD)))
        if min(lengths) < 0 or max(ends) > len(view):  # rotten offsets: nothing to slice
            n = next(n for n, length in enumerate(lengths)
                     if length < 0 or ends[n] > len(view))
            self.fail(starts[n], self.first + i + n, f"its offset index record says it spans "
                      f"bytes {self.base + starts[n]}..{self.base + ends[n]} of the log, which "
                      "cannot be (the offset index is corrupt)")
        headers = list(map(FRAME.unpack_from, repeat(view), starts))
        payloads = map(view.__getitem__, map(slice, map(operator.add, starts,
                                                         repeat(FRAME_OVERHEAD)), ends))
        got = array("I", map(crc32c.crc32c, payloads))
        ids = range(self.first + i, self.first + j)
        if headers == list(zip(lengths, ids, strict=True)) and got == self.crcs[i:j]:
            return
        for n in range(j - i):
            entry = self.first + i + n
            if headers[n] != (lengths[n], entry):
                self.fail(starts[n], entry, f"its frame header says entry {headers[n][1]} of "
                          f"{headers[n][0]} bytes, the offset index entry {entry} of "
                          f"{lengths[n]}")
            if got[n] != self.crcs[i + n]:
                self.fail(starts[n], entry, f"payload CRC32C {got[n]:#010x} differs from the "
                          f"stored {self.crcs[i + n]:#010x}")

    def fail(self, start: int, entry: int, problem: str) -> NoReturn:
        raise FormatError(f"{self.files.log} (topic {self.topic}, ledger {self.ledger_id})",
                          self.base + start,
                          f"entry {entry}: {problem}: the ledger file is corrupt, so the entry "
                          "is not offloaded (the segment fails and is retried until the file is "
                          "repaired; it is never skipped)")


def compare_chunks(fd: int, path: Path, sums: Path, chunk: int, base: int, view: memoryview,
                   published: int, crcs: array[int] | None = None
                   ) -> tuple[list[int], int, PieceSums | None]:
    """Compare bytes ``base .. base+len(view)`` of the file at ``fd`` (``view`` holds them)
    with the chunk CRC32Cs in ``sums``, reading at most a chunk more at each end.

    ``crcs``: the chunks' CRC32Cs as :func:`read_summed` computed them when it read ``view``;
    then the view's bytes are not read again, only the bytes after it in its last chunk.

    Returns the chunks that do not match, where the covered bytes end (chunks with a record
    and wholly within ``published`` are compared; from the returned offset on nothing is), and
    the CRC32Cs computed of the chunks lying wholly inside ``view`` (offsets relative to it;
    what the bytes are, matching their records or not).
    """
    end = base + len(view)
    k0 = base // chunk
    try:
        with opened(sums) as sum_fd:
            k1 = min(os.fstat(sum_fd).st_size // CRC_SIZE, published // chunk, -(-end // chunk))
            if k1 <= k0:
                return [], base, None
            want = uint32s(pread(sum_fd, CRC_SIZE * (k1 - k0), CRC_SIZE * k0, sums))
    except FileNotFoundError:  # a ledger written before the records existed
        return [], base, None
    stop = min(end, k1 * chunk)
    tail = pread(fd, k1 * chunk - end, end, path) if k1 * chunk > end else b""
    if crcs is None:
        head = pread(fd, base - k0 * chunk, k0 * chunk, path)
        got = chunk_crcs(head, view[:stop - base], tail, chunk)
    else:
        # crcs[i] is chunk k0 + i up to the view's end: the chunks with records, the last one
        # (when the view ends inside it) carried on over the tail
        got = crcs[:k1 - k0]
        if tail:
            got[-1] = crc32c.crc32c(tail, got[-1])
    # one comparison in C; a chunk at a time only to find what differs
    bad = [] if got == want else [k0 + i for i, (g, w) in enumerate(zip(got, want, strict=True))
                                  if g != w]
    # got[0] covers the bytes before the view too, got[-1] the tail: only the chunks between
    # lie in view
    first = 1 if base > k0 * chunk else 0
    last = len(got) - (1 if tail else 0)
    return bad, stop, _inside(got, first, last, k0 * chunk - base, chunk)


def whole_chunks(base: int, n: int, crcs: array[int], chunk: int = CHUNK) -> PieceSums | None:
    """The CRC32Cs of the chunks lying wholly inside bytes ``base .. base + n`` of the file, as
    :func:`read_summed` returned them for that read (offsets relative to the read)."""
    first = 1 if base % chunk else 0
    last = len(crcs) - (1 if (base + n) % chunk else 0)
    return _inside(crcs, first, last, base // chunk * chunk - base, chunk)


def _inside(got: array[int], first: int, last: int, at: int, chunk: int) -> PieceSums | None:
    """``got[first:last]`` as the sums of their chunks; ``at``: where got[0]'s chunk starts,
    relative to the view."""
    if last <= first:
        return None
    return PieceSums(range(at + first * chunk, at + last * chunk + 1, chunk), got[first:last])

