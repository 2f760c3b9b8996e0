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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("OFFLOADD_SLOW_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="long mode: set OFFLOADD_SLOW_TESTS=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
