"""A child process's CPU time and resident memory, read from /proc (Linux), for the benches that
measure a running daemon."""

from __future__ import annotations

__all__ = ["cpu_ticks", "main_thread_ticks", "rss_bytes"]


def cpu_ticks(pid: int) -> int:
    """utime + stime of ``pid`` in clock ticks (all its threads)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # fields 14 and 15 of proc(5), after "pid (comm)"


def main_thread_ticks(pid: int) -> int:
    """utime + stime of ``pid``'s main thread alone (a Python daemon's event loop; the rest of
    :func:`cpu_ticks` is its worker threads)."""
    return cpu_ticks_of(f"/proc/{pid}/task/{pid}/stat")


def cpu_ticks_of(stat_path: str) -> int:
    with open(stat_path) as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def rss_bytes(pid: int) -> int:
    """VmRSS of ``pid`` in bytes; 0 once the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except FileNotFoundError:
        pass
    return 0
