"""The lifecycle every long-lived component goes through; illegal moves are refused."""

from __future__ import annotations

import pytest

from offloadd.model.lifecycle import IllegalLifecycle, Lifecycle


class TestLifecycle:
    """NEW → RUNNING → STOPPING → STOPPED, and a stop before the start."""

    def test_the_usual_life_and_a_second_stop_request(self) -> None:
        s = Lifecycle.NEW.to(Lifecycle.RUNNING).to(Lifecycle.STOPPING)
        assert s.to(Lifecycle.STOPPING) is Lifecycle.STOPPING
        assert s.to(Lifecycle.STOPPED) is Lifecycle.STOPPED

    @pytest.mark.parametrize(("src", "dst"), [
        (Lifecycle.STOPPED, Lifecycle.RUNNING), (Lifecycle.STOPPING, Lifecycle.RUNNING),
        (Lifecycle.RUNNING, Lifecycle.NEW), (Lifecycle.STOPPED, Lifecycle.NEW)])
    def test_no_way_back(self, src: Lifecycle, dst: Lifecycle) -> None:
        with pytest.raises(IllegalLifecycle, match=f"from {src.value} to {dst.value}"):
            src.to(dst)
