"""Shared test set-up: uvloop for every async test, and the real-server fixtures."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

import pytest
import uvloop

pytest_plugins: list[str] = []


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], object]]:
    return {"uvloop": uvloop.new_event_loop}


# Files that start a local Spark: one pytest-xdist worker runs them all (two workers each
# starting a Spark session crashed a worker), and so the session starts once.
SPARK_FILES = ("tests/backfill/", "tests/lakehouse/test_e2e.py")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # scripts/test runs files on workers with --dist loadgroup: a file is a group (its module
    # fixtures start once), and the Spark files are one group
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group("spark" if path.startswith(SPARK_FILES)
                                                else path))
    if os.environ.get("OFFLOADD_SLOW_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="long mode: set OFFLOADD_SLOW_TESTS=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
