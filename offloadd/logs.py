"""Logging set-up: JSON lines for journald and containers, plain lines in a terminal.

A JSON record carries ``topic``, ``segment`` and ``ledger`` as fields of their own (for
``jq 'select(.topic == ...)'`` or a log pipeline's index), taken, first found first, from: the
record's ``extra=`` values; the arguments the message names (``"topic %s: ledger %d gone"``
gives both; a ``TopicName`` or ``uuid.UUID`` argument is a topic or a segment wherever it
stands); the task's log context (:func:`context_with`: a topic's offload task binds its topic,
so every line it logs has it).

``auto`` picks JSON when stderr is not a terminal (systemd sets ``JOURNAL_STREAM``; containers
capture stderr). Secrets never reach a log record: configuration values are ``SecretStr`` and
the drivers redact their own; :class:`RedactFilter` is the last line of defence for any known
secret string that still slips into a message.
"""

from __future__ import annotations

import base64
import contextvars
import datetime
import json
import logging
import re
import sys
import time
import types
import uuid
from collections.abc import Iterable, Mapping

from offloadd.model import TopicName

FIELDS = ("topic", "segment", "ledger")

_context: contextvars.ContextVar[Mapping[str, str | int]] = contextvars.ContextVar(
    "offloadd_log_context", default=types.MappingProxyType({}))
# a %-style placeholder; group 1 is its conversion ("%" for a literal %%)
_PLACEHOLDER = re.compile(r"%(?:\([^)]*\))?[#0 +-]*(?:\*|\d+)?(?:\.(?:\*|\d+))?[hlL]?"
                          r"([diouxXeEfFgGcrsa%])")
_NAMED = re.compile(r"\b(topic|segment|ledger)\s*$")


def context_with(**fields: str | int) -> contextvars.Context:
    """A copy of the current context whose log records carry ``fields`` (for
    ``asyncio.create_task(..., context=...)``)."""
    ctx = contextvars.copy_context()
    ctx.run(_context.set, {**_context.get(), **fields})
    return ctx


