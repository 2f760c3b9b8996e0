"""The projection against real stores (embedded metadata, filesystem tier, SQLite catalog): exactly
once across partial runs and commit races, undecodable entries kept as flagged rows, compaction,
retention, JSON columns.

The data comes from one real run (module scope): ``offloadd produce --payload raw`` writes a
``junk`` topic of random bytes (entries no broker would write), then ``offloadd standalone`` writes
two topics of Pulsar entries and offloads all three. Each test works on its own copy.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from offloadd import wiring
from offloadd.config import Settings
from offloadd.lakehouse.cleanup import referenced
from offloadd.lakehouse.projector import Projector, TopicReport
from offloadd.lakehouse.tables import last_position, open_catalog
from offloadd.metadata import managed_ledger
from offloadd.model import Position, TopicName
from tests.lakehouse.support import (
    digest,
    distinct_positions,
    run,
    settings_of,
    summary,
    table_rows,
    write_config,
)

pytestmark = pytest.mark.integration
T0 = "persistent://public/default/topic-0"
T1 = "persistent://public/default/topic-1"
JUNK = "persistent://public/default/junk"


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    cwd = tmp_path_factory.mktemp("lakehouse-source")
    cfg = write_config(cwd, lakehouse="enabled = false\n")
    run(["produce", "--json", "--config", str(cfg), "--topic", JUNK, "--bytes", "20480",
         "--payload", "raw"], cwd)
    out = run(["standalone", "--json", "--config", str(cfg), "--duration", "10", "--topics", "2",
               "--rate", "1000000"], cwd, timeout=200)
    result = summary(out.stdout)
    assert all(result["topics"][t]["ledgers"] >= 3 for t in (T0, T1)), result
    return cwd / "data", result


@pytest.fixture
def data(source: tuple[Path, dict[str, Any]], tmp_path: Path) -> Path:
    shutil.copytree(source[0], tmp_path / "data")
    return tmp_path


def sent(source: tuple[Path, dict[str, Any]], topic: str) -> dict[str, Any]:
    result: dict[str, Any] = source[1]["topics"][topic]["sent"]
    return result


def configure(cwd: Path, lakehouse: str = "") -> Settings:
    return settings_of(write_config(cwd, lakehouse="enabled = true\n" + lakehouse))


@asynccontextmanager
async def projector(settings: Settings, cls: type[Projector] = Projector
                    ) -> AsyncIterator[Projector]:
    md = await wiring.open_metadata(settings)
    bs = await wiring.open_blobstore(settings)
    try:
        yield cls(settings, md, bs)
    finally:
        await bs.close()
        await md.close()


def by_topic(reports: list[TopicReport]) -> dict[str, TopicReport]:
    return {r.topic: r for r in reports}


class TestExactlyOnce:
    """Rows and the position they end at are one commit: partial runs and races never
    duplicate or lose a row."""

    @pytest.mark.timeout(240)
    async def test_partial_runs_resume_where_the_table_says(
            self, data: Path, source: tuple[Path, dict[str, Any]]) -> None:
        settings = configure(data, "commit_max_bytes = 200000\n")
        async with projector(settings) as p:
            first = by_topic(await p.sync([TopicName.parse(T0)], max_commits=2))[T0]
            assert first.commits == 2
            rows = table_rows(settings, T0)
            last = rows.slice(rows.num_rows - 1).to_pylist()[0]
            assert first.last_position == f"{last['ledger_id']}:{last['entry_id']}"
            table = open_catalog(settings).load_table(("public", "default", "topic-0"))
            assert last_position(table) == Position(last["ledger_id"], last["entry_id"])
            rest = by_topic(await p.sync())
            assert rest[T0].commits > 1 and rest[T0].error is None
            again = by_topic(await p.sync())
            assert all(r.rows == 0 and r.commits == 0 for r in again.values())
        for topic in (T0, T1):
            rows = table_rows(settings, topic)
            assert digest(rows) == sent(source, topic)
            assert distinct_positions(rows) == rows.num_rows

    @pytest.mark.timeout(240)
    async def test_a_stale_writer_loses_the_race_and_resumes_from_the_winner(
            self, data: Path, source: tuple[Path, dict[str, Any]]) -> None:
        settings = configure(data, "commit_max_bytes = 300000\n")
        topic = TopicName.parse(T0)
        async with projector(settings) as winner:

            class Stale(Projector):
                """Before its first commit, the winner commits: this one's table is stale."""
                raced = False

                async def _commit(self, *args: Any, **kwargs: Any) -> Any:
                    if not Stale.raced:
                        Stale.raced = True
                        assert (await winner.sync_topic(topic, max_commits=1)).commits == 1
                    return await super()._commit(*args, **kwargs)

            async with projector(settings, Stale) as loser:
                rep = await loser.sync_topic(topic)
        assert rep.conflicts == 1
        rows = table_rows(settings, T0)
        assert digest(rows) == sent(source, T0)
        assert distinct_positions(rows) == rows.num_rows

    @pytest.mark.timeout(240)
    async def test_a_commit_that_refreshes_the_table_does_not_hide_the_winners_rows(
            self, data: Path, source: tuple[Path, dict[str, Any]]) -> None:
        """Between reading where to resume and its first append, the loser commits something
        else to its stale table (what a schema evolution does): that commit succeeds, and its
        answer brings the table up to the winner's snapshot. The append must still see that
        the position it read is no longer the table's, or it re-adds the winner's rows."""
        settings = configure(data, "commit_max_bytes = 300000\n")
        topic = TopicName.parse(T0)
        async with projector(settings) as winner:

            class Stale(Projector):
                raced = False

                async def _typed_decoder(self, topic: TopicName, table: Any) -> None:
                    if not Stale.raced:
                        Stale.raced = True
                        assert (await winner.sync_topic(topic, max_commits=1)).commits == 1

                        def touch() -> None:  # a metadata-only commit, as evolve() makes
                            with table.transaction() as tx:
                                tx.set_properties({"offloadd.test": "touched"})

                        await asyncio.to_thread(touch)
                    await super()._typed_decoder(topic, table)

            async with projector(settings, Stale) as loser:
                rep = await loser.sync_topic(topic)
        rows = table_rows(settings, T0)
        assert distinct_positions(rows) == rows.num_rows
        assert digest(rows) == sent(source, T0)
        assert rep.conflicts == 1

    @pytest.mark.timeout(240)
    async def test_two_projectors_at_once(self, data: Path,
                                          source: tuple[Path, dict[str, Any]]) -> None:
        settings = configure(data, "commit_max_bytes = 100000\n")
        async with projector(settings) as a, projector(settings) as b:
            reps = await asyncio.gather(a.sync(), b.sync())
        for topic in (T0, T1):
            rows = table_rows(settings, topic)
            assert digest(rows) == sent(source, topic)
            assert distinct_positions(rows) == rows.num_rows
        total = sum(r.rows for rs in reps for r in rs if r.topic in (T0, T1))
        assert total == sum(sent(source, t)["messages"] for t in (T0, T1))


