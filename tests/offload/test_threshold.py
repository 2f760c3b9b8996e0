"""Offload thresholds (pure): what may be offloaded now, from ledger boundaries and observed tails,
on a fake wall clock; and Pulsar's names for them in the configuration.

    ledger 1 (closed, 3×100 B)  ledger 2 (closed, 3×100 B)  ledger 3 (open, 2×100 B so far)
    1:0 1:1 1:2                 2:0 2:1 2:2                 3:0 3:1
            created t=0                 created t=10 s              created t=20 s
"""

from __future__ import annotations

from pathlib import Path

import pytest

from offloadd import config
from offloadd.model import LedgerDesc, LedgerState, Position
from offloadd.offload.threshold import (
    MARK_SPACING_MS,
    Mark,
    TailLog,
    Thresholds,
    eligible_end,
    ledger_marks,
    tail_mark,
)

S = 1000  # ms


def topic(open_entries: int = 2) -> list[LedgerDesc]:
    return [LedgerDesc(1, LedgerState.CLOSED, 2, 300, 0),
            LedgerDesc(2, LedgerState.CLOSED, 2, 300, 10 * S),
            LedgerDesc(3, LedgerState.OPEN, open_entries - 1, 100 * open_entries, 20 * S)]


def visible_end(ledgers: list[LedgerDesc]) -> Position | None:
    last = [d for d in ledgers if d.last_entry_id >= 0]
    return Position(last[-1].ledger_id, last[-1].last_entry_id) if last else None


class TestThresholds:
    def test_negative_means_unset_like_pulsar(self) -> None:
        assert Thresholds.from_config(-1, -1) == Thresholds(None, None)
        assert not Thresholds.from_config(-1, -1).active
        assert Thresholds.from_config(0, -1).bytes == 0
        assert Thresholds.from_config(1024, 3.5) == Thresholds(1024, 3.5)


class TestEligibleEnd:
    """The last position that may be offloaded, from marks alone."""

    def test_ledger_boundaries_are_exact_marks(self) -> None:
        assert ledger_marks(topic()) == [Mark(Position(1, 2), 300, 10 * S),
                                         Mark(Position(2, 2), 600, 20 * S)]
        assert tail_mark(topic(), 25 * S) == Mark(Position(3, 1), 800, 25 * S)

    def test_no_threshold_offloads_everything(self) -> None:
        tail = tail_mark(topic(), 25 * S)
        assert eligible_end(Thresholds(), ledger_marks(topic()), tail, 25 * S) == Position(3, 1)

    @pytest.mark.parametrize(("nbytes", "end"), [(0, Position(3, 1)), (200, Position(2, 2)),
                                                 (201, Position(1, 2)), (500, Position(1, 2)),
                                                 (501, None)])
    def test_bytes_keep_the_newest_bytes_in_the_source(self, nbytes: int,
                                                       end: Position | None) -> None:
        tail = tail_mark(topic(), 25 * S)
        assert eligible_end(Thresholds(bytes=nbytes), ledger_marks(topic()), tail,
                            25 * S) == end

    @pytest.mark.parametrize(("now_s", "end"), [(10, None), (14.999, None), (15, Position(1, 2)),
                                                (24.9, Position(1, 2)), (25, Position(2, 2))])
    def test_seconds_offload_what_is_old_enough(self, now_s: float,
                                                end: Position | None) -> None:
        tail = tail_mark(topic(), int(now_s * S))
        assert eligible_end(Thresholds(seconds=5), ledger_marks(topic()), tail,
                            int(now_s * S)) == end

    def test_either_threshold_suffices(self) -> None:
        tail = tail_mark(topic(), 16 * S)
        # by bytes 1:2 only; by age (16 s - 5 s) also 1:2; 500 s: nothing by age, 2:2 by bytes
        both = Thresholds(bytes=200, seconds=500)
        assert eligible_end(both, ledger_marks(topic()), tail, 16 * S) == Position(2, 2)
        both = Thresholds(bytes=10_000, seconds=5)
        assert eligible_end(both, ledger_marks(topic()), tail, 16 * S) == Position(1, 2)


