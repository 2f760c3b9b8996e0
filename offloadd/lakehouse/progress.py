"""Progress of ``offloadd lakehouse sync|maintain`` on a terminal: one line on stderr, rewritten
in place, only when stderr is a TTY (pipes, logs and JSON consumers see nothing of it)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    def __init__(self, what: str, total: int, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty()
        self.what, self.total = what, total
        self.started = time.monotonic()
        self.rows = 0

    def topic(self, index: int, name: str) -> None:
        """Now working on the ``index``-th topic (from 0)."""
        self._line(f"{self.what}: {index + 1}/{self.total} {name}")

    def add_rows(self, rows: int) -> None:
        self.rows += rows

    def _line(self, text: str) -> None:
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.started
        rows = f", {self.rows} rows" if self.rows else ""
        self.stream.write(f"\r\x1b[K{text} ({elapsed:.0f} s{rows})")
        self.stream.flush()

    def done(self) -> None:
        if self.enabled:
            self._line(f"{self.what}: {self.total} topic{'s' if self.total != 1 else ''} done")
            self.stream.write("\n")
            self.stream.flush()