@pytest.mark.timeout(240)
async def test_undecodable_entries_are_flagged_rows_not_losses(data: Path) -> None:
    settings = configure(data)
    async with projector(settings) as p:
        rep = by_topic(await p.sync([TopicName.parse(JUNK)]))[JUNK]
    rows = table_rows(settings, JUNK)
    assert rep.undecodable == rep.entries == rows.num_rows == 20
    for r in rows.to_pylist():
        assert r["decode_error"].startswith(f"{JUNK} {r['ledger_id']}:{r['entry_id']} at byte ")
        assert r["batch_index"] == -1 and len(r["payload"]) == 1024 and r["publish_time"] is None


@pytest.mark.timeout(240)
async def test_compaction_rewrites_small_files_and_keeps_every_row(
        data: Path, source: tuple[Path, dict[str, Any]]) -> None:
    settings = configure(data, "commit_max_bytes = 100000\ncompact_min_files = 4\n"
                               "snapshot_max_age_minutes = 0.0001\nreader_grace_minutes = 0\n")
    topic = TopicName.parse(T0)
    async with projector(settings) as p:
        rep = by_topic(await p.sync([topic]))[T0]
        table = open_catalog(settings).load_table(("public", "default", "topic-0"))
        files_before = len(list(table.scan().plan_files()))
        assert files_before == rep.commits >= 4
        await asyncio.sleep(0.05)  # older than snapshot_max_age
        (done,) = await p.maintain([topic])
    table = open_catalog(settings).load_table(("public", "default", "topic-0"))
    files_after = len(list(table.scan().plan_files()))
    assert done.files_rewritten == files_before and files_after == done.files_written == 1
    assert done.snapshots_expired >= rep.commits - 1
    assert str(last_position(table)) == rep.last_position
    rows = table_rows(settings, T0)
    assert digest(rows) == sent(source, T0)
    async with projector(settings) as p:  # and projection goes on after it
        assert by_topic(await p.sync([topic]))[T0].rows == 0


async def _drop_first_ledger(settings: Settings, topic: TopicName) -> int:
    """What retention does to the managed ledger: the oldest ledger is gone."""
    md = await wiring.open_metadata(settings)
    try:
        info, _ = await managed_ledger.load(md, topic.managed_ledger)
        first = info.ledgerInfo[0].ledgerId

        def edit(i: Any) -> bool:
            del i.ledgerInfo[0]
            return True

        await managed_ledger.update(md, topic.managed_ledger, edit)
        return int(first)
    finally:
        await md.close()


