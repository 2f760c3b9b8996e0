"""The daemon's collector settings (``shell/gctune.py``): on while a daemon runs, the process's
own back once the last daemon of the process has stopped (tests run several in one process)."""

from __future__ import annotations

import gc

import pytest

from offloadd.shell import gctune


def test_thresholds_are_the_daemons_while_any_runs_and_restored_after() -> None:
    before = gc.get_threshold()
    assert before != gctune.THRESHOLDS
    with gctune.tuned():
        assert gc.get_threshold() == gctune.THRESHOLDS
        assert gc.get_freeze_count() > 0  # what existed on entry is out of the collector's way
        with gctune.tuned():  # a second daemon in the same process
            assert gc.get_threshold() == gctune.THRESHOLDS
        assert gc.get_threshold() == gctune.THRESHOLDS  # the first still runs
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_a_daemon_that_fails_still_gives_the_settings_back() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), gctune.tuned():
        raise RuntimeError("the run failed")
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
