"""The configuration's key space: each section's model, Pulsar's aliases, the secret keys."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, get_args

from pydantic import AliasChoices, BaseModel, SecretStr

from offloadd.config.fields import key_text
from offloadd.config.settings import Settings
from offloadd.errors import ConfigError


def table_model(section: str) -> tuple[type[BaseModel], bool] | None:
    """The model of ``[section]`` and whether it is a table of tables (namespaces, topics)."""
    f = Settings.model_fields.get(section)
    if f is None:
        return None
    ann = f.annotation
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann, False
    args = get_args(ann)
    if len(args) == 2 and isinstance(args[1], type) and issubclass(args[1], BaseModel):
        return args[1], True
    return None


def aliases_of(model: type[BaseModel]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, f in model.model_fields.items():
        if isinstance(f.validation_alias, AliasChoices):
            out.update({str(c): key for c in f.validation_alias.choices if c != key})
    return out


def known_tables(data: dict[str, Any]
                 ) -> Iterator[tuple[str, str | None, dict[str, Any], type[BaseModel], str]]:
    """Each table of a config document that a settings model describes: (section, the name
    inside a per-name section or None, the table, its model, how errors name it)."""
    for section, table in data.items():
        tm = table_model(section)
        if tm is None or not isinstance(table, dict):
            continue
        model, nested = tm
        if not nested:
            yield section, None, table, model, section
            continue
        for name, sub in table.items():
            if isinstance(sub, dict):
                yield section, name, sub, model, f"{section}.{key_text(name)}"


def canonical_keys(data: dict[str, Any]) -> dict[str, Any]:
    """Rename Pulsar's aliases to our snake_case keys, so an environment override of the
    snake_case key replaces a file's alias instead of clashing with it."""

    def rename(table: dict[str, Any], model: type[BaseModel], where: str) -> dict[str, Any]:
        aliases = aliases_of(model)
        out: dict[str, Any] = {}
        for key, value in table.items():
            canon = aliases.get(key, key)
            if canon in out:
                raise ConfigError(f"[{where}] both {canon} and its alias {key} are set; "
                                  "keep one")
            out[canon] = value
        return out

    out = dict(data)
    for section, name, table, model, where in known_tables(data):
        if name is None:
            out[section] = rename(table, model, where)
        else:
            if out[section] is data[section]:
                out[section] = dict(data[section])
            out[section][name] = rename(table, model, where)
    return out


def secret_keys() -> set[tuple[str, str]]:
    out: set[tuple[str, str]] = set()
    for section in Settings.model_fields:
        tm = table_model(section)
        if tm is None:
            continue
        for key, f in tm[0].model_fields.items():
            if "SecretStr" in str(f.annotation):
                out.add((section, key))
    return out


def secret_values(settings: Settings) -> list[str]:
    """Every secret the configuration holds (for the log filter); any section, any key typed
    ``SecretStr``, so a secret added later is covered without a list to keep up to date."""
    out = []
    for section, key in sorted(secret_keys()):
        table = getattr(settings, section)
        for item in table.values() if isinstance(table, dict) else [table]:
            value = getattr(item, key, None)
            if isinstance(value, SecretStr):
                out.append(value.get_secret_value())
    return out
