"""Pulsar's namespace offload policies in sidecar mode, on the fake Pulsar cluster (real
ZooKeeper): the nodes written as the broker writes them (``/admin/policies/<tenant>/<ns>``,
Jackson JSON), watched (one read per namespace and per change, no polling), applied by the
daemon without a restart, shown with their sources by ``status --topic``; a malformed node is a
warning naming it, never a crash."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from offloadd import config
from offloadd.commit.ownership import Ownership
from offloadd.ledger.bookkeeper.policies import NamespacePolicies
from offloadd.metadata import managed_ledger
from offloadd.metadata.pulsar_policies import PulsarOffloadPolicy
from offloadd.model import TopicName, catalog
from offloadd.shell.runtime import Runtime
from offloadd.shell.status import collect, render_text
from tests.bookkeeper.conftest import Cluster
from tests.bookkeeper.test_e2e import CONFIG, batch, offloaded_to_the_end
from tests.fixtures.pulsar_policies import namespace_policies, offload_policies
from tests.fixtures.waiting import until as wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

NS_NODE = "/admin/policies/public/default"
TOPIC = TopicName.parse("persistent://public/default/held")
GiB = 1 << 30


async def until(pred: Callable[[], Any], what: str, timeout: float = 15.0) -> None:
    await wait_until(pred, what, timeout)


def count_policy_reads(src: Any) -> list[str]:
    """Every ZooKeeper call the source's session makes on a policies node."""
    store = src.zk._store
    calls: list[str] = []
    real = store.call

    async def counted(start: Any, what: str, path: str) -> Any:
        if path.startswith("/admin/policies"):
            calls.append(f"{what} {path}")
        return await real(start, what, path)

    store.call = counted
    return calls


