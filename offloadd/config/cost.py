"""``[cost]``: the prices ``offloadd status`` estimates a topic's monthly tier cost with.

Defaults: Amazon S3 Standard list prices in us-east-1 (first 50 TB/month), taken 2026-11 from
AWS's published price list (https://aws.amazon.com/s3/pricing/): $0.023 per GB-month stored,
$0.005 per 1,000 PUT, COPY, POST and LIST requests, $0.0004 per 1,000 GET and other requests;
DELETE and abort requests are free. Prices change and differ by region, storage class, volume
and contract: operators must check them and set their own.
"""

from __future__ import annotations

from pydantic import Field

from offloadd.config.fields import Section


class CostSettings(Section):
    """Prices for the monthly tier cost `offloadd status` estimates per topic. Defaults: Amazon
    S3 Standard, us-east-1, list prices taken 2026-11 from AWS's published price list
    (aws.amazon.com/s3/pricing); operators must check them against their own bill."""

    currency: str = Field("USD", min_length=1, description="what the prices are in (a label)")
    storage_per_gb_month: float = Field(
        0.023, ge=0, description="stored bytes, per GB (2^30 bytes, as S3 bills) and month "
        "(S3 Standard, us-east-1, list price taken 2026-11: check yours)")
    put_per_1000: float = Field(
        0.005, ge=0, description="PUT, COPY, POST and LIST requests, per 1,000 (S3 Standard "
        "us-east-1 list price taken 2026-11)")
    get_per_1000: float = Field(
        0.0004, ge=0, description="GET, HEAD and other requests, per 1,000 (S3 Standard "
        "us-east-1 list price taken 2026-11)")
