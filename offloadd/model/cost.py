"""What a topic's tier costs: objects, bytes, requests per GiB, an estimated monthly bill (pure).

From the catalog alone: each committed segment records its usage when it commits
(:class:`~offloadd.model.catalog.TierUsage`: its objects, their stored bytes, the payload they
hold, the PUT-class requests that wrote them), so what retention deleted drops out and no
status lists the bucket. GET-class requests are those offloadd itself made reading the topic
back (its read-back checks), kept in the topic's status record; a broker reading the tier
directly is not seen (the bucket's own request metrics show it).

The monthly estimate::

    stored GiB × storage price
    + PUT-class requests of the segments committed in the last 30 days, scaled to 30 days when
      the topic has committed for less (at least one hour is assumed) × PUT price / 1000
    + GET-class requests at the rate seen since they were first counted × GET price / 1000
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from offloadd.model.catalog import Segment, TierUsage, usage_of

__all__ = ["GIB", "Prices", "TopicCost", "topic_cost"]

GIB = 1 << 30
MONTH_MS = 30 * 86_400_000
_MIN_SPAN_MS = 3_600_000  # a first segment a second old must not make a rate of it


@dataclass(frozen=True)
class Prices:
    storage_per_gb_month: float = 0.023
    put_per_1000: float = 0.005
    get_per_1000: float = 0.0004


@dataclass(frozen=True)
class TopicCost:
    usage: TierUsage
    unsized_segments: int  # committed segments that recorded no usage (counted nowhere above)
    put_per_gib: float | None  # PUT-class requests per GiB of payload offloaded
    get_requests: int
    get_per_gib: float | None  # GET-class requests per GiB read back
    monthly: float  # estimated, in the prices' currency
    monthly_storage: float
    monthly_requests: float

    def as_dict(self) -> dict[str, object]:
        return {"objects": self.usage.objects, "stored_bytes": self.usage.stored_bytes,
                "payload_bytes": self.usage.payload_bytes,
                "put_requests": self.usage.put_requests,
                "put_requests_per_gib": _round(self.put_per_gib),
                "get_requests": self.get_requests,
                "get_requests_per_gib": _round(self.get_per_gib),
                "unsized_segments": self.unsized_segments,
                "monthly_cost": round(self.monthly, 4),
                "monthly_storage_cost": round(self.monthly_storage, 4),
                "monthly_request_cost": round(self.monthly_requests, 4)}


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def topic_cost(segments: Sequence[Segment], prices: Prices, now_ms: int, *,
               get_requests: int = 0, get_bytes: int = 0,
               get_since_ms: int | None = None) -> TopicCost:
    """The cost of a topic's committed ``segments`` (others are ignored) at ``prices``."""
    total, unsized = TierUsage(), 0
    recent_puts, oldest = 0, now_ms
    for seg in segments:
        if not seg.complete:
            continue
        u = usage_of(seg)
        if u is None:
            unsized += 1
            continue
        total = total + u
        if seg.offloaded_ms and now_ms - seg.offloaded_ms <= MONTH_MS:
            recent_puts += u.put_requests
            oldest = min(oldest, seg.offloaded_ms)
    put_span = min(max(now_ms - oldest, _MIN_SPAN_MS), MONTH_MS)
    puts_month = recent_puts * MONTH_MS / put_span
    gets_month = 0.0
    if get_requests and get_since_ms is not None:
        gets_month = get_requests * MONTH_MS / max(now_ms - get_since_ms, _MIN_SPAN_MS)
    storage = total.stored_bytes / GIB * prices.storage_per_gb_month
    requests = puts_month / 1000 * prices.put_per_1000 + gets_month / 1000 * prices.get_per_1000
    payload_gib = total.payload_bytes / GIB
    return TopicCost(
        total, unsized,
        total.put_requests / payload_gib if payload_gib else None,
        get_requests, get_requests / (get_bytes / GIB) if get_bytes else None,
        storage + requests, storage, requests)
