"""``parse_size``: sizes with units (issue 23 item 12)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from offloadd.model.sizes import UNITS, parse_size, size_text

UNIT_NAMES = ["B", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB"]


@pytest.mark.parametrize(("text", "n"), [
    ("64MiB", 64 * 2**20), ("2MB", 2_000_000), ("512KiB", 512 * 1024), ("1GiB", 2**30),
    ("1048576", 1048576), ("0", 0), ("64 MiB", 64 * 2**20), ("64mib", 64 * 2**20),
    ("1.5GiB", 3 * 2**29), ("10B", 10), (" 8MiB ", 8 * 2**20), ("1.25KB", 1250),
])
def test_the_documented_forms(text: str, n: int) -> None:
    assert parse_size(text) == n


@given(st.integers(min_value=0, max_value=10**15))
def test_a_plain_integer_is_bytes(n: int) -> None:
    assert parse_size(str(n)) == n


@given(st.integers(min_value=0, max_value=10**9), st.sampled_from(UNIT_NAMES),
       st.booleans(), st.booleans())
def test_a_number_with_a_unit(n: int, unit: str, space: bool, lower: bool) -> None:
    text = f"{n}{' ' if space else ''}{unit.lower() if lower else unit}"
    assert parse_size(text) == n * UNITS[unit.lower()]


@given(st.integers(min_value=0, max_value=10**6), st.integers(min_value=0, max_value=99),
       st.sampled_from(UNIT_NAMES))
def test_a_fraction_is_exact_or_refused(whole: int, frac: int, unit: str) -> None:
    text = f"{whole}.{frac:02d}{unit}"
    exact = (whole * 100 + frac) * UNITS[unit.lower()]
    if exact % 100 == 0:
        assert parse_size(text) == exact // 100
    else:
        with pytest.raises(ValueError, match="whole number of bytes"):
            parse_size(text)


def _outcome(text: str) -> int | str:
    try:
        return parse_size(text)
    except ValueError as exc:
        return str(exc)


@given(st.text(max_size=12))
def test_anything_else_is_a_value_error_naming_the_forms(text: str) -> None:
    got = _outcome(text)
    if isinstance(got, str):
        assert "whole number of bytes" in got or ("64MiB" in got and "2MB" in got), got
    else:
        assert got >= 0


@pytest.mark.parametrize("text", ["", "MiB", "-1MiB", "64 mebibytes", "1e6", "64MiBs", "٦٤MiB",
                                  "64 KiB B", "1_000", "0x10", "5.MiB", ".5MiB", "64.5"])
def test_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"not a size|whole number"):
        parse_size(text)


@given(st.integers(min_value=0, max_value=2**50))
def test_size_text_round_trips_within_its_precision(n: int) -> None:
    shown = size_text(n)
    number, unit = shown.split(" ")
    back = float(number) * {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[unit]
    assert abs(back - n) <= 0.05 * 2**{"B": 0, "KiB": 10, "MiB": 20, "GiB": 30}[unit] + 0.5
