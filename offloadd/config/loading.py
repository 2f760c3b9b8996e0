"""Loading the configuration (:func:`load`): the TOML file, the environment, one-line errors."""

from __future__ import annotations

import difflib
import os
import stat
import tomllib
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_settings import SettingsError

from offloadd.config.fields import key_text
from offloadd.config.keys import (
    aliases_of,
    canonical_keys,
    known_tables,
    secret_keys,
    table_model,
)
from offloadd.config.settings import Settings
from offloadd.errors import ConfigError


def load(path: Path | str | None, **overrides: Any) -> Settings:
    """Read the TOML file (if any) and the environment.

    Every problem is a line of the ``ConfigError`` (all of them, not the first: an operator
    fixes a file in one round, not one problem per restart): where the value came from (the
    file or the ``OFFLOADD_...`` variable), the key as ``[section.key]``, and what is allowed.
    Values of secret fields and of unknown keys (a misspelt secret is still a secret) are never
    echoed. The checks across keys (``Settings``' own) run once every value on its own is
    valid: they need the values.
    """
    where = str(path) if path is not None else "<defaults>"
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(read_config_text(path))
        except FileNotFoundError:
            raise ConfigError(f"{where}: config file not found") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{where}: not valid TOML ({exc})") from None
        except OSError as exc:
            raise ConfigError(f"{where}: cannot read ({exc.strerror})") from None
    try:
        data = canonical_keys(data)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    typed = toml_type_problems(data)
    problems = [f"{where}: {msg}" for _, msg in typed]
    for key, value in overrides.items():
        section, _, field = key.partition("__")
        data.setdefault(section, {})[field] = value
    env, env_problems = offloadd_environment_problems()
    problems += env_problems
    try:
        settings = Settings(**data)
    except ValidationError as exc:
        seen = {loc for loc, _ in typed}  # a value refused above is not reported twice
        for err in exc.errors():
            if tuple(str(p) for p in err["loc"]) not in seen:
                problems += describe_all(err, where, env)
    except SettingsError as exc:
        problems.append(describe_env_error(exc, env))
    except ConfigError as exc:
        problems += [f"{where}: {line}" for line in str(exc).splitlines()]
    if problems:
        raise ConfigError("\n".join(problems))
    return settings


MAX_CONFIG_BYTES = 16 * 1024 * 1024


def read_config_text(path: Path | str) -> str:
    """The file's text: a regular file (or a pipe, ``--config <(...)``) of at most
    :data:`MAX_CONFIG_BYTES`, in UTF-8 as TOML requires. Read bounded: ``--config /dev/zero``
    grew the process to 13 GB in 16 s."""
    where = str(path)
    with open(path, "rb") as fh:
        mode = os.fstat(fh.fileno()).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
            kind = "a directory" if stat.S_ISDIR(mode) else "a device or socket"
            raise ConfigError(f"{where}: is {kind}, not a config file")
        raw = fh.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{where}: larger than {MAX_CONFIG_BYTES // (1024 * 1024)} MiB; "
                          "a config file is a few KiB (is this the right file?)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x} on line "
                          f"{line}); TOML files are UTF-8: re-save it as UTF-8") from None


def toml_type_problems(data: dict[str, Any]) -> list[tuple[tuple[str, ...], str]]:
    """The file's booleans where numbers go and numbers (or quoted words) where booleans go,
    as (key path, message). pydantic's lax mode takes ``verify_crc = 0`` as false — checksums
    silently off — and ``rollover_entries = true`` as 1; TOML has real booleans, so the file
    must use them. The environment is text and keeps its textual forms (``true``/``false``,
    ``1``/``0``, ``yes``/``no``), which the environment source passes as strings after this
    check."""
    out: list[tuple[tuple[str, ...], str]] = []
    for section, name, table, model, where in known_tables(data):
        _check_table(table, model, where, (section,) if name is None else (section, name), out)
    return out


def _members(ann: Any) -> list[Any]:
    """The types a field's annotation admits, unions (and ``X | None``) flattened."""
    if get_origin(ann) in (Union, types.UnionType):
        return [m for a in get_args(ann) for m in _members(a)]
    return [ann]


def _check_table(table: dict[str, Any], model: type[BaseModel], where: str,
                 loc: tuple[str, ...], out: list[tuple[tuple[str, ...], str]]) -> None:
    for key, value in table.items():
        f = model.model_fields.get(key)
        if f is None:
            continue  # unknown keys are the model's to name
        members = _members(f.annotation)
        shown = f"[{where}.{key_text(key)}]"
        words = [w for m in members if get_origin(m) is Literal for w in get_args(m)]
        if bool in members and not isinstance(value, bool) and value not in words and (
                isinstance(value, int | float | str)):
            got = (f"the string {value!r} (TOML's booleans are unquoted)"
                   if isinstance(value, str) else f"{value!r}")
            also = "".join(f" or {w!r}" for w in words)
            out.append(((*loc, key), f"{shown} must be true or false{also}, not {got}"))
        if isinstance(value, bool) and bool not in members and (
                int in members or float in members):
            kind = "an integer" if int in members else "a number"
            out.append(((*loc, key), f"{shown} must be {kind}, not the boolean "
                        f"{str(value).lower()}"))
        for m in members:
            if isinstance(m, type) and issubclass(m, BaseModel) and isinstance(value, dict):
                _check_table(value, m, f"{where}.{key_text(key)}", (*loc, key), out)
            if get_origin(m) is list and isinstance(value, list):
                item = get_args(m)[0] if get_args(m) else None
                if isinstance(item, type) and issubclass(item, BaseModel):
                    for n, v in enumerate(value):
                        if isinstance(v, dict):
                            _check_table(v, item, f"{where}.{key_text(key)}[{n}]",
                                         (*loc, key, str(n)), out)


