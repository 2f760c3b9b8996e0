"""One local[2] SparkSession for the whole backfill test session (start-up costs ~10 s)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from offloadd.backfill.spark import session

    s = session("local[2]", app_name="offloadd-tests", log_level="ERROR",
                conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
                      "spark.network.timeout": "60s", "spark.python.worker.reuse": "true"})
    try:
        yield s
    finally:
        s.stop()
