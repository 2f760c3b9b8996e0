"""The lakehouse at many topics (issue 22) and its read-committed counts in operations (issue 24
item 1): passes that skip unchanged tables, the follower's commit budget, the counts in
/metrics (per namespace), ``status`` and ``lakehouse tables``."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from offloadd import wiring
from offloadd.config import Settings
from offloadd.lakehouse.pacing import CommitBudget
from offloadd.lakehouse.projector import Projector
from offloadd.metadata import managed_ledger
from offloadd.model import TopicName, catalog
from tests.lakehouse.support import run, settings_of, summary, write_config

pytestmark = pytest.mark.integration
T0 = "persistent://public/default/topic-0"
T1 = "persistent://public/default/topic-1"


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """Two topics of transactional messages (aborts, markers) offloaded, nothing projected."""
    cwd = tmp_path_factory.mktemp("lakehouse-scale")
    cfg = write_config(cwd, lakehouse="enabled = false\n")
    out = run(["standalone", "--json", "--config", str(cfg), "--duration", "6", "--topics", "2",
               "--rate", "300000", "--transactions"], cwd, timeout=240)
    result = summary(out.stdout)
    assert all(result["topics"][t]["sent"]["aborted_messages"] > 0 for t in (T0, T1)), result
    return cwd / "data", result


@pytest.fixture
def cwd(source: tuple[Path, dict[str, Any]], tmp_path: Path) -> Path:
    shutil.copytree(source[0], tmp_path / "data")
    write_config(tmp_path)
    return tmp_path


def settings(cwd: Path) -> Settings:
    return settings_of(cwd / "offloadd.toml")


@asynccontextmanager
async def projector(s: Settings, cls: type[Projector] = Projector) -> AsyncIterator[Projector]:
    md = await wiring.open_metadata(s)
    bs = await wiring.open_blobstore(s)
    try:
        yield cls(s, md, bs)
    finally:
        await bs.close()
        await md.close()


class Counting(Projector):
    """Counts what a pass does to each table: loads of it and reads of its schema locator."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tables = 0
        self.schemas = 0

    async def _table(self, topic: TopicName, *, refresh: bool = False) -> Any:
        self.tables += 1
        return await super()._table(topic, refresh=refresh)

    async def _typed_decoder(self, topic: TopicName, table: Any) -> None:
        self.schemas += 1
        await super()._typed_decoder(topic, table)


@pytest.mark.timeout(300)
async def test_a_pass_with_nothing_new_touches_no_table(cwd: Path) -> None:
    """Issue 22: the follower's pass at rest reads each managed ledger and nothing else — no
    table reload, no schema locator, no schema evolution (a thousand tables cost seconds of CPU
    every pass before)."""
    async with projector(settings(cwd), Counting) as p:
        assert isinstance(p, Counting)
        first = await p.sync()
        assert sum(r.commits for r in first) >= 2 and all(r.error is None for r in first)
        p.tables = p.schemas = 0
        again = await p.sync()
        assert (p.tables, p.schemas) == (0, 0)
        assert [(r.topic, r.commits, r.last_position) for r in again] == \
            [(r.topic, 0, r.last_position) for r in first]


@pytest.mark.timeout(300)
async def test_the_commit_budget_defers_tables_and_serves_the_oldest_first(cwd: Path) -> None:
    """Issue 22: within the follower's budget a pass commits what it may, oldest unprojected
    commit first; the other tables are reported deferred and projected by a later pass."""
    s = settings(cwd)
    async with projector(s) as p:
        now = time.time()
        budget = CommitBudget(rate=1e-9, burst=1.0, tokens=1.0, at=now)
        reps = {r.topic: r for r in await p.sync(budget=budget)}
        served = [t for t, r in reps.items() if r.commits]
        deferred = [t for t, r in reps.items() if r.deferred]
        assert len(served) == 1 and deferred == [t for t in (T0, T1) if t not in served]
        firsts = {t: await _first_commit_ms(p, t) for t in (T0, T1)}
        assert served == [min(firsts, key=lambda t: firsts[t])]
        assert not budget.ready(now)  # spent: the next pass defers both
        later = await p.sync(budget=budget)
        assert all(r.commits == 0 for r in later)
        assert {r.topic for r in later if r.deferred} == set(deferred)
        done = await p.sync()  # no budget (`lakehouse sync`): everything
        assert {r.topic for r in done if r.commits} == set(deferred)
    assert CommitBudget.create(0, 5, 0).ready(0)  # 0: unbounded