def record_fields(record: logging.LogRecord) -> dict[str, str | int]:
    """``topic``/``segment``/``ledger`` of a record (see the module docstring)."""
    out: dict[str, str | int] = {}
    for name in FIELDS:
        value = record.__dict__.get(name)
        if isinstance(value, str | int):
            out[name] = value
        elif value is not None:
            out[name] = str(value)
    args = record.args
    if isinstance(args, tuple) and args and isinstance(record.msg, str):
        i = 0
        for m in _PLACEHOLDER.finditer(record.msg):
            if m.group(1) == "%":
                continue
            if i >= len(args):
                break
            arg = args[i]
            i += 1
            named = _NAMED.search(record.msg, 0, m.start())
            field: str | None = named.group(1) if named else (
                "topic" if isinstance(arg, TopicName) else
                "segment" if isinstance(arg, uuid.UUID) else None)
            if field is not None and field not in out:
                out[field] = arg if isinstance(arg, int) and not isinstance(arg, bool) \
                    else str(arg)
    for key, value in _context.get().items():
        out.setdefault(key, value)
    return out


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update(record_fields(record))
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            out["exc"] = record.exc_text
        return json.dumps(out, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """Plain lines whose time is a full ISO-8601 timestamp in local time with its UTC offset
    (``2026-11-27T21:30:59.123+01:00``): a line copied out of a terminal or a file must say
    which day it was, and a time without its offset is ambiguous across hosts."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        t = datetime.datetime.fromtimestamp(record.created).astimezone()
        return t.isoformat(timespec="milliseconds")


def _char_forms(c: str) -> list[str]:
    """Regular expressions for every way ``c`` shows up once a string holding it has been
    repr()'d, ascii()'d, JSON-encoded, URL-encoded or turned into bytes and repr()'d — or any
    of those applied on top of another (a JSON log line of a repr, a repr of a URL)."""
    esc = r"\\+"  # one or more backslashes: escapes, and escapes of escapes
    forms = [re.escape(c)]
    if c in "\\'\"":
        forms.append(esc + re.escape(c))  # \' \" and \\ (a backslash doubled, or more)
    if c == "\\":
        forms.append(esc + "x5[cC]")
    code = ord(c)
    named = {"\n": "n", "\t": "t", "\r": "r", "\b": "b", "\f": "f"}.get(c)
    if named:
        forms.append(esc + named)
    hexes = [f"{b:02x}" for b in c.encode("utf-8", "surrogatepass")]
    forms.append("".join(f"%{_anycase(h)}" for h in hexes))  # URL encoding, %2f or %2F
    forms.append("".join(f"{esc}x{_anycase(h)}" for h in hexes))  # bytes repr of UTF-8
    if code < 0x100:
        forms.append(f"{esc}x{_anycase(f'{code:02x}')}")  # ascii(), repr() of control chars
    if code < 0x10000:
        forms.append(f"{esc}u{_anycase(f'{code:04x}')}")  # ascii(), JSON
    else:
        forms.append(f"{esc}U{_anycase(f'{code:08x}')}")  # ascii()
        hi, lo = 0xD800 + ((code - 0x10000) >> 10), 0xDC00 + ((code - 0x10000) & 0x3FF)
        forms.append(f"{esc}u{_anycase(f'{hi:04x}')}{esc}u{_anycase(f'{lo:04x}')}")  # JSON
    if c == " ":
        forms.append(r"\+")  # application/x-www-form-urlencoded
    return forms


def _anycase(hexdigits: str) -> str:
    return "".join(f"[{d.lower()}{d.upper()}]" if d.isalpha() else d for d in hexdigits)


def secret_pattern(secrets: Iterable[str]) -> re.Pattern[str] | None:
    """One regular expression matching every representation of every secret (see
    :func:`_char_forms`), and the base64 of each; None when there is nothing to hide.

    A ``user:password`` secret (a ZooKeeper digest) also matches by its password alone.
    Secrets shorter than 4 characters are skipped: they would mangle ordinary words.
    """
    found: set[str] = set()
    for s in secrets:
        found.add(s)
        if ":" in s:
            found.add(s.partition(":")[2])
    alternatives: list[str] = []
    for s in sorted((s for s in found if len(s) >= 4), key=len, reverse=True):
        alternatives.append("".join(f"(?:{'|'.join(_char_forms(c))})" for c in s))
        raw = s.encode("utf-8", "surrogatepass")
        alternatives += [re.escape(base64.b64encode(raw).decode().rstrip("=")),
                         re.escape(base64.urlsafe_b64encode(raw).decode().rstrip("="))]
    if not alternatives:
        return None
    return re.compile("|".join(alternatives))


class _RewriteFilter(logging.Filter):
    """Rewrites a record's message, traceback and stack with :meth:`_redact`."""

    def _redact(self, text: str) -> str:
        raise NotImplementedError

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # a malformed record: let logging report it as usual
            return True
        redacted = self._redact(msg)
        if redacted != msg:
            record.msg, record.args = redacted, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self._redact(record.exc_text)
        if record.stack_info:
            record.stack_info = self._redact(record.stack_info)
        return True


# kazoo's connection logs its ZooKeeper session's id and password at DEBUG and below (the
# Connect request's repr on every reconnect, "session_id: ... session_passwd: ..."): the two
# together let whoever reads the log resume the session, and so close it or act as its owner.
_SESSION_CREDENTIALS = re.compile(
    r"(?P<key>(?:session_id|passwd)(?:'|\\?\")?\s*[=:]\s*)"
    r"(?:b?'(?:[^'\\]|\\.)*'|b?\"(?:[^\"\\]|\\.)*\"|0x[0-9a-fA-F]+|-?[0-9a-fA-F]+)")


class SessionRedactFilter(_RewriteFilter):
    """Replaces a ZooKeeper session's id and password in kazoo's records with ``***``."""

    def _redact(self, text: str) -> str:
        if "session_id" not in text and "passwd" not in text:
            return text
        return _SESSION_CREDENTIALS.sub(lambda m: m.group("key") + "***", text)


class RedactFilter(_RewriteFilter):
    """Replaces known secrets in a record's message and traceback with ``***``, in whatever
    form they appear (literal, repr/ascii-escaped, JSON-escaped, URL-encoded, bytes repr,
    base64: see :func:`secret_pattern`). Without that, a password holding ``\\`` or ``'``
    would slip through as soon as a library logs the repr of an object that holds it (kazoo's
    ``Auth(...)`` request at DEBUG does).
    """

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self.pattern = secret_pattern(secrets)

    def _redact(self, text: str) -> str:
        return self.pattern.sub("***", text) if self.pattern is not None else text

    def filter(self, record: logging.LogRecord) -> bool:
        return True if self.pattern is None else super().filter(record)


# The client libraries' own loggers: chatty at INFO and DEBUG (kazoo logs every request, and a
# line per connect and close), so they stay at WARNING whatever the level unless
# $OFFLOADD_LIBRARY_LOG_LEVEL asks for more. kazoo logs through one logger per client, a child
# of the "...zookeeper.kazoo" one (offloadd.metadata.zookeeper.acl.kazoo_logger).
LIBRARY_LOGGERS = ("botocore", "aiobotocore", "kazoo", "offloadd.metadata.zookeeper.kazoo",
                   "aiohttp.access", "urllib3")
LIBRARY_LEVEL_ENV = "OFFLOADD_LIBRARY_LOG_LEVEL"


def library_level(root_level: int, environ: Mapping[str, str] | None = None) -> int:
    """The client libraries' level: WARNING (or the root's, when higher), or what
    ``$OFFLOADD_LIBRARY_LOG_LEVEL`` names (DEBUG, INFO, WARNING, ERROR; anything else is
    ignored)."""
    import os

    asked = (environ if environ is not None else os.environ).get(LIBRARY_LEVEL_ENV, "")
    level = logging.getLevelName(asked.strip().upper()) if asked.strip() else None
    if isinstance(level, int):
        return level
    return max(logging.WARNING, root_level)


def configure(fmt: str = "auto", level: str = "INFO", secrets: Iterable[str] = (),
              quiet: Iterable[str] = ()) -> None:
    """Log to stderr at ``level``. ``quiet``: loggers kept at WARNING unless ``level`` is DEBUG
    (a one-shot command's connection chatter, which would bury its answer)."""
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if use_json else TextFormatter(
        "%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    handler.addFilter(RedactFilter(secrets))
    handler.addFilter(SessionRedactFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in LIBRARY_LOGGERS:
        logging.getLogger(noisy).setLevel(library_level(root.level))
    for name in quiet:
        logging.getLogger(name).setLevel(
            logging.NOTSET if root.level <= logging.DEBUG else max(logging.WARNING, root.level))
