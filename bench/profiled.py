"""``offloadd`` under a profiler, switched on and off by SIGUSR2 (``bench/topic_scaling.py
--profile DIR`` runs the daemon through this).

The first SIGUSR2 starts a profile of the event loop's thread, the next one writes it and
stops; a profile still running when the process exits is written then (a stop). Two at once:

* ``<n>.prof`` — cProfile with the thread's own CPU time as its clock (wall time would count
  the waits for the GIL, held by the worker threads, against whatever Python code was running).
  cProfile slows what it measures (every Python call is counted), so its figures are shares of
  the daemon's work, not its speed; it is lost if the process is killed;
* ``<n>.samples.txt`` — the main thread's stack sampled every 10 ms from another thread
  (``sys._current_frames``), rewritten every 2 s: inclusive and own sample counts per function.
  Sampling costs the daemon little and survives a SIGKILL (a stop that outlives its bound).

``OFFLOADD_BENCH_CPROFILE=0`` leaves cProfile out. Files are numbered in the order the
profiles started (n = 0, 1, ...) under ``$OFFLOADD_BENCH_PROFILE``.

    python bench/profiled.py run --config offloadd.toml     (as ``offloadd run ...``)
"""

from __future__ import annotations

import atexit
import collections
import cProfile
import json
import os
import signal
import sys
import threading
import time
from types import FrameType

OUT = os.environ["OFFLOADD_BENCH_PROFILE"]
# OFFLOADD_BENCH_CPROFILE=0: the sampler alone (a stop measured at nearly its own speed)
CPROFILE = os.environ.get("OFFLOADD_BENCH_CPROFILE", "1") != "0"
# OFFLOADD_BENCH_HISTORY=1: every write of the samples also kept as <file>.<HHMMSS>.json
HISTORY = os.environ.get("OFFLOADD_BENCH_HISTORY", "0") == "1"
INTERVAL_S = 0.01
WRITE_EVERY_S = 2.0

_prof: cProfile.Profile | None = None
_sampler: Sampler | None = None
_started = 0


class Sampler(threading.Thread):
    """Samples the main thread's stack until stopped; writes the counts now and then."""

    def __init__(self, path: str) -> None:
        super().__init__(name="bench-sampler", daemon=True)
        self.path = path
        self.main = threading.main_thread().ident
        self.done = threading.Event()
        self.samples = 0
        self.inclusive: collections.Counter[str] = collections.Counter()
        self.own: collections.Counter[str] = collections.Counter()

    def run(self) -> None:
        last = time.monotonic()
        while not self.done.wait(INTERVAL_S):
            frame = sys._current_frames().get(self.main or 0)
            if frame is not None:
                self._take(frame)
            if time.monotonic() - last >= WRITE_EVERY_S:
                last = time.monotonic()
                self.write()
        self.write()

    def _take(self, frame: FrameType) -> None:
        self.samples += 1
        seen: set[str] = set()
        top = True
        f: FrameType | None = frame
        while f is not None:
            code = f.f_code
            name = f"{code.co_filename}:{code.co_firstlineno}({code.co_name})"
            if top:
                self.own[name] += 1
                top = False
            if name not in seen:
                seen.add(name)
                self.inclusive[name] += 1
            f = f.f_back

    def write(self) -> None:
        n = max(self.samples, 1)
        lines = [f"samples: {self.samples} (every {INTERVAL_S * 1000:.0f} ms, wall time; "
                 "the idle loop's samples are those whose own frame is the loop's run)", "",
                 "inclusive %  own %  function"]
        for name, count in self.inclusive.most_common(80):
            lines.append(f"{100 * count / n:10.1f}  {100 * self.own[name] / n:5.1f}  {name}")
        lines += ["", "own % (top 40)"]
        for name, count in self.own.most_common(40):
            lines.append(f"{100 * count / n:6.1f}  {name}")
        tmp = self.path + ".tmp"
        with open(tmp, "w") as fh:
            fh.write("\n".join(lines) + "\n")
        os.replace(tmp, self.path)
        if HISTORY:  # the counts so far, kept: a phase's share is the difference of two
            with open(f"{self.path}.{time.strftime('%H%M%S')}.json", "w") as fh:
                json.dump({"samples": self.samples, "inclusive": dict(self.inclusive),
                           "own": dict(self.own)}, fh)


def _dump() -> None:
    global _prof, _sampler
    if _prof is not None:
        _prof.disable()
        _prof.dump_stats(os.path.join(OUT, f"{_started - 1}.prof"))
        _prof = None
    if _sampler is not None:
        _sampler.done.set()
        _sampler.join(5)
        _sampler = None


def _toggle(signum: int, frame: FrameType | None) -> None:
    global _prof, _sampler, _started
    if _sampler is None:
        _sampler = Sampler(os.path.join(OUT, f"{_started}.samples.txt"))
        _sampler.start()
        if CPROFILE:
            _prof = cProfile.Profile(time.thread_time)
            _prof.enable()
        _started += 1
    else:
        _dump()


if __name__ == "__main__":
    signal.signal(signal.SIGUSR2, _toggle)
    atexit.register(_dump)
    from offloadd.shell.cli import main

    sys.argv = ["offloadd", *sys.argv[1:]]
    raise SystemExit(main())
