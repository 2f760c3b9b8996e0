"""The store's change journal: which topics a writer touched, for readers in other processes.

A reader in another process cannot share the writer's :class:`LedgerNotifier`, and watching
every topic's files (a ``stat`` of its ``.off`` and a metadata read, per topic, 50 times a
second) made an idle daemon with 1,000 topics use 60 % of a core. Instead the writer keeps one
small file, ``<store>/changes``, and the readers of a process look at it with one ``pread``::

    bytes 0..8       uint64 LE   how many records were ever written (the sequence)
    bytes 8..        SLOTS x uint64 LE: record k's topic key at slot k % SLOTS

After every batch it appends, every ledger it opens or closes and every topic it lets go, the
writer (one per store: the writer lock) writes the topic's key into the next slot, *then* the
new sequence; a topic it creates is also recorded as key 0 (``TOPICS_KEY``: the list of topics
changed). A reader remembers the sequence it last saw; when it moved by at most ``SLOTS``
it reads the keys in between, otherwise (it fell behind, or the file was recreated) it reports
that anything may have changed. Keys are 64-bit hashes of the managed-ledger name: a
collision only wakes a topic for nothing. The file is never truncated; a new writer continues
its sequence. Both sides are in the page cache of one machine, so the order of the two
``pwrite`` s is the order a reader sees them in.
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from offloadd.model import TopicName

__all__ = ["ANY", "JOURNAL_NAME", "SLOTS", "TOPICS_KEY", "JournalReader", "JournalWriter",
           "topic_key"]

JOURNAL_NAME = "changes"
TOPICS_KEY = 0  # recorded when a writer creates a topic: the list of topics changed
SLOTS = 4096
_U64 = struct.Struct("<Q")
_HEADER = _U64.size


def topic_key(topic: TopicName) -> int:
    """The topic's 64-bit key in the journal (never 0)."""
    digest = hashlib.blake2b(topic.managed_ledger.encode(), digest_size=8).digest()
    return _U64.unpack(digest)[0] or 1


@dataclass(frozen=True)
class _Any:
    """Anything may have changed: the reader fell behind, or the journal was replaced."""


ANY = _Any()


class JournalWriter:
    """The writer's side; blocking but tiny (two ``pwrite`` s of 8 bytes per record)."""

    def __init__(self, store: Path) -> None:
        self.path = store / JOURNAL_NAME
        self._fd: int | None = None
        self._seq = 0

    def record(self, topic: TopicName | None) -> None:
        """A change of ``topic``; None: a new topic (``TOPICS_KEY``)."""
        key = topic_key(topic) if topic is not None else TOPICS_KEY
        fd = self._open()
        os.pwrite(fd, _U64.pack(key), _HEADER + _U64.size * (self._seq % SLOTS))
        self._seq += 1
        os.pwrite(fd, _U64.pack(self._seq), 0)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _open(self) -> int:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            head = os.pread(fd, _HEADER, 0)
            self._seq = _U64.unpack(head)[0] if len(head) == _HEADER else 0
            self._fd = fd
        return self._fd


class JournalReader:
    """A reader's side: :meth:`changes` since the last call (blocking, a ``pread`` or three)."""

    def __init__(self, store: Path) -> None:
        self.path = store / JOURNAL_NAME
        self._fd: int | None = None
        self._ino = 0
        self._seq: int | None = None  # None: not read yet

    def changes(self) -> set[int] | _Any:
        """Keys of the topics touched since the last call; ``ANY`` when that is unknown (the
        first call, a reader fallen behind by more than ``SLOTS`` records, a new file).
        An empty set while the journal does not exist yet (no writer has run since)."""
        fd = self._open()
        if fd is None:
            return set()
        seq = self._sequence(fd)
        last, self._seq = self._seq, seq
        if last is None or seq < last or seq - last > SLOTS:
            return ANY
        if seq == last:
            return set()
        raw = os.pread(fd, _U64.size * SLOTS, _HEADER)
        if self._sequence(fd) - last > SLOTS:  # lapped while we read: slots were overwritten
            return ANY
        keys = set()
        for k in range(last, seq):
            at = _U64.size * (k % SLOTS)
            if at + _U64.size <= len(raw):
                keys.add(_U64.unpack_from(raw, at)[0])
        return keys

    def replaced(self) -> bool:
        """Was the file replaced (or created) since it was opened? Then the next
        :meth:`changes` reads the new one (and says ``ANY``)."""
        try:
            ino = os.stat(self.path).st_ino
        except FileNotFoundError:
            return False
        if ino == self._ino:
            return False
        self.close()
        return True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._seq = None

    def _open(self) -> int | None:
        if self._fd is None:
            try:
                fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                return None
            self._fd, self._ino = fd, os.fstat(fd).st_ino
        return self._fd

    @staticmethod
    def _sequence(fd: int) -> int:
        head = os.pread(fd, _HEADER, 0)
        return _U64.unpack(head)[0] if len(head) == _HEADER else 0