def offloadd_environment_problems() -> tuple[dict[tuple[str, ...], str], list[str]]:
    """``OFFLOADD_*`` variables meant for the configuration, by key path, and a problem for
    each that names no key.

    A variable whose name starts with a section name (``OFFLOADD_OFFLOAD_...``) is taken as
    meant for the configuration and must name a real key: a typo such as one underscore
    instead of two would otherwise be ignored in silence. Other ``OFFLOADD_*`` names are not
    ours to judge and are left alone.
    """
    found: dict[tuple[str, ...], str] = {}
    problems: list[str] = []
    sections = list(Settings.model_fields)
    for name in os.environ:
        if not name.upper().startswith("OFFLOADD_"):
            continue
        rest = name[len("OFFLOADD_"):].lower()
        section = next((s for s in sections if rest == s or rest.startswith(s + "_")), None)
        if section is None:
            continue
        parts = tuple(rest.split("__"))
        tm = table_model(section)
        if parts == (section,):
            found[parts] = name
            continue
        if (len(parts) == 2 and parts[0] == section and tm is not None and not tm[1]
                and parts[1] in tm[0].model_fields):
            found[parts] = name
            continue
        hint = ""
        if tm is not None and not tm[1]:
            guess = difflib.get_close_matches(rest.removeprefix(section).strip("_"),
                                              list(tm[0].model_fields), n=1)
            if guess:
                hint = f"; did you mean OFFLOADD_{section.upper()}__{guess[0].upper()}?"
        problems.append(f"environment {name}: names no configuration key (the form is "
                        f"OFFLOADD_<SECTION>__<KEY>{hint})")
    return found, problems


_TYPE_WORDS = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
    "float_type": "a number", "float_parsing": "a number",
    "finite_number": "a finite number (not nan or inf)",
    "bool_type": "true or false", "bool_parsing": "true or false",
    "string_type": "a string", "path_type": "a string (a path)",
    "dict_type": "a table", "model_type": "a table", "model_attributes_type": "a table",
    "tuple_type": "an array", "list_type": "an array",
}
_BOUND_WORDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<",
                "less_than_equal": "<="}


def describe_all(err: Any, where: str, env: dict[tuple[str, ...], str]) -> list[str]:
    """One line per problem of a pydantic error: a check across keys may report several, one
    a line (see ``Settings._check_levels``)."""
    return describe(err, where, env).splitlines()


def describe(err: Any, where: str, env: dict[tuple[str, ...], str]) -> str:
    loc = tuple(str(p) for p in err["loc"])
    kind = err["type"]
    ctx = err.get("ctx") or {}
    secret = len(loc) >= 2 and (loc[0], loc[-1]) in secret_keys()
    # unknown keys may be misspelt secrets; URLs may carry user:password@
    show_input = not secret and kind != "extra_forbidden" and "@" not in str(err.get("input"))
    if kind == "extra_forbidden":
        msg = "unknown key" + _suggest(loc)
    elif kind == "literal_error":
        msg = f"must be {ctx.get('expected', 'one of the documented values')}"
    elif kind in _TYPE_WORDS:
        msg = f"must be {_TYPE_WORDS[kind]}"
    elif kind in _BOUND_WORDS:
        bound = next(iter(ctx.values()), "?")
        msg = f"must be {_BOUND_WORDS[kind]} {bound}"
    elif kind in ("string_too_short", "too_short"):
        msg = "must not be empty"
    elif kind == "missing":
        msg = "is required"
    else:
        msg = str(err["msg"]).removeprefix("Value error, ")
    value = err.get("input")
    if show_input and isinstance(value, str | int | float | bool) and len(repr(value)) <= 80:
        msg += f" (got {value!r})"
    source = where
    for n in range(len(loc), 0, -1):
        if loc[:n] in env:
            source = f"environment {env[loc[:n]]}"
            break
    # a whole-model check's message names its own keys; one may hold several problems, a line
    # each, and each line gets the prefix
    prefix = f"{source}: " if not loc else f"{source}: [{'.'.join(key_text(p) for p in loc)}] "
    return "\n".join(prefix + line for line in msg.splitlines())


def _suggest(loc: tuple[str, ...]) -> str:
    if len(loc) == 1:
        choices = list(Settings.model_fields)
    else:
        tm = table_model(loc[0])
        if tm is None:
            return ""
        choices = list(tm[0].model_fields) + list(aliases_of(tm[0]))
    guess = difflib.get_close_matches(loc[-1], choices, n=1)
    if guess:
        return f"; did you mean {guess[0]!r}?"
    return f"; allowed: {', '.join(c for c in choices if c.islower())} (docs/config.md)"


def describe_env_error(exc: SettingsError, env: dict[tuple[str, ...], str]) -> str:
    # pydantic-settings says 'error parsing value for field "X"': name the variable instead
    field = str(exc).partition('field "')[2].partition('"')[0]
    names = sorted(name for path, name in env.items() if path[0] == field)
    source = f"environment {names[0]}" if names else "environment"
    return (f"{source}: not valid JSON (arrays and tables come as JSON in the environment, "
            """e.g. '["a", "b"]')""")
