"""Several ``offloadd run`` daemons sharing a cluster's topics through a real ZooKeeper, tailing
one embedded ledger store that a separate ``offloadd produce`` keeps writing::

    produce ──▶ ledgers/ ◀── d1 d2 d3 ──▶ tier/
                 (ZooKeeper: managed ledgers, members, owners, epochs)

A daemon killed with SIGKILL, or stopped past its session timeout and resumed, must never cost a
segment: its topics move to the survivors at higher epochs, a stale commit fails its epoch
check, and ``offloadd verify`` finds every written entry exactly once.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from offloadd.commit.cluster import rendezvous_owner
from offloadd.model import TopicName
from tests.cluster._procs import Rig

pytestmark = pytest.mark.integration

SESSION_S = 3.0


def expected_owners(topics: list[str], members: list[str]) -> dict[str, str]:
    out = {}
    for t in topics:
        owner = rendezvous_owner(TopicName.parse(f"persistent://public/default/{t}"), members)
        assert owner is not None
        out[t] = owner
    return out


def settle(rig: Rig, members: list[str], topics: int) -> dict[str, str]:
    """Wait until every topic is owned by the member the partitioner names; the owners."""
    rig.wait(lambda: len(rig.topics()) == topics and rig.members() == members, 30,
             f"{topics} topics and members {members}")
    want = expected_owners(rig.topics(), members)
    rig.wait(lambda: rig.owners() == want, 30, f"the partition over {members} to settle")
    return want


def finish(rig: Rig, producer: str, daemons: list[str]) -> dict[str, Any]:
    """Let the writer end, wait until every entry is committed, stop the daemons, verify."""
    assert rig.wait_exit(producer, 90) == 0, rig.tail(producer)
    rig.wait(rig.drained, 60, "every written entry to be committed")
    for d in daemons:
        assert rig.stop(d) == 0, rig.tail(d)
    rep = rig.verify()
    assert rep["ok"], rep
    assert rep["orphans"] == []
    written = rig.written()
    for t in rep["topics"]:
        assert t["gaps"] == [] and t["duplicates"] == 0 and t["errors"] == []
        assert t["entries"] == written[t["topic"].rsplit("/", 1)[1]] > 0
    return rep


@pytest.mark.timeout(180)
def test_three_daemons_share_twelve_topics_and_take_over_from_a_killed_one(
        tmp_path: Path, zk_server: str) -> None:
    rig = Rig(tmp_path, zk_server, session_timeout=SESSION_S)
    daemons = ["d1", "d2", "d3"]
    try:
        rig.produce("producer", "--topics", "12", "--duration", "22", "--rate", "800000")
        for d in daemons:
            rig.start_daemon(d)
        owners = settle(rig, daemons, 12)
        assert set(owners.values()) == set(daemons), owners  # every member has a share
        assert rig.epochs().keys() == owners.keys()
        rig.wait(lambda: all(n > 0 for n in rig.committed().values()), 30,
                 "a committed segment on every topic")

        victim = max(daemons, key=lambda d: list(owners.values()).count(d))
        survivors = [d for d in daemons if d != victim]
        theirs = [t for t, o in owners.items() if o == victim]
        epochs, before = rig.epochs(), rig.committed()
        rig.signal(victim, signal.SIGKILL)
        rig.wait(lambda: all(rig.owners().get(t) in survivors for t in theirs),
                 SESSION_S + 5, f"the survivors to take over {victim}'s topics")
        assert rig.owners() == expected_owners(rig.topics(), survivors)
        after = rig.epochs()
        assert all(after[t] > epochs[t] for t in theirs)
        rig.wait(lambda: all(rig.committed()[t] > before[t] for t in theirs), 40,
                 f"offload to go on for {victim}'s topics")
        finish(rig, "producer", survivors)
    finally:
        rig.close()


@pytest.mark.timeout(180)
def test_a_stalled_daemon_is_fenced_after_takeover_and_its_late_work_is_discarded(
        tmp_path: Path, zk_server: str) -> None:
    # a throttled tier keeps each daemon's uploads in flight, so the stall catches open segments
    rig = Rig(tmp_path, zk_server, session_timeout=SESSION_S, flow=300_000)
    daemons = ["d1", "d2"]
    try:
        rig.produce("producer", "--topics", "6", "--duration", "20", "--rate", "400000")
        for d in daemons:
            rig.start_daemon(d)
        owners = settle(rig, daemons, 6)
        rig.wait(lambda: all(n > 0 for n in rig.committed().values()), 30,
                 "a committed segment on every topic")
        zombie = max(daemons, key=lambda d: list(owners.values()).count(d))
        other = next(d for d in daemons if d != zombie)
        theirs = [t for t, o in owners.items() if o == zombie]
        epochs = rig.epochs()

        rig.signal(zombie, signal.SIGSTOP)
        try:
            rig.wait(lambda: all(rig.owners().get(t) == other for t in theirs),
                     SESSION_S + 5, f"{other} to take over the stalled {zombie}'s topics")
            taken = rig.epochs()
            assert all(taken[t] > epochs[t] for t in theirs)
            before = rig.committed()
            rig.wait(lambda: all(rig.committed()[t] > before[t] for t in theirs), 30,
                     f"{other} to commit on the taken-over topics")
        finally:
            rig.signal(zombie, signal.SIGCONT)

        # The resumed zombie learns its session is gone, stops those tasks without committing,
        # rejoins, and gets its share back by hand-off at yet higher epochs.
        rig.wait(lambda: "metadata session lost" in rig.log(zombie).read_text(), 15,
                 f"{zombie} to notice its lost session")
        settle(rig, daemons, 6)
        back = rig.epochs()
        assert all(back[t] > taken[t] for t in theirs)
        finish(rig, "producer", daemons)
    finally:
        rig.close()
