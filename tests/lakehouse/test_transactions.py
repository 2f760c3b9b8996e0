"""Read-committed tables: markers and aborted transactions' messages never become rows, a
transaction's messages wait for its commit marker, and that holds end to end (``offloadd produce
--transactions`` → ``offloadd run`` → table → ``offloadd query``) and across a ``kill -9`` that
splits a transaction (its messages before the kill, its commit marker after)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from offloadd import wiring
from offloadd._proto import pulsar_api_pb2 as pb
from offloadd.format.message import decode_entry, encode_entry
from offloadd.lakehouse.query import run_query
from offloadd.lakehouse.tables import last_position, open_catalog
from offloadd.lakehouse.transactions import ReadCommitted, hidden_totals
from offloadd.ledger.local import LocalLedgerWriter
from offloadd.model import Position, TopicName
from tests.lakehouse.support import (
    OFFLOADD,
    digest,
    distinct_positions,
    run,
    settings_of,
    table_rows,
    write_config,
)

T0 = "persistent://public/default/topic-0"


def msg(payload: bytes, seq: int, publish: int = 1_000,
        txn: tuple[int, int] | None = None) -> bytes:
    md = pb.MessageMetadata(producer_name="p", sequence_id=seq, publish_time=publish)
    if txn is not None:
        md.txnid_most_bits, md.txnid_least_bits = txn
    return encode_entry(md, payload)


def marker(kind: int, txn: tuple[int, int] | None = None, publish: int = 1_000) -> bytes:
    md = pb.MessageMetadata(producer_name="pulsar.txn.marker", sequence_id=(1 << 64) - 1,
                            publish_time=publish, marker_type=kind)
    if txn is not None:
        md.txnid_most_bits, md.txnid_least_bits = txn
    return encode_entry(md, b"")


def released(rc: ReadCommitted) -> list[tuple[int, str | None]]:
    return [(r.position.entry_id, r.hidden) for r in rc.take()]


def feed(rc: ReadCommitted, entries: list[bytes], first: int = 0) -> None:
    for i, raw in enumerate(entries, first):
        rc.add(Position(1, i), raw, decode_entry(raw, "test"))


# ---- the filter ---------------------------------------------------------------------------------
def test_transactions_are_held_until_their_marker_and_aborted_ones_hidden() -> None:
    a, b = (1, 1), (1, 2)
    rc = ReadCommitted(timeout_ms=60_000)
    feed(rc, [msg(b"m0", 0), msg(b"a1", 1, txn=a), msg(b"m2", 2), msg(b"b3", 3, txn=b),
              marker(12)])
    # nothing after the first entry of the undecided transaction a is released
    assert released(rc) == [(0, None)] and rc.held == 4
    feed(rc, [marker(22, b), msg(b"a6", 6, txn=a)], first=5)
    assert released(rc) == [] and rc.held == 6  # b decided, but a still holds the log
    feed(rc, [marker(21, a), msg(b"b8", 8, txn=b), msg(b"m9", 9)], first=7)
    assert released(rc) == [
        (1, None), (2, None), (3, "aborted"), (4, "replicated-subscription-snapshot-marker"),
        (5, "txn-abort-marker"), (6, None), (7, "txn-commit-marker"),
        (8, "aborted"),  # a message of b after its abort: dropped, as the broker does
        (9, None)]
    c = rc.counts
    assert (c.markers, c.aborted_messages, c.transactions_committed,
            c.transactions_aborted) == (3, 2, 1, 1)


def test_an_undecided_transaction_times_out_in_log_time() -> None:
    t = (3, 9)
    rc = ReadCommitted(timeout_ms=10_000)
    feed(rc, [msg(b"t0", 0, publish=1_000, txn=t), msg(b"m1", 1, publish=5_000),
              msg(b"m2", 2, publish=10_999)])
    assert released(rc) == [] and rc.held == 3
    feed(rc, [msg(b"m3", 3, publish=11_000)], first=3)  # 10 s of log time after t's first
    assert released(rc) == [(0, "timed-out"), (1, None), (2, None), (3, None)]
    feed(rc, [marker(21, t, publish=12_000)], first=4)  # too late: stays dropped, counted
    assert released(rc) == [(4, "txn-commit-marker")]
    assert (rc.counts.timed_out_messages, rc.counts.transactions_timed_out,
            rc.counts.late_commits) == (1, 1, 1)


# ---- end to end ----------------------------------------------------------------------------------
class Daemon:
    """``offloadd run`` with the lakehouse follower on."""

    def __init__(self, cwd: Path, cfg: Path) -> None:
        self.log = open(cwd / "run.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen([*OFFLOADD, "run", "--config", str(cfg)], cwd=cwd,
                                     stdout=subprocess.DEVNULL, stderr=self.log,
                                     stdin=subprocess.DEVNULL)

    def kill9(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self.log.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


def table_state(cfg: Path, topic: str) -> tuple[Position | None, Any]:
    """The table's last position and rows (None, None before the table exists)."""
    settings = settings_of(cfg)
    if not (Path(settings.lakehouse.path) / "catalog.db").exists():
        return None, None
    t = TopicName.parse(topic)
    try:
        table = open_catalog(settings, create=False).load_table(
            (t.tenant, t.namespace, t.local))
    except Exception:  # not created yet
        return None, None
    return last_position(table), table_rows(settings, topic)


