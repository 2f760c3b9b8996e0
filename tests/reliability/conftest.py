"""The reliability suite's fixtures (real ZooKeeper, moto S3) and its figures.

Every test records what it tried and what it found through the ``figures`` fixture. At the end of
the session the figures are printed as one JSON object in the terminal summary, stored in the
pytest cache (``offloadd/reliability``) and, when ``OFFLOADD_RELIABILITY_JSON`` names a file,
written there; ``python -m tests.reliability.report`` turns them into docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.s3 import moto_server, s3_bucket  # noqa: F401  (fixtures)
from tests.fixtures.zookeeper import zk_ensemble, zk_server  # noqa: F401  (fixtures)

CACHE_KEY = "offloadd/reliability"
_KEY = pytest.StashKey["Figures"]()


class Figures:
    """Named sections of counters and values; totals are derived, never recorded by hand."""

    def __init__(self) -> None:
        self.sections: dict[str, dict[str, Any]] = {}
        self.started = time.monotonic()

    def section(self, name: str) -> dict[str, Any]:
        return self.sections.setdefault(name, {})

    def set(self, section: str, **values: Any) -> None:
        self.section(section).update(values)

    def add(self, section: str, **values: int) -> None:
        sec = self.section(section)
        for k, v in values.items():
            sec[k] = sec.get(k, 0) + v

    def totals(self) -> dict[str, int]:
        """Sum every counter of the same name across sections (cases, faults, lost...)."""
        names = ("cases", "cases_passed", "faults_injected", "faults_survived", "kills",
                 "entries_checked", "entries_lost", "entries_duplicated", "checksum_mismatches",
                 "orphans_left", "secret_hits")
        out = dict.fromkeys(names, 0)
        for sec in self.sections.values():
            for n in names:
                v = sec.get(n)
                if isinstance(v, int) and not isinstance(v, bool):
                    out[n] += v
        return out

    def to_json(self) -> dict[str, Any]:
        return {"totals": self.totals(), "sections": self.sections,
                "seconds": round(time.monotonic() - self.started, 1),
                "slow": os.environ.get("OFFLOADD_SLOW_TESTS") == "1"}


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_KEY] = Figures()


@pytest.fixture(scope="session")
def figures(request: pytest.FixtureRequest) -> Figures:
    return request.config.stash[_KEY]


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int,
                            config: pytest.Config) -> None:
    figs = config.stash.get(_KEY, None)
    if figs is None or not figs.sections:
        return
    data = figs.to_json()
    text = json.dumps(data, indent=2, sort_keys=True)
    terminalreporter.write_sep("-", "offloadd reliability figures")
    terminalreporter.write_line(text)
    cache = getattr(config, "cache", None)
    if cache is not None:
        cache.set(CACHE_KEY, data)
    out = os.environ.get("OFFLOADD_RELIABILITY_JSON")
    if out:
        Path(out).write_text(text + "\n")