class TestTailLog:
    """Observed tails mark when entries of the open ledger became readable."""

    def test_the_open_ledger_is_offloaded_once_old_enough(self) -> None:
        log = TailLog()
        th = Thresholds(seconds=5)
        # t=21 s: the open ledger has two entries; only ledger 1 is old enough
        assert visible_end(log.clip(th, topic(2), 21 * S)) == Position(1, 2)
        # t=23 s: a third entry arrived
        assert visible_end(log.clip(th, topic(3), 23 * S)) == Position(1, 2)
        assert visible_end(log.clip(th, topic(3), 25 * S)) == Position(2, 2)
        # 3:0..3:1 were seen at 21 s: readable from 26 s; 3:2 (seen at 23 s) from 28 s
        assert visible_end(log.clip(th, topic(3), 26 * S)) == Position(3, 1)
        assert visible_end(log.clip(th, topic(3), 27 * S)) == Position(3, 1)
        assert visible_end(log.clip(th, topic(3), 28 * S)) == Position(3, 2)

    def test_an_entry_is_never_offloaded_early(self) -> None:
        """Between two marks an entry is judged by the later one: late, never early."""
        log = TailLog()
        th = Thresholds(seconds=5)
        log.clip(th, topic(1), 21 * S)
        # the second entry arrives 0.5 s later: within a mark's spacing, not marked
        log.clip(th, topic(2), 21 * S + MARK_SPACING_MS // 2)
        log.clip(th, topic(2), 23 * S)  # marked now, later than it arrived
        assert visible_end(log.clip(th, topic(2), 26 * S)) == Position(3, 0)
        assert visible_end(log.clip(th, topic(2), 28 * S)) == Position(3, 1)

    def test_the_clipped_ledger_is_shown_open_and_sized_up_to_the_end(self) -> None:
        log = TailLog()
        th = Thresholds(bytes=250)
        log.clip(th, topic(2), 21 * S)  # tail 3:1 at 800 B
        seen = log.clip(th, topic(5), 22 * S)  # tail 3:4 at 1100 B: 3:1 has 300 B after it
        assert [(d.ledger_id, d.state, d.last_entry_id, d.size) for d in seen] == [
            (1, LedgerState.CLOSED, 2, 300), (2, LedgerState.CLOSED, 2, 300),
            (3, LedgerState.OPEN, 1, 200)]

    def test_nothing_eligible_shows_an_empty_topic(self) -> None:
        seen = TailLog().clip(Thresholds(bytes=10_000), topic(), 30 * S)
        assert visible_end(seen) is None

    def test_marks_behind_the_offloaders_position_are_forgotten(self) -> None:
        log = TailLog()
        th = Thresholds(seconds=5)
        for i in range(1, 6):
            log.clip(th, topic(i), (20 + 2 * i) * S)
        assert len(log) == 5
        log.clip(th, topic(5), 40 * S, done=Position(3, 4))
        assert len(log) <= 2

    def test_without_thresholds_nothing_is_kept_or_hidden(self) -> None:
        log = TailLog()
        assert log.clip(Thresholds(), topic(), 30 * S) == topic()
        assert len(log) == 0


class TestPulsarNames:
    """Pulsar's names load, as aliases of settings offloadd has, at every policy level."""

    def test_threshold_and_reader_names(self, tmp_path: Path) -> None:
        cfg = tmp_path / "c.toml"
        cfg.write_text("""
[offload]
managedLedgerOffloadThresholdInBytes = 1073741824
managedLedgerOffloadThresholdInSeconds = 3600
s3ManagedLedgerOffloadReadBufferSizeInBytes = 4194304
managedLedgerOffloadBrokerFlowPermits = 1048576
max_block_size_bytes = 1048576
[namespaces."public/archive"]
managedLedgerOffloadAutoTriggerSizeThresholdBytes = 0
[topics."persistent://public/default/big"]
managedLedgerOffloadMaxThresholdInBytes = 5
""")
        s = config.load(cfg)
        assert s.offload.threshold_bytes == 1 << 30
        assert s.offload.threshold_seconds == 3600
        assert s.offload.flow_permits_per_second == 1 << 20
        assert s.offload.read_buffer_bytes == 4 << 20
        assert s.offload.prefetch_blocks() == 4
        from offloadd.model import TopicName

        assert s.policy_for(TopicName.parse("persistent://public/archive/x")).threshold_bytes == 0
        big = s.policy_for(TopicName.parse("persistent://public/default/big"))
        assert (big.threshold_bytes, big.threshold_seconds) == (5, 3600)

    def test_an_alias_and_its_key_together_are_refused(self, tmp_path: Path) -> None:
        cfg = tmp_path / "c.toml"
        cfg.write_text("[offload]\nthreshold_bytes = 1\n"
                       "managedLedgerOffloadThresholdInBytes = 2\n")
        with pytest.raises(config.ConfigError, match="both threshold_bytes and its alias"):
            config.load(cfg)

    def test_defaults_hold_nothing_back(self) -> None:
        s = config.load(None)
        assert Thresholds.from_config(s.offload.threshold_bytes,
                                      s.offload.threshold_seconds) == Thresholds()
        assert s.offload.prefetch_blocks() == s.offload.read_prefetch_blocks
