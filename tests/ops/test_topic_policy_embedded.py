"""Pulsar topic policies over the embedded store: ``offloadd topic-policy`` writes them as a
broker does (a ``PulsarEvent`` in the namespace's ``__change_events``, its schema in the
store's registry), a daemon follows them live and applies them to their topic only, over
``[offload]``; ``status --topic --json`` names the source; a removed policy falls back; the
system topic itself is never offloaded. Real processes for the commands, a real Runtime."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from offloadd import config as config_mod
from offloadd.commit.ownership import Ownership
from offloadd.metadata import managed_ledger
from offloadd.model import TopicName, catalog
from offloadd.shell.runtime import Runtime
from tests.fixtures.waiting import until as wait_until
from tests.ops.support import offloadd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

HOT = TopicName.parse("persistent://public/default/hot")
HELD = TopicName.parse("persistent://public/default/held")
EVENTS = TopicName.parse("persistent://public/default/__change_events")
LOCAL = f"pulsar topic policy (local) {EVENTS}"
GLOBAL = f"pulsar topic policy (global) {EVENTS}"
GiB = 1 << 30


async def until(pred: Callable[[], Any], what: str, timeout: float = 60.0) -> None:
    await wait_until(pred, what, timeout)


async def cli(root: Path, *args: str) -> Any:
    return await asyncio.to_thread(offloadd, [*args, "--config", "c.toml"], root, timeout=120)


async def policies(root: Path, *topics: TopicName) -> dict[str, Any]:
    args = [a for t in topics for a in ("--topic", str(t))]
    p = await asyncio.to_thread(offloadd, ["status", *args, "--json", "--config", "c.toml"],
                                root, timeout=120, check=False)
    assert p.returncode in (0, 1), p.stderr
    return {t["topic"]: t["policy"] for t in json.loads(p.stdout)["topics"]}


async def complete_segments(rt: Runtime, topic: TopicName) -> int:
    info, _ = await managed_ledger.load(rt.metadata, topic.managed_ledger)
    return len([s for s in catalog.segments(info) if s.complete])


async def test_topic_policy_on_the_embedded_store(tmp_path: Path) -> None:
    (tmp_path / "c.toml").write_text(f"""
[metadata]
url = "embedded:{tmp_path}/metadata"
[source]
path = "{tmp_path}/ledgers"
rollover_bytes = "20KB"
[blobstore]
driver = "filesystem"
path = "{tmp_path}/tier"
[offload]
threshold_bytes = "1GiB"
max_size_per_segment_mbytes = 0.05
max_segment_rollover_time_minutes = 0.02
max_block_size_bytes = "16KiB"
[metrics]
enabled = false
""")
    for topic in (HOT, HELD):
        await cli(tmp_path, "produce", "--topic", str(topic), "--bytes", "100KB", "--json")
    # set-offload-policies hot -oat 0 (local), and a global one the local one overrides
    out = json.loads((await cli(tmp_path, "topic-policy", "--topic", str(HOT), "--threshold",
                                "0", "--json")).stdout)
    assert out == {"topic": str(HOT), "scope": "local", "action": "set",
                   "system_topic": str(EVENTS), "schema_version": 0,
                   "position": out["position"], "offload_policies": {"threshold_bytes": 0}}
    await cli(tmp_path, "topic-policy", "--topic", str(HOT), "--global", "--threshold",
              "10MiB", "--read-priority", "bookkeeper-first")

    settings = config_mod.load(str(tmp_path / "c.toml"))
    rt = await Runtime.open(settings, ownership=Ownership())
    running = asyncio.create_task(rt.daemon.run(install_signals=False))
    try:
        await until(lambda: HOT in rt.daemon.topics and HELD in rt.daemon.topics,
                    "the topics to start")
        assert rt.daemon.policies.policy(HOT).thresholds.bytes == 0
        assert rt.daemon.policies.policy(HELD).thresholds.bytes == GiB
        async with asyncio.timeout(120):
            while not await complete_segments(rt, HOT):
                await asyncio.sleep(0.2)
        assert EVENTS not in rt.daemon.topics  # Pulsar's own: never offloaded
        listed = await asyncio.to_thread(offloadd, ["status", "--json", "--config", "c.toml"],
                                         tmp_path, timeout=120, check=False)
        assert {t["topic"] for t in json.loads(listed.stdout)["topics"]} == {str(HOT),
                                                                             str(HELD)}
        st = await policies(tmp_path, HOT, HELD)
        assert st[str(HOT)]["threshold_bytes"] == {"value": 0, "source": LOCAL}
        assert st[str(HELD)]["threshold_bytes"] == {"value": GiB,
                                                    "source": "offloadd.toml [offload]"}

        # removed while the daemon runs: the global one applies, then (removed) [offload]
        await cli(tmp_path, "topic-policy", "--topic", str(HOT), "--remove")
        await until(lambda: rt.daemon.policies.policy(HOT).thresholds.bytes == 10 << 20,
                    "the global policy")
        assert rt.daemon.effective(HOT).sources["threshold_bytes"] == GLOBAL
        assert rt.daemon.effective(HOT).read_priority.value == "bookkeeper-first"
        await cli(tmp_path, "topic-policy", "--topic", str(HOT), "--global", "--remove")
        await until(lambda: rt.daemon.policies.policy(HOT).thresholds.bytes == GiB, "[offload]")
        st = await policies(tmp_path, HOT)
        assert st[str(HOT)]["threshold_bytes"]["source"] == "offloadd.toml [offload]"
        assert await complete_segments(rt, HELD) == 0
        assert not running.done()
    finally:
        rt.daemon.request_stop()
        await asyncio.gather(running, return_exceptions=True)
        await rt.close()


async def test_standalone_drains_beside_a_system_topic(tmp_path: Path) -> None:
    """``standalone`` waits until every topic is offloaded: not for ``__change_events``, which
    is never offloaded (it used to wait out its deadline and exit 1)."""
    (tmp_path / "c.toml").write_text(f"""
[metadata]
url = "embedded:{tmp_path}/metadata"
[source]
path = "{tmp_path}/ledgers"
[blobstore]
driver = "filesystem"
path = "{tmp_path}/tier"
[metrics]
enabled = false
""")
    topic = "persistent://public/default/topic-0"
    await cli(tmp_path, "topic-policy", "--topic", topic, "--threshold-seconds", "-1")
    p = await asyncio.to_thread(offloadd, ["standalone", "--duration", "1", "--topics", "1",
                                           "--json", "--config", "c.toml"], tmp_path,
                                timeout=200, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout)["drained"] is True
