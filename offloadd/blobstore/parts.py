"""The rules of multipart uploads and ranged reads that every blob-store driver applies.

Parts are numbered from 1 and, in number order, tile ``[0, size)`` with no hole and no overlap;
a byte range ``[start, end)`` has ``0 <= start <= end``. A breach is a ``Fatal`` naming the
upload (or key) and the first offending part: it is a caller's bug, never worth a retry.
"""

from __future__ import annotations

from collections.abc import Mapping

from offloadd.errors import Fatal


def check_range(key: str, start: int, end: int) -> None:
    if start < 0 or end < start:
        raise Fatal(f"bad byte range [{start}, {end}) for {key}")


def check_part(upload: str, part_number: int, offset: int, max_number: int | None = None) -> None:
    """``upload`` names the upload in the error (e.g. ``upload of <key>``)."""
    if part_number < 1 or offset < 0 or (max_number is not None and part_number > max_number):
        limit = f" (parts are numbered 1..{max_number})" if max_number is not None else ""
        raise Fatal(f"{upload}: bad part {part_number} at offset {offset}{limit}")


def check_parts(upload: str, parts: Mapping[int, tuple[int, int]]) -> int:
    """Validate ``{part_number: (offset, length)}`` and return the object's size."""
    if not parts:
        raise Fatal(f"{upload}: no parts uploaded; nothing to complete")
    size = 0
    for number in range(1, len(parts) + 1):
        if number not in parts:
            raise Fatal(f"{upload}: parts are not contiguous: part numbers {sorted(parts)} are "
                        f"not 1..{len(parts)}")
        offset, length = parts[number]
        if offset != size:
            raise Fatal(f"{upload}: parts are not contiguous at part {number}: it starts at byte "
                        f"{offset}, expected {size} (a hole or an overlap)")
        size += length
    return size