class TestRetention:
    """Segment retention in the tier does not delete table rows unless configured."""

    @pytest.mark.timeout(240)
    @pytest.mark.parametrize("follow", [False, True])
    async def test_rows_of_deleted_ledgers(self, data: Path, follow: bool,
                                           source: tuple[Path, dict[str, Any]]) -> None:
        settings = configure(data, f"delete_with_retention = {str(follow).lower()}\n")
        topic = TopicName.parse(T0)
        async with projector(settings) as p:
            await p.sync([topic])
            gone = await _drop_first_ledger(settings, topic)
            (rep,) = await p.maintain([topic])
        rows = table_rows(settings, T0)
        ledgers = set(rows.column("ledger_id").to_pylist())
        assert rep.rows_deleted_with_retention is follow
        if follow:
            assert gone not in ledgers and rows.num_rows < sent(source, T0)["messages"]
        else:
            assert gone in ledgers and digest(rows) == sent(source, T0)

    @pytest.mark.timeout(240)
    async def test_a_ledger_deleted_before_projection_is_reported(self, data: Path) -> None:
        settings = configure(data, "commit_max_bytes = 100000\n")
        topic = TopicName.parse(T0)
        async with projector(settings) as p:
            await p.sync([topic], max_commits=1)
            table = open_catalog(settings).load_table(("public", "default", "topic-0"))
            at = last_position(table)
            assert at is not None
            gone = await _drop_first_ledger(settings, topic)
            assert gone == at.ledger_id  # the first ledger was only partly projected
            rep = by_topic(await p.sync([topic]))[T0]
        assert rep.lost == [f"{at.ledger_id}:{at.entry_id + 1}..end of ledger {at.ledger_id}"]
        assert rep.error is None
        rows = table_rows(settings, T0)
        assert distinct_positions(rows) == rows.num_rows


@pytest.mark.timeout(240)
async def test_json_fields_become_columns_and_can_be_added_later(data: Path) -> None:
    settings = configure(data, f'json_fields = {{"{T0}" = {{id = "long", region = "string", '
                               'amount = "double", flag = "boolean"}}\n'
                               "commit_max_bytes = 200000\n")
    topic = TopicName.parse(T0)
    async with projector(settings) as p:
        await p.sync([topic], max_commits=1)
    later = configure(data, f'json_fields = {{"{T0}" = {{id = "long", region = "string", '
                            'amount = "double", flag = "boolean", customer = "string"}}\n')
    async with projector(later) as p:
        await p.sync([topic])
    rows = table_rows(later, T0).to_pylist()
    first_commit = None
    for r in rows:
        doc = json.loads(r["payload"])
        assert (r["id"], r["region"], r["amount"], r["flag"]) == (
            doc["id"], doc["region"], float(doc["amount"]), None)
        if r["customer"] is None:
            first_commit = r
        else:
            assert r["customer"] == doc["customer"]
    assert first_commit is not None  # rows of the first commit predate the column


def _parquet_rows(settings: Settings) -> int:
    """What an engine reading the warehouse directory counts (no Iceberg metadata involved)."""
    import duckdb

    glob = str(settings.lakehouse.path.resolve() / "warehouse" / "**" / "*.parquet")
    con = duckdb.connect()
    try:
        n = con.execute(f"SELECT count(*) FROM read_parquet('{glob}')").fetchone()
    finally:
        con.close()
    assert n is not None
    return int(n[0])


@pytest.mark.timeout(240)
async def test_maintain_deletes_what_compaction_replaced_after_the_grace(
        data: Path, source: tuple[Path, dict[str, Any]]) -> None:
    """Issue 24 item 4: after ``maintain`` the warehouse holds each row once; within the reader
    grace the replaced files (and the snapshots naming them) stay for running readers."""
    lake = ("commit_max_bytes = 100000\ncompact_min_files = 4\n"
            "snapshot_max_age_minutes = 0.0001\n")
    topic = TopicName.parse(T0)
    messages = sent(source, T0)["messages"]
    held = configure(data, lake + "reader_grace_minutes = 30\n")
    async with projector(held) as p:
        await p.sync([topic])
        table = open_catalog(held).load_table(("public", "default", "topic-0"))
        old_snapshot = table.current_snapshot()
        assert old_snapshot is not None
        await asyncio.sleep(0.05)  # older than snapshot_max_age
        (done,) = await p.maintain([topic])
    assert done.files_rewritten >= 4 and done.files_deleted == 0
    assert _parquet_rows(held) == 2 * messages  # replaced files kept for readers ...
    table = open_catalog(held).load_table(("public", "default", "topic-0"))
    old = table.scan(snapshot_id=old_snapshot.snapshot_id).to_arrow()  # ... who can read them
    assert old.num_rows == messages

    now = configure(data, lake + "reader_grace_minutes = 0\n")
    async with projector(now) as p:
        (done,) = await p.maintain([topic])
    assert done.files_deleted > 0 and done.bytes_deleted > 0 and done.snapshots_expired > 0
    assert _parquet_rows(now) == messages == len(table_rows(now, T0))
    table = open_catalog(now).load_table(("public", "default", "topic-0"))
    assert [s.snapshot_id for s in table.metadata.snapshots] == [table.metadata.current_snapshot_id]
    warehouse = now.lakehouse.path.resolve() / "warehouse"
    on_disk = {p.as_posix() for p in warehouse.rglob("*") if p.is_file()}
    assert on_disk == referenced(table)  # nothing else is left: manifests, metadata too
    async with projector(now) as p:  # and projection goes on after it
        assert by_topic(await p.sync([topic]))[T0].rows == 0