async def _first_commit_ms(p: Projector, topic: str) -> int:
    """When the topic's first segment was committed to the tier."""
    info, _ = await managed_ledger.load(p.metadata, TopicName.parse(topic).managed_ledger)
    return min(s.offloaded_ms for s in catalog.segments(info) if s.complete)


@pytest.mark.timeout(400)
async def test_read_committed_counts_in_metrics_status_and_tables(
        cwd: Path, source: tuple[Path, dict[str, Any]]) -> None:
    """Issue 24 item 1: what read-committed hid is counted per namespace in /metrics (never per
    topic, whatever ``topic_level`` says), and per table in ``status`` and ``lakehouse
    tables``."""
    from prometheus_client.parser import text_string_to_metric_families

    from offloadd.lakehouse.follower import report_pass, report_stats
    from offloadd.metrics import Metrics

    sent = {t: source[1]["topics"][t]["sent"] for t in (T0, T1)}
    aborted = sum(s["aborted_messages"] for s in sent.values())
    txns = sum(s["transactions"] for s in sent.values())
    aborted_txns = sum(s["aborted_transactions"] for s in sent.values())
    metrics = Metrics(topic_level=True)
    async with projector(settings(cwd)) as p:
        report_pass(metrics, await p.sync())
        report_stats(metrics, p.table_stats(int(time.time() * 1000)))
    text = metrics.exposition()[0].decode()
    got: dict[tuple[str, str], float] = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            if smp.name.startswith(("offloadd_lakehouse_hidden", "offloadd_lakehouse_trans",
                                    "offloadd_lakehouse_held")):
                assert "topic" not in smp.labels and smp.labels["namespace"] == "public/default"
                got[smp.name, smp.labels.get("reason") or smp.labels.get("outcome", "")] = \
                    smp.value
    assert got == {
        ("offloadd_lakehouse_hidden_messages_total", "marker"): txns,
        ("offloadd_lakehouse_hidden_messages_total", "aborted"): aborted,
        ("offloadd_lakehouse_hidden_messages_total", "timed_out"): 0,
        ("offloadd_lakehouse_transactions_total", "committed"): txns - aborted_txns,
        ("offloadd_lakehouse_transactions_total", "aborted"): aborted_txns,
        ("offloadd_lakehouse_transactions_total", "timed_out"): 0,
        ("offloadd_lakehouse_held_entries", ""): 0,
    }

    st = json.loads(run(["status", "--config", "offloadd.toml", "--json"], cwd,
                        check=False).stdout)
    tables = json.loads(run(["lakehouse", "tables", "--config", "offloadd.toml", "--json"],
                            cwd).stdout)["tables"]
    for rows in (st["lakehouse"]["tables"], tables):
        by = {t["topic"]: t for t in rows}
        for topic, s in sent.items():
            rc = by[topic]["read_committed"]
            assert (rc["aborted_messages"], rc["markers"], rc["transactions_aborted"],
                    by[topic]["held_entries"]) == (s["aborted_messages"], s["transactions"],
                                                  s["aborted_transactions"], 0)
    text = run(["status", "--config", "offloadd.toml"], cwd, check=False).stdout
    assert (f"hidden {sent[T0]['transactions']} markers, {sent[T0]['aborted_messages']} "
            "aborted") in text
    text = run(["lakehouse", "tables", "--config", "offloadd.toml"], cwd).stdout
    assert (f"hidden {sent[T1]['transactions']} markers, {sent[T1]['aborted_messages']} "
            "aborted") in text
