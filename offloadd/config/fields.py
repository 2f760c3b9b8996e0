"""What every configuration section is built from: the base model, Pulsar's alias names."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict

from offloadd.errors import ConfigError
from offloadd.model import TopicName

MiB = 1024 * 1024


def alias(*names: str) -> Any:
    """A key and the Pulsar names accepted for it (``alias("key", "pulsarName")``)."""
    return AliasChoices(*names)


def topic_keys(names: Iterable[str]) -> None:
    """Every table key must be a full topic name (``persistent://tenant/ns/topic``); for a
    validator, so the error names the key."""
    for name in names:
        try:
            TopicName.parse(name)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None


class Section(BaseModel):
    # nan and inf are valid TOML (and parse from the environment): never a usable setting
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True,
                              allow_inf_nan=False)


def key_text(part: object) -> str:
    """A key part as it is written in ``[section.key]`` (quoted unless plain)."""
    text = str(part)
    return text if text.replace("_", "").replace("-", "").isalnum() else json.dumps(text)
