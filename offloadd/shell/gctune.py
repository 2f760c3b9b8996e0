"""The cyclic garbage collector's settings while a daemon runs (issue 22, "Sidecar at scale").

A daemon starting thousands of topics allocates millions of long-lived objects (each topic's
task, offloader, recorder, the source's watches and ledger index) and few cycles. At CPython's
default thresholds ``(700, 10, 10)`` the collector ran a full collection over all of them again
and again during start-up: 18–42 s of a 5,000-topic start-up's wall time was collection. Raising
the thresholds makes young collections rarer (each still cheap) and full ones much rarer: that
is what took collection from ~30 s to ~6 s (docs/benchmarks.md, "Many topics"). Freezing what
exists once the daemon is set up (modules, configuration, the runtime; ``gc.freeze``: never
scanned again, and it is not garbage anyway) saves little beside it, as the topics' objects come
later, but costs nothing.

Only for the daemon's run (:meth:`offloadd.shell.daemon.Daemon.run`): short CLI commands end
before the collector matters. Entered and left in pairs; a process running several daemons at
once (tests) keeps the tuning until the last one leaves, then gets its settings back.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["THRESHOLDS", "tuned"]

# gen0 every 20,000 net allocations (~30x the default), gen1 every 20 of those, gen2 every 20
# gen1 collections (and then only when the survivors since the last one are a quarter of the
# old generation: CPython's own rule): measured with bench/sidecar_scale.py (docs/benchmarks.md)
THRESHOLDS = (20000, 20, 20)

_depth = 0
_saved: tuple[int, int, int] | None = None
_froze = False


@contextmanager
def tuned(*, freeze: bool = True) -> Iterator[None]:
    """Within: the daemon's collector thresholds, and (``freeze``) every object that exists on
    entry moved out of the collector's sight."""
    global _depth, _saved, _froze
    if _depth == 0:
        _saved = gc.get_threshold()
        gc.set_threshold(*THRESHOLDS)
        _froze = freeze
        if freeze:
            gc.freeze()
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0 and _saved is not None:
            gc.set_threshold(*_saved)
            _saved = None
            if _froze:
                gc.unfreeze()  # back into the oldest generation: collectable again
