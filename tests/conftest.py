"""Shared test set-up: uvloop for every async test, and the real-server fixtures."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import uvloop

pytest_plugins: list[str] = []

# Helper modules assert too (tests/s3e2e/helpers.py, tests/reliability/support.py, ...): with
# their asserts rewritten, a failure in CI says which values differed, not just AssertionError.
pytest.register_assert_rewrite(*sorted(
    f"tests.{d.name}" for d in Path(__file__).parent.iterdir() if (d / "__init__.py").is_file()))


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], object]]:
    return {"uvloop": uvloop.new_event_loop}


# Files that start a local Spark: one pytest-xdist worker runs them all (two workers each
# starting a Spark session crashed a worker), and so the session starts once.
SPARK_FILES = ("tests/backfill/", "tests/lakehouse/test_e2e.py",
               "tests/lakehouse/test_spark_typed.py")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """scripts/test runs the suite on pytest-xdist workers: each test file stays on one worker
    (its module fixtures start once), and the Spark files all go to the same one. (xdist's own
    ``--dist loadgroup`` cannot say so under pytest 9: it renames nodes through an attribute
    pytest 9 no longer reads, so every test became its own group.)"""
    from xdist.scheduler import LoadScopeScheduling

    class FileOrSpark(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "spark" if path.startswith(SPARK_FILES) else path

    return FileOrSpark(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_slow(items)


def skip_slow(items: list[pytest.Item]) -> None:
    if os.environ.get("OFFLOADD_SLOW_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="long mode: set OFFLOADD_SLOW_TESTS=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
