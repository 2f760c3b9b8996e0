"""The embedded store's writer and offloader locks: which processes may share one store.

``flock`` locks belong to open file descriptions, so two ``acquire`` calls in one process
conflict exactly as two processes do; the process-death case uses a real child process.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from offloadd.errors import Fatal
from offloadd.ledger.local import StoreLock


class TestWhoMayShareAStore:
    """One writer; one standalone, or any number of `run` daemons; readers need nothing."""

    def test_a_second_writer_is_refused_with_the_holder_named(self, tmp_path: Path) -> None:
        with StoreLock.acquire(tmp_path, StoreLock.WRITER, holder="offloadd standalone"), \
                pytest.raises(Fatal, match=r"the embedded store .* is in use: offloadd "
                              r"standalone \(pid \d+\) holds its writer lock .*writer\.lock"):
            StoreLock.acquire(tmp_path, StoreLock.WRITER, holder="offloadd produce")
        # released: the next writer gets it
        StoreLock.acquire(tmp_path, StoreLock.WRITER).release()

    def test_run_daemons_share_the_offloader_lock_and_keep_a_standalone_out(
            self, tmp_path: Path) -> None:
        one = StoreLock.acquire(tmp_path, StoreLock.OFFLOADER, shared=True)
        two = StoreLock.acquire(tmp_path, StoreLock.OFFLOADER, shared=True)
        with pytest.raises(Fatal, match=r"holds its offloader lock"):
            StoreLock.acquire(tmp_path, StoreLock.OFFLOADER, holder="offloadd standalone")
        one.release()
        with pytest.raises(Fatal, match=r"holds its offloader lock"):
            StoreLock.acquire(tmp_path, StoreLock.OFFLOADER)
        two.release()
        StoreLock.acquire(tmp_path, StoreLock.OFFLOADER).release()

    def test_a_standalone_keeps_run_daemons_out(self, tmp_path: Path) -> None:
        with StoreLock.acquire(tmp_path, StoreLock.OFFLOADER, holder="offloadd standalone"), \
                pytest.raises(Fatal, match=r"offloadd standalone \(pid \d+\)"):
            StoreLock.acquire(tmp_path, StoreLock.OFFLOADER, shared=True)

    def test_a_writer_and_a_run_daemon_are_independent(self, tmp_path: Path) -> None:
        """`offloadd run` tailing a store `offloadd produce` writes (the sidecar-like set-up)."""
        with StoreLock.acquire(tmp_path, StoreLock.WRITER, holder="offloadd produce"), \
                StoreLock.acquire(tmp_path, StoreLock.OFFLOADER, shared=True):
            pass

    def test_release_is_idempotent_and_leaves_the_file(self, tmp_path: Path) -> None:
        lock = StoreLock.acquire(tmp_path / "new" / "dir", StoreLock.WRITER)
        lock.release()
        lock.release()
        assert (tmp_path / "new" / "dir" / "writer.lock").exists()


@pytest.mark.timeout(60)
def test_a_killed_holder_leaves_the_store_unlocked(tmp_path: Path) -> None:
    code = ("import sys, time\n"
            "from offloadd.ledger.local import StoreLock\n"
            f"StoreLock.acquire({str(tmp_path)!r}, StoreLock.WRITER, holder='doomed')\n"
            "print('locked', flush=True)\n"
            "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        with pytest.raises(Fatal, match=rf"doomed \(pid {proc.pid}\)"):
            StoreLock.acquire(tmp_path, StoreLock.WRITER)
    finally:
        proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
    deadline = time.monotonic() + 10
    while True:  # the kernel drops the lock with the process's last descriptor
        try:
            StoreLock.acquire(tmp_path, StoreLock.WRITER).release()
            break
        except Fatal:
            assert time.monotonic() < deadline
            time.sleep(0.05)
