"""DirSyncs: a caller returns only after a directory fsync that started after its call."""

import itertools
import threading
import time
from pathlib import Path

import pytest

from offloadd.blobstore.filesystem.tree import DirSyncs


class _Clock:
    """A global order of events: calls, fsync starts and ends."""

    def __init__(self) -> None:
        self._n = itertools.count()
        self._lock = threading.Lock()

    def tick(self) -> int:
        with self._lock:
            return next(self._n)


class _FakeFsync:
    def __init__(self, clock: _Clock, seconds: float = 0.002) -> None:
        self.clock = clock
        self.seconds = seconds
        self.runs: list[tuple[Path, int, int]] = []  # (directory, started, finished)
        self.fail_next = 0
        self._lock = threading.Lock()
        self.concurrent = 0
        self.max_concurrent: dict[Path, int] = {}
        self._running: dict[Path, int] = {}

    def __call__(self, path: Path) -> None:
        with self._lock:
            self._running[path] = self._running.get(path, 0) + 1
            self.max_concurrent[path] = max(self.max_concurrent.get(path, 0),
                                            self._running[path])
            fail = self.fail_next > 0
            if fail:
                self.fail_next -= 1
        started = self.clock.tick()
        time.sleep(self.seconds)
        try:
            if fail:
                raise OSError(5, "Input/output error")
        finally:
            finished = self.clock.tick()
            with self._lock:
                self._running[path] -= 1
                if not fail:
                    self.runs.append((path, started, finished))


@pytest.mark.timeout(60)
def test_every_caller_waits_for_a_fsync_that_started_after_it() -> None:
    clock = _Clock()
    fsync = _FakeFsync(clock)
    syncs = DirSyncs(fsync)
    dirs = [Path("/a"), Path("/b")]
    problems: list[str] = []

    def caller(i: int) -> None:
        for j in range(20):
            d = dirs[(i + j) % 2]
            called = clock.tick()
            syncs.sync(d)
            returned = clock.tick()
            with fsync._lock:
                covering = [r for r in fsync.runs
                            if r[0] == d and r[1] > called and r[2] < returned]
            if not covering:
                problems.append(f"caller {i} call {j}: no fsync of {d} started after it")

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert problems == []
    # shared: fewer fsyncs than calls, never two at once on one directory
    assert len(fsync.runs) < 16 * 20
    assert max(fsync.max_concurrent.values()) == 1


@pytest.mark.timeout(30)
def test_a_lone_caller_runs_exactly_one_fsync() -> None:
    fsync = _FakeFsync(_Clock(), seconds=0)
    syncs = DirSyncs(fsync)
    for _ in range(3):
        syncs.sync(Path("/a"))
    assert len(fsync.runs) == 3


@pytest.mark.timeout(30)
def test_a_failed_fsync_fails_its_callers_and_the_next_one_succeeds() -> None:
    fsync = _FakeFsync(_Clock(), seconds=0)
    fsync.fail_next = 1
    syncs = DirSyncs(fsync)
    with pytest.raises(OSError, match="Input/output"):
        syncs.sync(Path("/a"))
    syncs.sync(Path("/a"))
    assert len(fsync.runs) == 1


@pytest.mark.timeout(30)
def test_waiters_on_a_failed_generation_are_failed_too() -> None:
    fsync = _FakeFsync(_Clock(), seconds=0)
    gate = threading.Event()
    started = threading.Event()
    calls = 0

    def gated(path: Path) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:  # the first fsync holds until the later callers all wait
            started.set()
            gate.wait()
        elif calls == 2:  # the generation the later callers wait for fails
            fsync.fail_next = 1
        fsync(path)

    syncs = DirSyncs(gated)
    errors: list[BaseException] = []

    def later() -> None:
        try:
            syncs.sync(Path("/a"))
        except OSError as e:
            errors.append(e)

    t1 = threading.Thread(target=syncs.sync, args=(Path("/a"),))
    t1.start()
    started.wait()
    later_threads = [threading.Thread(target=later) for _ in range(4)]
    for t in later_threads:
        t.start()
    while True:  # every later caller is waiting (the state's count includes the first)
        with syncs._cond:
            if syncs._dirs[Path("/a")].waiters == 5:
                break
        time.sleep(0.001)
    gate.set()
    for t in [t1, *later_threads]:
        t.join()
    # the first generation succeeded; the one the later callers shared failed: all four saw it
    assert len(errors) == 4
    assert len(fsync.runs) == 1
