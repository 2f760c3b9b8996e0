"""ZooKeeper faults under two ``offloadd run`` daemons offloading history through a throttled tier,
on a 3-node ensemble, one after the other in one run:

1. session expiry: the daemon owning most topics is frozen (SIGSTOP) past its session timeout;
   the other takes its topics over at higher epochs; the frozen one is resumed with its old view
   (open segments, a fence of the old epoch) and must not commit any of it;
2. leader loss: the ensemble's leader is killed mid-offload;
3. a full outage: every server is killed for several seconds (30 s in the long mode), then
   restarted.

Afterwards every entry written is committed exactly once (what was buffered but not committed when
a fault hit was redone, not dropped), the epochs only grew, and verify and gc are clean.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cluster._procs import Rig
from tests.fixtures.zookeeper import ZooKeeperEnsemble
from tests.reliability.conftest import Figures

pytestmark = pytest.mark.integration

SESSION_S = 2.0
# lines a daemon writes when a stale view is refused: its tasks stop without committing
STALE = ("lost ownership", "ownership lost; stopping now, committing nothing",
         "no longer ours and stop without committing")


def count(rig: Rig, name: str, needles: tuple[str, ...]) -> int:
    text = rig.log(name).read_text(errors="replace")
    return sum(text.count(n) for n in needles)


def zk_faults(tmp_path: Path, ensemble: ZooKeeperEnsemble, figures: Figures, *,
              outage_s: float, history: int, flow: int, section: str) -> None:
    rig = Rig(tmp_path, ensemble.hosts, session_timeout=SESSION_S, flow=flow)
    daemons = ["d1", "d2"]
    try:
        hist = rig.produce("history", "--topics", "4", "--bytes", str(history))
        assert hist.wait(60) == 0, rig.tail("history")
        written = rig.written()
        for d in daemons:
            rig.start_daemon(d)
        rig.wait(lambda: len(rig.owners()) == 4 and set(rig.owners().values()) == set(daemons),
                 30, "both daemons to own topics")
        rig.wait(lambda: sum(rig.committed().values()) > 0, 30, "offload to be under way")

        # 1. session expiry with a takeover, then the stale daemon resumes
        owners = rig.owners()
        frozen = max(daemons, key=lambda d: list(owners.values()).count(d))
        other = next(d for d in daemons if d != frozen)
        theirs = [t for t, o in owners.items() if o == frozen]
        epochs = rig.epochs()
        rig.signal(frozen, signal.SIGSTOP)
        try:
            rig.wait(lambda: all(rig.owners().get(t) == other for t in theirs), SESSION_S + 15,
                     f"{other} to take over the frozen {frozen}'s topics")
            taken = rig.epochs()
            assert all(taken[t] > epochs[t] for t in theirs), (epochs, taken)
        finally:
            rig.signal(frozen, signal.SIGCONT)
        rig.wait(lambda: "metadata session lost" in rig.log(frozen).read_text(), 20,
                 f"{frozen} to notice its session expired")
        committed_1 = sum(rig.committed().values())

        # 2. leader loss
        leader = ensemble.leader()
        ensemble.kill(leader)
        assert ensemble.leader() is not leader
        rig.wait(lambda: sum(rig.committed().values()) > committed_1, 40,
                 "commits under the new leader")
        leader.start()
        leader.wait_serving()
        committed_2 = sum(rig.committed().values())
        assert committed_2 < sum(written.values()), "the history ran out before the outage"

        # 3. a full outage
        for s in ensemble.servers:
            s.kill()
        t0 = time.monotonic()
        time.sleep(outage_s)
        for s in ensemble.servers:
            s.start()
        for s in ensemble.servers:
            s.wait_serving()
        down_s = time.monotonic() - t0
        ensemble.leader()
        rig.wait(lambda: sum(rig.committed().values()) > committed_2, 60,
                 "commits after the outage")
        for d in daemons:  # both survived all of it
            assert rig.procs[d].poll() is None, rig.tail(d)

        # lift the throttle (SIGHUP reloads it) so the rest drains at once
        for d in daemons:
            cfg = rig.config(d)
            cfg.write_text(cfg.read_text().replace(f"flow_permits_per_second = {flow}",
                                                   "flow_permits_per_second = 0"))
            rig.signal(d, signal.SIGHUP)
        rig.wait(rig.drained, 120, "every written entry to be committed")
        stale = sum(count(rig, d, STALE) for d in daemons)
        redone = sum(count(rig, d, ("redoing assigned segment",)) for d in daemons)
        for d in daemons:
            assert rig.stop(d) == 0, rig.tail(d)
        final_epochs = rig.epochs()
        gc = rig.run("verifier", ["gc", "--json", "--grace", "0"])
        after = rig.verify()
        final = rig.written()
        entries = sum(t["entries"] for t in after["topics"])
        figures.set(section, faults_injected=3, faults_survived=3 if after["ok"] else 0,
                    session_expiry_topics_taken_over=len(theirs),
                    leader_killed=1, full_outage_seconds=round(down_s, 1),
                    stale_views_refused=stale, assigned_segments_redone=redone,
                    entries_written=sum(final.values()), entries_checked=entries,
                    entries_lost=sum(len(t["gaps"]) for t in after["topics"])
                    + max(sum(final.values()) - entries, 0),
                    entries_duplicated=sum(t["duplicates"] for t in after["topics"]),
                    checksum_mismatches=sum(t["checksum_mismatches"] for t in after["topics"]),
                    orphans_removed_by_gc=len(json.loads(gc.stdout)["orphans_removed"]),
                    orphans_left=len(after["orphans"]))

        assert gc.returncode == 0, gc.stderr
        assert after["ok"], after
        assert final == written  # nothing was written meanwhile: all of it was history
        for t in after["topics"]:
            name = t["topic"].rsplit("/", 1)[1]
            assert t["gaps"] == [] and t["duplicates"] == 0 and t["errors"] == []
            assert t["entries"] == final[name] > 0
            assert t["source_checked"] == t["entries"]
            assert final_epochs[name] >= epochs[name]
        # the frozen daemon's tasks ended without committing from their stale view
        assert count(rig, frozen, STALE) >= 1, rig.tail(frozen, 60)
    finally:
        rig.close()


@pytest.mark.timeout(240)
def test_expiry_leader_loss_and_an_outage_neither_lose_nor_duplicate_entries(
        tmp_path: Path, zk_ensemble: Callable[[int], ZooKeeperEnsemble],
        figures: Figures) -> None:
    zk_faults(tmp_path, zk_ensemble(3), figures, outage_s=6, history=3_000_000, flow=100_000,
              section="zookeeper_faults")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_thirty_second_zookeeper_outage_loses_nothing(
        tmp_path: Path, zk_ensemble: Callable[[int], ZooKeeperEnsemble],
        figures: Figures) -> None:
    zk_faults(tmp_path, zk_ensemble(3), figures, outage_s=30, history=6_000_000, flow=100_000,
              section="zookeeper_faults_long")