def wait_until(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(1.0)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.integration
@pytest.mark.timeout(400)
def test_produce_transactions_daemon_query_sees_only_committed(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    out = run(["produce", "--json", "--config", str(cfg), "--topic", T0, "--bytes", "3000000",
               "--transactions", "--max-batch", "4", "--compression", "none,zstd"], tmp_path)
    produced = json.loads(out.stdout.strip().splitlines()[-1])
    sent = produced["sent"][T0]
    visible = produced["visible_messages"]
    assert visible == sent["visible_messages"] < sent["messages"], produced
    assert sent["aborted_transactions"] > 0
    daemon = Daemon(tmp_path, cfg)
    try:
        def done() -> bool:  # every message and every marker (the last entries) projected
            assert daemon.proc.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
            _, rows = table_state(cfg, T0)
            if rows is None or rows.num_rows < visible:
                return False
            t = TopicName.parse(T0)
            table = open_catalog(settings_of(cfg), create=False).load_table(
                (t.tenant, t.namespace, t.local))
            return bool(hidden_totals(table).markers >= sent["transactions"])
        wait_until(done, 300, f"{visible} rows and every marker in the table")
    finally:
        daemon.stop()
    n = run(["query", "--config", str(cfg), "--json", "SELECT count(*) AS n FROM topic_0"],
            tmp_path)
    assert json.loads(n.stdout) == [{"n": visible}]
    _, rows = table_state(cfg, T0)
    assert distinct_positions(rows) == rows.num_rows
    assert digest(rows) == {"messages": visible, "sha1": sent["sha1"]}
    assert "pulsar.txn.marker" not in set(rows.column("producer_name").to_pylist())
    assert rows.column("txn_id").null_count < rows.num_rows  # committed txn messages say so
    settings = settings_of(cfg)
    t = TopicName.parse(T0)
    table = open_catalog(settings, create=False).load_table((t.tenant, t.namespace, t.local))
    totals = hidden_totals(table)
    assert (totals.aborted_messages, totals.transactions_aborted,
            totals.transactions_committed + totals.transactions_aborted, totals.markers) == (
        sent["aborted_messages"], sent["aborted_transactions"], sent["transactions"],
        sent["transactions"])

    # the audit option: the same tier projected again, into a second catalog, hidden rows kept
    env = {**os.environ, "OFFLOADD_LAKEHOUSE__KEEP_HIDDEN": "true",
           "OFFLOADD_LAKEHOUSE__PATH": str(tmp_path / "data" / "audit")}
    report = subprocess.run([*OFFLOADD, "lakehouse", "sync", "--json", "--config", str(cfg)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                            check=True)
    assert "read_committed" in report.stdout
    audit = run_query(open_catalog(settings_of(cfg).model_copy(update={
        "lakehouse": settings.lakehouse.model_copy(
            update={"path": tmp_path / "data" / "audit"})}), create=False),
        "SELECT hidden, count(*) FROM topic_0 GROUP BY 1 ORDER BY 1 NULLS FIRST")
    assert audit.rows == [(None, visible), ("aborted", sent["aborted_messages"]),
                          ("txn-abort-marker", sent["aborted_transactions"]),
                          ("txn-commit-marker",
                           sent["transactions"] - sent["aborted_transactions"])]


def append(cfg: Path, topic: str, entries: list[bytes]) -> None:
    """Write ``entries`` to ``topic`` with the embedded writer, then close its ledger."""
    settings = settings_of(cfg)

    async def go() -> None:
        md = await wiring.open_metadata(settings)
        try:
            writer = LocalLedgerWriter(settings.source.path, md,
                                       wiring.rollover_policy(settings))
            try:
                await writer.append(TopicName.parse(topic), entries)
            finally:
                await writer.close()
        finally:
            await md.close()

    asyncio.run(go())


@pytest.mark.integration
@pytest.mark.timeout(400)
def test_a_transaction_split_by_kill9_is_neither_lost_nor_duplicated(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    t = (5, 77)
    before = ([msg(b"before-%d" % i, i) for i in range(5)]
              + [msg(b"txn-%d" % i, 100 + i, txn=t) for i in range(3)]
              + [msg(b"during-%d" % i, 10 + i) for i in range(2)])
    append(cfg, T0, before)
    daemon = Daemon(tmp_path, cfg)
    try:
        # the projection commits what precedes the transaction, then holds the rest
        def holding() -> bool:
            assert daemon.proc.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
            last, rows = table_state(cfg, T0)
            return last is not None and rows is not None and rows.num_rows == 5
        wait_until(holding, 240, "the five rows before the transaction")
        time.sleep(8)  # more passes: still held, never written
        last, rows = table_state(cfg, T0)
        assert rows.num_rows == 5 and last is not None and last.entry_id == 4, (last, rows)
    finally:
        daemon.kill9()
    after = [marker(21, t), msg(b"after-0", 20), marker(12), msg(b"after-1", 21)]
    append(cfg, T0, after)
    daemon = Daemon(tmp_path, cfg)
    try:
        def caught_up() -> bool:
            assert daemon.proc.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
            _, rows = table_state(cfg, T0)
            return rows is not None and rows.num_rows >= 12
        wait_until(caught_up, 240, "the rows after the commit marker")
        time.sleep(8)  # a duplicate would come with a later pass
    finally:
        daemon.stop()
    _, rows = table_state(cfg, T0)
    want = ([b"before-%d" % i for i in range(5)] + [b"txn-%d" % i for i in range(3)]
            + [b"during-0", b"during-1", b"after-0", b"after-1"])
    assert rows.column("payload").to_pylist() == want
    assert distinct_positions(rows) == rows.num_rows
    assert rows.column("txn_id").to_pylist()[5:8] == ["(5,77)"] * 3
