"""What every configuration section is built from: the base model, Pulsar's alias names."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from pydantic import AliasChoices, BaseModel, BeforeValidator, ConfigDict

from offloadd.errors import ConfigError
from offloadd.model import TopicName
from offloadd.model.sizes import SIZE_UNITS, MiB, parse_size

_PLAIN_INT = re.compile(r"-?[0-9]+")


def _size_in(unit: int, plain: str, *, fractions: bool) -> BeforeValidator:
    """A key that also takes a size with a unit (``"64MiB"``, ``"2MB"``, :mod:`~offloadd.model
    .sizes`), as a number of ``unit`` bytes; a plain number (TOML's, or the environment's
    text; with ``fractions``, a decimal one too) keeps the key's own unit and goes to the
    field's checks unchanged."""

    def convert(v: object) -> object:
        if not isinstance(v, str):
            return v
        text = v.strip()
        if _PLAIN_INT.fullmatch(text) or (fractions and _is_number(text)):
            return v
        try:
            n = parse_size(text)
        except ValueError:
            raise ValueError(f"must be {plain}, or a size with a unit: {SIZE_UNITS}") from None
        return n if unit == 1 else n / unit

    return BeforeValidator(convert)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return text.isascii()


# Annotated[int, BYTES]: a byte count that also takes "64MiB"; Annotated[float, MIBS]: a key in
# MiB (*_mbytes), a plain number still MiB; Annotated[float, BYTES_PER_S]: a rate in bytes/s
BYTES = _size_in(1, "an integer number of bytes", fractions=False)
MIBS = _size_in(MiB, "a number of MiB", fractions=True)
BYTES_PER_S = _size_in(1, "a number of bytes per second", fractions=True)


def alias(*names: str) -> Any:
    """A key and the Pulsar names accepted for it (``alias("key", "pulsarName")``)."""
    return AliasChoices(*names)


def topic_keys(names: Iterable[str]) -> None:
    """Every table key must be a full topic name (``persistent://tenant/ns/topic``); for a
    validator, so the error names the key."""
    problems = []  # every bad key, a line each
    for name in names:
        try:
            TopicName.parse(name)
        except ConfigError as exc:
            problems.append(str(exc))
    if problems:
        raise ValueError("\n".join(problems))


class Section(BaseModel):
    # nan and inf are valid TOML (and parse from the environment): never a usable setting
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True,
                              allow_inf_nan=False)


def key_text(part: object) -> str:
    """A key part as it is written in ``[section.key]`` (quoted unless plain)."""
    text = str(part)
    return text if text.replace("_", "").replace("-", "").isalnum() else json.dumps(text)


_HOST_RE = re.compile(r"^((?!-)[A-Z\d-]{1,63}(?<!-)\.)*((?!-)[A-Z\d-]{1,63}(?<!-))$", re.I)


def http_url(v: str) -> str:
    """An ``http://`` or ``https://`` URL with a host, as every command needs it (botocore
    refuses the rest as "Invalid endpoint", the same host rules; a scheme other than http(s)
    or an out-of-range port fail at the first request). For a validator: ``ValueError``."""
    if any(c in v for c in "\t\r\n ") or not v.isascii():
        raise ValueError("must be a URL without spaces or control characters, e.g. "
                         "http://127.0.0.1:9000")
    parts = urlsplit(v)
    if parts.scheme not in ("http", "https"):
        raise ValueError("must be an http:// or https:// URL, e.g. http://127.0.0.1:9000")
    host = parts.hostname
    try:
        parts.port  # noqa: B018  (raises for a port that is not a number in 0..65535)
    except ValueError:
        raise ValueError("has a port that is not a number in 1..65535") from None
    if not host or not (_HOST_RE.match(host.rstrip(".")) or (
            ":" in host and parts.netloc.find("[") >= 0)):
        raise ValueError("names no valid host (http://HOST[:PORT][/path])")
    return v
