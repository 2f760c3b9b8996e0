"""Random ids for segments, objects and temp files (:func:`random_uuid`, :func:`random_hex`).

``uuid.uuid4()`` asks the kernel for 16 bytes each time (an ``os.urandom`` syscall): at
thousands of commits a second, each with a segment id, an upload temp file or two, that is a
syscall per id on the event loop. These ids only need to be unique, not secret, so they come
from one per-process generator seeded from ``os.urandom`` (128 bits of seed; Mersenne Twister
output is not predictable from outside without many observed outputs, and nothing here relies
on that). The format is unchanged: a version-4, RFC 4122 variant UUID.

A forked child would continue the parent's sequence and repeat its ids: it is reseeded at fork.
"""

from __future__ import annotations

import os
import random
import uuid

_VERSION_4 = 0x4 << 76
_VARIANT_RFC4122 = 0x2 << 62
_CLEAR = ~((0xF << 76) | (0x3 << 62))


def _seeded() -> random.Random:
    return random.Random(os.urandom(16))


_rng = _seeded()


def _reseed() -> None:
    global _rng
    _rng = _seeded()


os.register_at_fork(after_in_child=_reseed)


def random_int128() -> int:
    """A version-4 UUID's 128 bits (122 of them random)."""
    # getrandbits is one C call under the GIL: safe from any thread
    return (_rng.getrandbits(128) & _CLEAR) | _VERSION_4 | _VARIANT_RFC4122


def random_uuid() -> uuid.UUID:
    """What ``uuid.uuid4()`` gives, without a syscall."""
    return uuid.UUID(int=random_int128())


def random_hex() -> str:
    """``random_uuid().hex``: 32 lowercase hex digits."""
    return f"{random_int128():032x}"
