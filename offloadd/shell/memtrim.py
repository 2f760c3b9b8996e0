"""Giving memory back once the daemon's topics go quiet (issue 22, "memory follows data").

Catching up on history fills the offload buffer's pool of free read arrays (up to its cap,
``offload/buffer.py``) and the C allocator's free lists; an idle daemon kept both resident for
ever: 642 MiB at 10,000 idle topics whose segments were all committed. :class:`MemoryTrim` is
asked every discovery pass; once the buffer has not moved (nothing reserved, leased or given
back) for ``quiet_s``, it drops the pooled arrays and asks glibc to return free heap pages
(``malloc_trim``, in a worker thread: it walks the heap). Traffic refills the pool as before.

It trims once after every quiet spell, pooled arrays or not: what catching up left in the C
allocator's free lists (entries copied out of short reads, segments' objects, commit records)
is not in the pool, and only ``malloc_trim`` gives it back.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import time
from collections.abc import Callable

from offloadd.offload.buffer import OffloadBuffer

__all__ = ["MemoryTrim", "malloc_trim"]

log = logging.getLogger(__name__)

QUIET_S = 10.0  # how long the buffer must not have moved


def malloc_trim() -> bool:
    """glibc's ``malloc_trim(0)``: free heap pages back to the system (False elsewhere)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        return bool(libc.malloc_trim(0))
    except (OSError, AttributeError, TypeError):  # not glibc (musl, macOS): nothing to do
        return False


class MemoryTrim:
    """When to trim: once per quiet spell, the buffer unmoved for ``quiet_s``."""

    __slots__ = ("_buffer", "_clock", "_mark", "_quiet_s", "_since", "_trimmed")

    def __init__(self, buffer: OffloadBuffer, *, quiet_s: float = QUIET_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._buffer = buffer
        self._quiet_s = quiet_s
        self._clock = clock
        self._mark: tuple[int, int, int, int] | None = None
        self._since = clock()
        self._trimmed = False  # this quiet spell has had its trim

    def due(self) -> bool:
        """True (and the pool dropped) when the caller should trim the heap now."""
        b = self._buffer
        mark = (b.moves, b.used, b.leased, b.pooled)
        now = self._clock()
        if mark != self._mark:
            self._mark, self._since, self._trimmed = mark, now, False
            return False
        if self._trimmed or now - self._since < self._quiet_s:
            return False
        self._trimmed = True
        dropped = b.trim()
        self._mark = (b.moves, b.used, b.leased, b.pooled)
        log.debug("offload buffer quiet for %.0fs: %d pooled bytes dropped", self._quiet_s,
                  dropped)
        return True
