"""A one-line progress display on a terminal, for commands that may run long (verify, gc).

Nothing is shown unless the stream is a terminal (logs, pipes and CI output stay clean) and the
command has run for ``delay_s`` (2 s): a quick run prints nothing extra. The line is redrawn in
place at most every ``min_interval_s`` and erased when the command ends, so what the command
prints on stdout afterwards is unchanged::

    with StatusLine(sys.stderr, prefix="verify") as line:
        await verify(..., on_progress=line.show)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType
from typing import IO

__all__ = ["StatusLine"]


class StatusLine:
    def __init__(self, stream: IO[str], *, prefix: str = "", delay_s: float = 2.0,
                 min_interval_s: float = 0.2, tty: bool | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream
        self.prefix = prefix
        self.tty = _isatty(stream) if tty is None else tty
        self._delay = delay_s
        self._interval = min_interval_s
        self._clock = clock
        self._t0 = clock()
        self._last = float("-inf")
        self._shown = False

    def show(self, text: str) -> None:
        """The current step, e.g. ``"persistent://t/ns/x: segment 12/40"``."""
        if not self.tty:
            return
        now = self._clock()
        if now - self._t0 < self._delay or now - self._last < self._interval:
            return
        self._last = now
        elapsed = int(now - self._t0)
        line = f"{self.prefix}: {text}" if self.prefix else text
        self.stream.write(f"\r\x1b[2K{line}  ({elapsed // 60}:{elapsed % 60:02d})")
        self.stream.flush()
        self._shown = True

    def close(self) -> None:
        if self._shown:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()
            self._shown = False

    def __enter__(self) -> StatusLine:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
