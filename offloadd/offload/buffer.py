"""The offload buffer: a byte budget shared by every topic task of the process.

Bytes are reserved *before* they are read from the ledger source and released when the block
holding them has been uploaded. When the budget is spent, topic tasks simply stop reading the
tail; the entries stay in the source and are read later (PIP-76's fallback), so memory stays
bounded whatever the write rate. A single request larger than the cap is admitted when the
buffer is empty (an oversize entry must still make progress), and a read that returns more
than it reserved — only ever the one entry that alone exceeds the reservation — is accounted as
held (:meth:`grow`): the bound is the cap plus one entry.

Bytes of blocks waiting for a multipart part to fill are *parked* (:meth:`park`): still held
and counted, but nothing will free them until more is read — a part under S3's minimum cannot
be sent. When everything the buffer holds is parked, waiting for room could only deadlock
(quiet topics each holding part of a part), so a read is admitted past the cap then, one at a
time; the bound becomes the cap plus, per topic with a segment open, one part not yet full and
the read that started it (docs/design.md, "Blocks and parts").

The buffer also recycles the byte arrays reads land in (:meth:`lease` / :meth:`give_back`): a
fresh 16 MiB ``bytes`` per block costs thousands of page faults, a reused one none. A read far
shorter than its array (a quiet topic's tail) is copied out and the array given back at once
(``offload/runs.py``), so a part waiting to fill pins its bytes, not a block-sized array:
``leased`` counts the arrays out.
"""

from __future__ import annotations

import asyncio
import collections
import mmap
from collections.abc import Callable

from offloadd.ledger.base import ReadArray

# A free array serves a read of at least a 1/LEASE_SLACK of its length (the rest of a segment,
# of a ledger: reads of odd sizes): a new one would be zero-filled, page by page, for every such
# read (issue 22: 64 MiB arrays made per block cost more CPU than the rest of the path). A read
# that then uses under a quarter of its array is copied out of it (``runs.py`` SMALL_RUN).
LEASE_SLACK = 4
# New arrays this large are anonymous mappings, not bytearrays (see lease)
MMAP_FROM = 1024 * 1024


class OffloadBuffer:
    def __init__(self, cap_bytes: int, on_change: Callable[[int, int], None] | None = None) -> None:
        if cap_bytes <= 0:
            raise ValueError("buffer cap must be positive")
        self.cap = cap_bytes
        self.used = 0
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()
        self._on_change = on_change
        self.high_water = 0
        self.parked = 0  # held bytes waiting for a part to fill (see the module docstring)
        self._free: list[ReadArray] = []
        self._free_bytes = 0
        self.leased = 0  # bytes of the arrays out on lease (what reads pin, used or not)
        # +1 at every reservation and release: traffic that leaves the byte counts as they
        # were still moved the buffer (shell/memtrim.py tells quiet spells by it)
        self.moves = 0

    def _fits(self, n: int) -> bool:
        return self.used + n <= self.cap or self.used == self.parked

    async def reserve(self, n: int) -> None:
        """Wait (FIFO) until ``n`` bytes fit, then take them."""
        if not self._waiters and self._fits(n):
            self._take(n)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (n, fut)
        self._waiters.append(entry)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(n)  # granted just as we were cancelled: give it back
            else:
                self._waiters.remove(entry)
                self._wake()
            raise

    def lease(self, size: int) -> ReadArray:
        """A byte array of at least ``size`` bytes: the smallest free one up to
        :data:`LEASE_SLACK` times ``size``, else a new one."""
        best = -1
        for i, b in enumerate(self._free):
            if size <= len(b) <= LEASE_SLACK * size and (
                    best < 0 or len(b) < len(self._free[best])):
                best = i
        if best >= 0:
            b = self._free.pop(best)
            self._free_bytes -= len(b)
            self.leased += len(b)
            return b
        self.leased += size
        if size < MMAP_FROM:
            return bytearray(size)
        # bytearray(size) writes zeros over every page before a read fills it (user CPU, the
        # largest cost left of a 64 KiB-entry offload until the pool is warm); an anonymous
        # mapping's pages are zero until first written, by the kernel, as the read lands
        return mmap.mmap(-1, size)

    def give_back(self, b: ReadArray) -> None:
        """Return a leased array once nothing refers to its bytes any more."""
        self.leased -= len(b)
        if self._free_bytes + len(b) <= self.cap:
            self._free.append(b)
            self._free_bytes += len(b)

    @property
    def pooled(self) -> int:
        """Bytes of free arrays kept for the next reads."""
        return self._free_bytes

    def trim(self) -> int:
        """Drop the free arrays (bytes dropped): a daemon whose topics went quiet gives back
        what catching up pooled (up to the cap) instead of keeping it resident for ever."""
        dropped, self._free, self._free_bytes = self._free_bytes, [], 0
        return dropped

    def grow(self, n: int) -> None:
        """Account for ``n`` more bytes than were reserved (an oversize entry arrived)."""
        self._take(n)

    def park(self, n: int) -> None:
        """``n`` held bytes now wait for more reads (blocks of a part not yet full)."""
        self.parked += n
        self._wake()

    def unpark(self, n: int) -> None:
        """``n`` parked bytes are on their way out again (their part is full)."""
        self.parked -= n
        if self.parked < 0:
            raise AssertionError("offload buffer unparked more than parked")

    def release(self, n: int) -> None:
        self.used -= n
        if self.used < 0:
            raise AssertionError("offload buffer released more than reserved")
        self._notify()
        self._wake()

    def _take(self, n: int) -> None:
        self.used += n
        self.high_water = max(self.high_water, self.used)
        self._notify()

    def _wake(self) -> None:
        while self._waiters and self._fits(self._waiters[0][0]):
            n, fut = self._waiters.popleft()
            if fut.done():
                continue
            self._take(n)
            fut.set_result(None)

    def _notify(self) -> None:
        self.moves += 1
        if self._on_change is not None:
            self._on_change(self.used, self.cap)
