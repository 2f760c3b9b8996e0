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
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


class RedactFilter(logging.Filter):
    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self.secrets = [s for s in secrets if s and len(s) >= 4]

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            msg = record.getMessage()
            if any(s in msg for s in self.secrets):
                for s in self.secrets:
                    msg = msg.replace(s, "***")
                record.msg, record.args = msg, None
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
