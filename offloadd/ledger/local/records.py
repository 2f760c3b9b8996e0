"""The embedded store's records, computed without I/O: frames, offsets and checksums.

Every ``<ledgerId>`` has five files (see :mod:`offloadd.ledger.local`); this module computes
what is appended to them and decodes what is read back. Every per-entry step runs in C (``map``,
``zip``, ``accumulate``, one big-integer subtraction): Python code never loops over entries.

==========  ===========================================================================
file        record
==========  ===========================================================================
``.log``    :data:`FRAME` ``[int32 payload length][int64 entryId]`` then the payload (big-endian)
``.crc``    uint32 little-endian CRC32C of each payload
``.off``    :data:`OFF`: int64 little-endian offset in ``.log`` where each frame starts
``.sum``    uint32 little-endian CRC32C of each complete :data:`CHUNK` of ``.log``
``.osum``   the same for each complete :data:`OFF_CHUNK` of ``.off`` (128 offsets)
==========  ===========================================================================
"""

from __future__ import annotations

import operator
import struct
import sys
from array import array
from collections.abc import Iterator, Sequence
from itertools import accumulate, chain, repeat

import crc32c

from offloadd.model import FRAME, FRAME_OVERHEAD

LITTLE = sys.byteorder == "little"
LEN = struct.Struct(">i")  # its first field alone
OFF = struct.Struct("<q")
OFF_SIZE = OFF.size
CRC_SIZE = 4
CHUNK = 64 * 1024  # .log bytes per .sum record
OFF_CHUNK = 1024  # .off bytes (128 offsets) per .osum record


def frame_entries(payloads: Sequence[bytes], first_entry_id: int,
                  start: int) -> tuple[bytes, bytes, bytes, int]:
    """Frame a batch for a ledger whose ``.log`` currently ends at ``start``.

    Returns the ``.log``, ``.crc`` and ``.off`` bytes to append and the new end of ``.log``.
    Every per-entry step runs in C (``map``/``zip``/``accumulate``): Python code never loops
    over the entries.
    """
    sizes = list(map(len, payloads))
    heads = map(FRAME.pack, sizes, range(first_entry_id, first_entry_id + len(payloads)))
    frames = b"".join(chain.from_iterable(zip(heads, payloads, strict=True)))
    starts = array("q", accumulate(map(operator.add, sizes, repeat(FRAME_OVERHEAD)),
                                   initial=start))
    end = starts.pop()
    crcs = array("I", map(crc32c.crc32c, payloads))
    if not LITTLE:
        starts.byteswap()
        crcs.byteswap()
    return frames, crcs.tobytes(), starts.tobytes(), end


def chunk_sums(data: bytes | memoryview, start: int, partial: int,
               chunk: int = CHUNK) -> tuple[bytes, int]:
    """Chunk-checksum records (``.sum`` for ``.log``, ``.osum`` for ``.off``) for ``data``
    appended to a file that ends at ``start``.

    ``partial`` is the CRC32C of the file's last, incomplete chunk (0 when ``start`` is on a
    chunk boundary). Returns the records of the chunks ``data`` completes (the first is chunk
    ``start // chunk``) and the CRC32C of the chunk it leaves incomplete.
    """
    view = memoryview(data)
    out = array("I")
    i = min(chunk - start % chunk, len(view))
    partial = crc32c.crc32c(view[:i], partial)
    if (start + i) % chunk == 0 and i:
        out.append(partial)
        partial = 0
    whole = (len(view) - i) // chunk
    out.extend(map(crc32c.crc32c, slices(view, range(i, i + whole * chunk, chunk), chunk)))
    i += whole * chunk
    partial = crc32c.crc32c(view[i:], partial)
    if not LITTLE:
        out.byteswap()
    return out.tobytes(), partial


def slices(view: memoryview, starts: Sequence[int], length: int) -> Iterator[memoryview]:
    """``view[s:s + length]`` for each start, made in C (``map``), not in a Python loop."""
    return map(view.__getitem__, map(slice, starts, map(operator.add, starts, repeat(length))))


def rebased(raw: bytes, base: int) -> array[int]:
    """Little-endian int64 records minus ``base``, without a Python loop.

    Every record is ≥ ``base``, so subtracting ``base`` from each 8-byte lane of one big integer
    never borrows across lanes: one big-int subtraction rebases them all.
    """
    n = len(raw) // OFF_SIZE
    delta = int.from_bytes(raw, "little") - int.from_bytes(OFF.pack(base) * n, "little")
    out = array("q")
    out.frombytes(delta.to_bytes(len(raw), "little"))
    if not LITTLE:
        out.byteswap()
    return out


def uint32s(raw: bytes) -> array[int]:
    out = array("I")
    out.frombytes(raw)
    if not LITTLE:
        out.byteswap()
    return out


def chunk_crcs(head: bytes, body: memoryview, tail: bytes, chunk: int) -> array[int]:
    """CRC32C of each chunk of ``head + body + tail`` (which starts on a chunk boundary and is
    a whole number of chunks long) without joining the three."""
    out = array("I")
    i = min(chunk - len(head), len(body))
    crc = crc32c.crc32c(body[:i], crc32c.crc32c(head))
    if len(head) + i == chunk:
        out.append(crc)
        crc, filled = 0, 0
    else:
        filled = len(head) + i
    whole = (len(body) - i) // chunk
    out.extend(map(crc32c.crc32c, slices(body, range(i, i + whole * chunk, chunk), chunk)))
    i += whole * chunk
    if i < len(body):
        crc = crc32c.crc32c(body[i:], crc)
        filled += len(body) - i
    if tail:
        crc = crc32c.crc32c(tail, crc)
        filled += len(tail)
    if filled:
        out.append(crc)
    return out
