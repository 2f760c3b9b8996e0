"""Sizes with units, as the configuration and the command line take them: ``"64MiB"``,
``"2MB"``, ``"512KiB"``, ``"1GiB"``, or a plain integer of bytes.

``K``/``M``/``G``/``T`` with ``B`` are powers of 1000 (``2MB`` = 2,000,000 bytes), with ``iB``
powers of 1024 (``2MiB`` = 2,097,152), as in IEC 80000-13; the unit is case-insensitive
(``64mib``), a space may stand between the number and it, and the number may have a fraction
when the result is a whole number of bytes (``1.5GiB``). Pure: no I/O.
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["SIZE_FORMS", "SIZE_UNITS", "UNITS", "MiB", "parse_size", "size_text"]

MiB = 2**20  # the one mebibyte constant of the package

UNITS: dict[str, int] = {
    "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
# what an error message lists as the accepted forms
SIZE_UNITS = ('"64MiB", "2MB", "512KiB", "1GiB" (KB, MB, GB, TB: powers of 1000; KiB, MiB, GiB, '
              'TiB: powers of 1024)')
SIZE_FORMS = f"an integer number of bytes, or a number with a unit: {SIZE_UNITS}"

_SIZE = re.compile(r"([0-9]{1,20})(?:\.([0-9]{1,20}))? ?([a-zA-Z]{1,3})?")


def parse_size(text: str) -> int:
    """The number of bytes ``text`` names; ``ValueError`` saying why and which forms are
    accepted. Negative sizes are refused (a key whose negative value means "off" takes a
    plain number, which its own field checks)."""
    m = _SIZE.fullmatch(text.strip()) if text.isascii() else None
    unit = (m.group(3) or "b").lower() if m else ""
    if m is None or unit not in UNITS or (m.group(2) is not None and m.group(3) is None):
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise ValueError(f"{shown!r} is not a size; a size is {SIZE_FORMS}")
    number = Fraction(int(m.group(1)))
    if m.group(2):
        number += Fraction(int(m.group(2)), 10 ** len(m.group(2)))
    total = number * UNITS[unit]
    if total.denominator != 1:
        raise ValueError(f"{text.strip()!r} is not a whole number of bytes")
    return int(total)


def size_text(n: float) -> str:
    """``n`` bytes for a reader: ``"512 B"``, ``"1.5 KiB"``, ``"64.0 MiB"``, ``"2.3 GiB"``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover
