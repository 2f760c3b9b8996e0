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

import contextvars
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


class RedactFilter(logging.Filter):
    """Replaces known secret strings in a record's message and traceback with ``***``.

    A ``user:password`` secret (the ZooKeeper digest) is also redacted by its password alone.
    Strings shorter than 4 characters are not redacted: they would mangle ordinary words.
    """

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        found: set[str] = set()
        for s in secrets:
            found.add(s)
            if ":" in s:
                found.add(s.partition(":")[2])
        # longest first, so a secret that contains another is replaced whole
        self.secrets = sorted((s for s in found if len(s) >= 4), key=len, reverse=True)

    def _redact(self, text: str) -> str:
        for s in self.secrets:
            text = text.replace(s, "***")
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.secrets:
            return True
        msg = record.getMessage()
        if any(s in msg for s in self.secrets):
            record.msg, record.args = self._redact(msg), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self._redact(record.exc_text)
        return True


def configure(fmt: str = "auto", level: str = "INFO", secrets: Iterable[str] = ()) -> None:
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if use_json else logging.Formatter(
        "%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S"))
    handler.addFilter(RedactFilter(secrets))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("botocore", "aiobotocore", "kazoo", "aiohttp.access", "urllib3"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
