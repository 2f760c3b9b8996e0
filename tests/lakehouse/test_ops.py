"""Table lag (entries and seconds behind the tier) and which snapshots may expire: pure parts
of offloadd/lakehouse/ops.py and cleanup.py."""

from __future__ import annotations

import uuid
from typing import Any

from offloadd.lakehouse.cleanup import expirable
from offloadd.lakehouse.ops import TableLag, lag
from offloadd.model import Position
from offloadd.model.catalog import LedgerRange, Segment, SegmentKind


def seg(ranges: list[tuple[int, int, int]], offloaded_ms: int, complete: bool = True) -> Segment:
    return Segment(uuid.uuid4(), SegmentKind.STREAMING,
                   tuple(LedgerRange(*r) for r in ranges), complete, 0, offloaded_ms)


SEGS = [seg([(1, 0, 99)], 1_000), seg([(1, 100, 149), (2, 0, 49)], 5_000),
        seg([(3, 0, 9)], 9_000), seg([(3, 10, 19)], 0, complete=False)]


def test_lag_counts_committed_entries_after_the_table_and_the_oldest_waiting_commit() -> None:
    assert lag(SEGS, None, 10_000) == TableLag(210, 9.0)
    assert lag(SEGS, Position(1, 99), 10_000) == TableLag(110, 5.0)
    assert lag(SEGS, Position(1, 120), 10_000) == TableLag(89, 5.0)
    assert lag(SEGS, Position(2, 49), 10_000) == TableLag(10, 1.0)
    assert lag(SEGS, Position(3, 9), 10_000) == TableLag(0, 0.0)  # the assigned one: not yet


class _Snap:
    def __init__(self, sid: int, ts: int, parent: int | None) -> None:
        self.snapshot_id, self.timestamp_ms, self.parent_snapshot_id = sid, ts, parent


class _Log:
    def __init__(self, sid: int, ts: int) -> None:
        self.snapshot_id, self.timestamp_ms = sid, ts


class _Meta:
    def __init__(self, snaps: list[_Snap], current: int) -> None:
        self.snapshots = snaps
        self.current_snapshot_id = current
        self.refs: dict[str, Any] = {}
        self.snapshot_log = [_Log(s.snapshot_id, s.timestamp_ms) for s in snaps]


def test_a_snapshot_expires_only_a_grace_after_it_stopped_being_current() -> None:
    # 1 made at t=0, replaced by 2 at t=100; 3 replaced 2 at t=900 and is current
    md: Any = _Meta([_Snap(1, 0, None), _Snap(2, 100, 1), _Snap(3, 900, 2)], current=3)
    assert expirable(md, now_ms=1000, max_age_ms=50, grace_ms=0) == [1, 2]
    assert expirable(md, now_ms=1000, max_age_ms=50, grace_ms=500) == [1]  # 2 left at 900
    assert expirable(md, now_ms=1000, max_age_ms=950, grace_ms=0) == [1]  # 2 is too young
    assert expirable(md, now_ms=1000, max_age_ms=0, grace_ms=5000) == []


def test_the_lakehouse_lag_alert_fires_past_five_minutes_per_topic_or_namespace(
        tmp_path: Any) -> None:
    """OffloaddLakehouseLagHigh (promtool test rules): a table 10 min behind fires, one that
    caught up does not; per namespace when the topic label is off."""
    import shutil
    import subprocess
    from pathlib import Path

    import pytest
    import yaml  # type: ignore[import-untyped]  # PyYAML arrives with moto[server]

    tool = shutil.which("promtool")
    if tool is None:
        pytest.skip("promtool not installed (Debian package prometheus; scripts/setup --servers)")
    rules = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "offloadd-rules.yml"
    s = "offloadd_lakehouse_lag_seconds"

    def annotations(who: str, lag: str) -> dict[str, str]:
        return {"runbook_url": "docs/runbook.md#offloaddlakehouselaghigh",
                "summary": f"Lakehouse table of {who} trails the tier by {lag}",
                "description": f"Entries of {who} committed to the tier have not reached its "
                "Iceberg table for over 5 minutes: the projection fails or is slower than the "
                "offload."}
    case = {"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [
            {"series": f'{s}{{namespace="public/default",topic="behind"}}',
             "values": "600+60x30"},
            {"series": f'{s}{{namespace="public/default",topic="fine"}}', "values": "3x30"},
            {"series": f'{s}{{namespace="t/aggregated"}}', "values": "900x30"},
            {"series": f'{s}{{namespace="t/recovered"}}', "values": "900x5 0x25"},
        ],
        "alert_rule_test": [{"eval_time": "20m", "alertname": "OffloaddLakehouseLagHigh",
                             "exp_alerts": [
                                 {"exp_labels": {"namespace": "public/default",
                                                 "topic": "behind", "severity": "warning"},
                                  "exp_annotations": annotations("behind", "30m 0s")},
                                 {"exp_labels": {"namespace": "t/aggregated",
                                                 "severity": "warning"},
                                  "exp_annotations": annotations("t/aggregated", "15m 0s")}]}],
    }]}
    test_file = tmp_path / "lake-test.yml"
    test_file.write_text(yaml.safe_dump(case))
    p = subprocess.run([tool, "test", "rules", str(test_file)], capture_output=True, text=True,
                       timeout=60, check=False)
    assert p.returncode == 0, p.stdout + p.stderr
