"""Logging set-up: JSON lines for journald and containers, plain lines in a terminal.

``auto`` picks JSON when stderr is not a terminal (systemd sets ``JOURNAL_STREAM``; containers
capture stderr). Secrets never reach a log record: configuration values are ``SecretStr`` and
the drivers redact their own; :class:`RedactFilter` is the last line of defence for any known
secret string that still slips into a message.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterable


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
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
