"""What every configuration section is built from: the base model, Pulsar's alias names."""

from __future__ import annotations

import json
from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict

MiB = 1024 * 1024


def alias(*names: str) -> Any:
    """A key and the Pulsar names accepted for it (``alias("key", "pulsarName")``)."""
    return AliasChoices(*names)


class Section(BaseModel):
    # nan and inf are valid TOML (and parse from the environment): never a usable setting
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True,
                              allow_inf_nan=False)


def key_text(part: object) -> str:
    """A key part as it is written in ``[section.key]`` (quoted unless plain)."""
    text = str(part)
    return text if text.replace("_", "").replace("-", "").isalnum() else json.dumps(text)
