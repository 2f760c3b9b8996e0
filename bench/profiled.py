"""``offloadd`` under cProfile, switched on and off by SIGUSR2 (``bench/topic_scaling.py
--profile DIR`` runs the daemon through this).

The first SIGUSR2 starts a profile of the event loop's thread (its CPU time), the next one
writes it to ``$OFFLOADD_BENCH_PROFILE/<n>.prof`` (n = 0, 1, ...) and stops; a profile still
running when the process exits is written then (a stop). cProfile slows what it measures
(every Python call is counted), so the figures are shares of the daemon's work, not its speed.

    python bench/profiled.py run --config offloadd.toml     (as ``offloadd run ...``)
"""

from __future__ import annotations

import atexit
import cProfile
import os
import signal
import sys
import time
from types import FrameType

OUT = os.environ["OFFLOADD_BENCH_PROFILE"]
_prof: cProfile.Profile | None = None
_written = 0


def _dump() -> None:
    global _prof, _written
    if _prof is not None:
        _prof.disable()
        _prof.dump_stats(os.path.join(OUT, f"{_written}.prof"))
        _written += 1
        _prof = None


def _toggle(signum: int, frame: FrameType | None) -> None:
    global _prof
    if _prof is None:
        # the thread's own CPU time: wall time would count the waits for the GIL (16 worker
        # threads) against whatever Python code happened to be running
        _prof = cProfile.Profile(time.thread_time)
        _prof.enable()
    else:
        _dump()


if __name__ == "__main__":
    signal.signal(signal.SIGUSR2, _toggle)
    atexit.register(_dump)
    from offloadd.shell.cli import main

    sys.argv = ["offloadd", *sys.argv[1:]]
    raise SystemExit(main())
