"""Who owns the embedded store's ephemeral nodes: a store instance (a session) in a process.

Without a server, "the session ends when its process dies" is made true by looking: a node
whose owning process is gone (or is a zombie, or whose pid now belongs to a process started at
another time) belongs to an ended session, and any store deletes it (:func:`alive`).
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass


@dataclass(frozen=True)
class Owner:
    session: str  # one per store instance
    pid: int
    start: int  # the process's start time in clock ticks (/proc), against pid reuse; 0: unknown

    @classmethod
    def this_process(cls) -> Owner:
        """A new session of this process."""
        pid = os.getpid()
        stat = _proc_stat(pid)
        return cls(uuid.uuid4().hex, pid, stat[1] if stat else 0)


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks) of a process from /proc, or None where unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("ascii", "replace")
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses; fields resume after the
    # last ")". State is field 3, starttime field 22.
    fields = raw[raw.rfind(")") + 2:].split()
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


def alive(pid: int, start: int | None) -> bool:
    """Is the process that started at ``start`` (0/None: unknown) still running as ``pid``?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by another user
    stat = _proc_stat(pid)
    if stat is None:
        return True
    state, started = stat
    # A killed child that its parent has not reaped yet is a zombie: its session is over. A
    # different start time means the pid was reused by an unrelated process.
    return state != "Z" and (not start or started == start)
