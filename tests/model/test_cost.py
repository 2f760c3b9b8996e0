"""A topic's tier cost from its catalog: sums of what each segment recorded, a monthly estimate."""

from __future__ import annotations

import uuid

import pytest

from offloadd.model.catalog import LedgerRange, Segment, SegmentKind, TierUsage
from offloadd.model.cost import GIB, MONTH_MS, Prices, topic_cost

DAY_MS = 86_400_000


def seg(usage: TierUsage | None, offloaded_ms: int, complete: bool = True) -> Segment:
    props = tuple(sorted(usage.properties().items())) if usage is not None else ()
    return Segment(uuid.uuid4(), SegmentKind.STREAMING, (LedgerRange(1, 0, 9),), complete,
                   offloaded_ms, offloaded_ms, "aws-s3", (("bucket", "b"), *props))


class TestTopicCost:
    """Sums over committed segments; PUT cost from the last 30 days, scaled to a month."""

    def test_a_month_of_segments(self) -> None:
        now = 60 * DAY_MS
        # one segment a day for 30 days (all within the window), 1 GiB stored each
        segs = [seg(TierUsage(2, GIB, GIB - 1000, 131), now - d * DAY_MS) for d in range(30)]
        c = topic_cost(segs, Prices(), now)
        assert c.usage == TierUsage(60, 30 * GIB, 30 * (GIB - 1000), 30 * 131)
        assert c.monthly_storage == pytest.approx(30 * 0.023)
        # 30 days of PUTs seen over 29 days: scaled to 30
        assert c.monthly_requests == pytest.approx(30 * 131 * 30 / 29 / 1000 * 0.005)
        assert c.put_per_gib == pytest.approx(131 / ((GIB - 1000) / GIB))
        assert c.get_per_gib is None and c.unsized_segments == 0

    def test_uncommitted_and_unsized_segments(self) -> None:
        now = 10 * DAY_MS
        segs = [seg(TierUsage(2, 100, 90, 4), now - DAY_MS),
                seg(TierUsage(2, 100, 90, 4), now, complete=False),
                seg(None, now - DAY_MS)]
        c = topic_cost(segs, Prices(), now)
        assert c.usage == TierUsage(2, 100, 90, 4) and c.unsized_segments == 1

    def test_old_segments_cost_storage_only_and_gets_count(self) -> None:
        now = 100 * DAY_MS
        c = topic_cost([seg(TierUsage(2, GIB, GIB, 1000), now - 40 * DAY_MS)],
                       Prices(0.02, 0.01, 0.001), now, get_requests=300, get_bytes=GIB // 2,
                       get_since_ms=now - 3 * DAY_MS)
        assert c.monthly_storage == pytest.approx(0.02)
        assert c.monthly_requests == pytest.approx(300 * 10 / 1000 * 0.001)
        assert c.get_per_gib == pytest.approx(600)
        assert MONTH_MS == 30 * DAY_MS