async def test_watched_policy_follows_changes_and_survives_bad_nodes(
        cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    zk = cluster.pulsar.zk
    await zk.create(NS_NODE, namespace_policies(offload_policies(
        threshold_bytes=GiB, read_priority="BOOKKEEPER_FIRST")))
    src = cluster.source()
    changed: list[str] = []
    watcher = NamespacePolicies(src.pulsar_zk, on_change=changed.append)
    try:
        await src.pulsar_zk()
        reads = count_policy_reads(src)
        await asyncio.gather(*(watcher.prepare("public/default") for _ in range(5)))
        await watcher.prepare("public/absent")  # no node: nothing set, watched for creation
        state = watcher.get("public/default")
        assert state is not None and state.path == NS_NODE
        assert state.policy == PulsarOffloadPolicy(GiB, None, None, "bookkeeper-first")
        assert watcher.get("public/absent") is not None
        assert watcher.get("public/absent").policy is None  # type: ignore[union-attr]
        armed = len(reads)
        assert armed <= 3, reads  # one read per namespace (plus the absent one's exists)
        for _ in range(1000):  # the daemon asks on every roll decision: no I/O
            watcher.get("public/default")
        await asyncio.sleep(1.0)
        assert len(reads) == armed, reads  # no polling

        # set-offload-threshold of an older broker: the old field, offload_policies dropped
        await zk.set(NS_NODE, namespace_policies(offload_threshold=0))
        await until(lambda: watcher.get("public/default").policy  # type: ignore[union-attr]
                    == PulsarOffloadPolicy(threshold_bytes=0), "the change")
        assert changed == ["public/default"]
        assert len(reads) <= armed + 2, reads  # one read per change

        with caplog.at_level(logging.WARNING):
            await zk.set(NS_NODE, b"{\"offload_threshold\": \"lots\"")
            await until(lambda: watcher.get(  # type: ignore[union-attr]
                "public/default").error is not None, "the malformed node")
        state = watcher.get("public/default")
        assert state is not None and state.policy == PulsarOffloadPolicy(threshold_bytes=0)
        assert NS_NODE in caplog.text and "malformed" in caplog.text
        assert "keeping its last good policy" in caplog.text

        await zk.delete(NS_NODE)
        await until(lambda: watcher.get(  # type: ignore[union-attr]
            "public/default").policy is None, "the removal")
    finally:
        await watcher.close()
        await src.close()


@pytest.mark.timeout(120)
async def test_daemon_applies_the_namespace_threshold_live_and_status_names_sources(
        cluster: Cluster, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    p = cluster.pulsar
    rnd = random.Random(3)
    for _ in range(2):
        await p.append(TOPIC, batch(rnd, 60))
        await p.roll(TOPIC)
    await p.append(TOPIC, batch(rnd, 20))
    await p.close_ledger(TOPIC)
    # the broker holds the newest GiB in BookKeeper: all of this topic
    await p.zk.create(NS_NODE, namespace_policies(offload_policies(
        threshold_bytes=GiB, deletion_lag_ms=60_000, read_priority="TIERED_STORAGE_FIRST")))
    cfg = tmp_path / "offloadd.toml"
    cfg.write_text(CONFIG.format(offloadd_url=cluster.offloadd_url,
                                 pulsar_url=cluster.pulsar_url, tier=tmp_path / "tier",
                                 tmp=tmp_path)
                   + '[namespaces."public/default"]\ndeletion_lag_ms = 5000\n')
    settings = config.load(cfg)
    rt = await Runtime.open(settings, ownership=Ownership())
    daemon = asyncio.ensure_future(rt.daemon.run(install_signals=False))
    try:
        await until(lambda: TOPIC in rt.daemon.topics, "the topic to start", 30)
        assert rt.daemon.policies.policy(TOPIC).thresholds.bytes == GiB
        await asyncio.sleep(3.0)  # rollover is 1.2 s: without the threshold it would be done
        info, _ = await managed_ledger.load(cluster.ours, TOPIC.managed_ledger)
        assert not [s for s in catalog.segments(info) if s.complete]

        st = await collect(settings, [TOPIC])
        text = render_text(st)
        assert f"threshold 1 GiB (pulsar namespace policy {NS_NODE})" in text, text
        assert "age threshold none (default)" in text, text
        assert ('deletion lag 5 s (offloadd.toml [namespaces."public/default"])' in text), text
        assert (f"read priority tiered-storage-first (pulsar namespace policy {NS_NODE}; "
                "not used by offloadd)") in text, text
        assert st["topics"][0]["policy"]["threshold_bytes"] == {
            "value": GiB, "source": f"pulsar namespace policy {NS_NODE}"}

        # pulsar-admin namespaces set-offload-policies ... -oat 0: offload every closed ledger
        await p.zk.set(NS_NODE, namespace_policies(offload_policies(threshold_bytes=0)))
        async with asyncio.timeout(60):
            while not await offloaded_to_the_end(cluster, TOPIC):
                await asyncio.sleep(0.2)
        assert rt.daemon.policies.policy(TOPIC).thresholds.bytes == 0

        with caplog.at_level(logging.WARNING):
            await p.zk.set(NS_NODE, b"not json")
            await asyncio.sleep(0.5)
            st = await collect(settings, [TOPIC])
        assert not daemon.done()  # a malformed node crashes nothing
        text = render_text(st)
        assert f"policy warning: {NS_NODE}" in text and "JSON expected" in text, text
        assert "threshold none (default)" in text, text  # status: nothing read from it
        assert NS_NODE in caplog.text  # the daemon's warning names the node
    finally:
        rt.daemon.request_stop()
        await asyncio.gather(daemon, return_exceptions=True)
        await rt.close()


async def test_pulsar_policies_off(cluster: Cluster, tmp_path: Path,
                                   caplog: pytest.LogCaptureFixture) -> None:
    await cluster.pulsar.append(TOPIC, [b"x"])
    await cluster.pulsar.zk.create(NS_NODE, namespace_policies(offload_policies(
        threshold_bytes=GiB)))
    cfg = tmp_path / "offloadd.toml"
    cfg.write_text(CONFIG.format(offloadd_url=cluster.offloadd_url,
                                 pulsar_url=cluster.pulsar_url, tier=tmp_path / "tier",
                                 tmp=tmp_path).replace(
        'kind = "bookkeeper"', 'kind = "bookkeeper"\npulsar_policies = false'))
    settings = config.load(cfg)
    rt = await Runtime.open(settings, ownership=Ownership())
    try:
        assert rt.daemon.pulsar_policies is None
        assert rt.daemon.policies.policy(TOPIC).thresholds.bytes is None
        on = settings.model_copy(update={"source": settings.source.model_copy(
            update={"pulsar_policies": True})})
        with caplog.at_level(logging.WARNING):
            rt.daemon.reload(on)  # the watcher is made at start: say so, do not pretend
        assert "source.pulsar_policies: takes effect after a restart" in caplog.text
    finally:
        await rt.close()


async def test_a_separate_configuration_store(cluster: Cluster, tmp_path: Path) -> None:
    """Pulsar's configuration store on another ZooKeeper (here: another chroot of the test's):
    ``[source] pulsar_configuration_zk`` is where the namespace policies are read."""
    from offloadd.metadata.zookeeper import ZooKeeperMetadataStore

    global_url = cluster.pulsar_url.replace("/pulsar-", "/pulsar-global-")
    writer = await ZooKeeperMetadataStore.open(global_url, session_timeout_s=4.0,
                                               connect_timeout_s=10.0)
    await writer.create(NS_NODE, namespace_policies(offload_policies(threshold_seconds=3600)))
    await cluster.pulsar.append(TOPIC, [b"x"])
    cfg = tmp_path / "offloadd.toml"
    cfg.write_text(CONFIG.format(offloadd_url=cluster.offloadd_url,
                                 pulsar_url=cluster.pulsar_url, tier=tmp_path / "tier",
                                 tmp=tmp_path).replace(
        'kind = "bookkeeper"',
        f'kind = "bookkeeper"\npulsar_configuration_zk = "{global_url}"'))
    settings = config.load(cfg)
    rt = await Runtime.open(settings, ownership=Ownership())
    daemon = asyncio.ensure_future(rt.daemon.run(install_signals=False))
    try:
        await until(lambda: TOPIC in rt.daemon.topics, "the topic to start", 30)
        assert rt.daemon.policies.policy(TOPIC).thresholds.seconds == 3600
        text = render_text(await collect(settings, [TOPIC]))
        assert f"age threshold 1 h (pulsar namespace policy {NS_NODE})" in text, text
    finally:
        rt.daemon.request_stop()
        await asyncio.gather(daemon, return_exceptions=True)
        await rt.close()
        await writer.close()


async def test_a_watch_that_cannot_be_armed_is_tried_again(
        cluster: Cluster, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from offloadd.errors import Retriable
    from offloadd.ledger.bookkeeper import policies

    monkeypatch.setattr(policies, "RETRY_S", 0.1)
    await cluster.pulsar.zk.create(NS_NODE, namespace_policies(offload_threshold=42))
    src = cluster.source()
    attempts = 0

    async def flaky() -> Any:
        nonlocal attempts
        attempts += 1
        if attempts < 3:
            raise Retriable("ZooKeeper connection lost")
        return await src.pulsar_zk()

    watcher = NamespacePolicies(flaky)
    try:
        with caplog.at_level(logging.WARNING):
            await watcher.prepare("public/default")  # never raises
        assert watcher.get("public/default") is None
        assert "public/default" in caplog.text and "trying again" in caplog.text
        await until(lambda: watcher.get("public/default") is not None, "the retry")
        assert watcher.get("public/default").policy == PulsarOffloadPolicy(  # type: ignore
            threshold_bytes=42)
        assert attempts == 3
    finally:
        await watcher.close()
        await src.close()
