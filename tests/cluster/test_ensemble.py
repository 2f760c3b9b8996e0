"""Offload rides out the loss of the ZooKeeper leader: a 3-node ensemble on loopback, two
daemons offloading history through a throttled tier, the leader killed mid-offload."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cluster._procs import Rig
from tests.fixtures.zookeeper import ZooKeeperEnsemble

pytestmark = pytest.mark.integration


@pytest.mark.timeout(180)
def test_offload_continues_when_the_zookeeper_leader_is_killed(
        tmp_path: Path, zk_ensemble: Callable[[int], ZooKeeperEnsemble]) -> None:
    ensemble = zk_ensemble(3)
    # sessions outlive an election; the throttle keeps the offload going for several seconds
    rig = Rig(tmp_path, ensemble.hosts, session_timeout=8.0, flow=400_000)
    daemons = ["d1", "d2"]
    try:
        history = rig.produce("history", "--topics", "4", "--bytes", "4000000")
        assert history.wait(60) == 0, rig.tail("history")
        written = rig.written()
        for d in daemons:
            rig.start_daemon(d)
        rig.wait(lambda: 0 < sum(rig.committed().values()) < sum(written.values()) // 2, 40,
                 "offload to be under way")
        leader = ensemble.leader()
        ensemble.kill(leader)
        at_kill = sum(rig.committed().values())
        new_leader = ensemble.leader()
        assert new_leader is not leader
        rig.wait(lambda: sum(rig.committed().values()) > at_kill, 40,
                 "commits under the new leader")
        # new entries after the election are offloaded too
        live = rig.produce("producer", "--topics", "4", "--duration", "3", "--rate", "300000")
        assert live.wait(60) == 0, rig.tail("producer")
        rig.wait(rig.drained, 60, "every written entry to be committed")
        for d in daemons:
            assert rig.stop(d) == 0, rig.tail(d)
        rep = rig.verify()
        assert rep["ok"], rep
        assert rep["orphans"] == []
        final = rig.written()
        for t in rep["topics"]:
            assert t["gaps"] == [] and t["duplicates"] == 0
            assert t["entries"] == final[t["topic"].rsplit("/", 1)[1]]
    finally:
        rig.close()
