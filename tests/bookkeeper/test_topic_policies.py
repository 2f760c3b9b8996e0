"""Pulsar's topic-level offload policies in sidecar mode, on the fake Pulsar cluster (real
ZooKeeper, fake bookies): written as the broker writes them — ``PulsarEvent`` messages in the
namespace's ``__change_events`` topic (a managed ledger on the bookies), Avro under the schema
registered at ``/schemas/public/default/__change_events`` (its entry in a ledger of its own) —
followed live by the daemon, applied to their topic only (local before global, over the
namespace's policy), shown with their source by ``status --topic --json``; a removed policy
falls back to the namespace's. The system topic itself is never offloaded nor mirrored."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from offloadd import config
from offloadd.commit.ownership import Ownership
from offloadd.errors import NotFound
from offloadd.format.schema_storage import IndexEntry, SchemaEntry, SchemaLocator
from offloadd.ledger.bookkeeper.layout import LedgerMetadata, LedgerStateBK, ledger_path
from offloadd.metadata import managed_ledger
from offloadd.metadata.pulsar_policies import PulsarOffloadPolicy
from offloadd.model import TopicName, catalog
from offloadd.shell.runtime import Runtime
from tests.bookkeeper.cluster import FakePulsar
from tests.bookkeeper.conftest import Cluster
from tests.bookkeeper.test_e2e import CONFIG, batch, offloaded_to_the_end
from tests.fixtures.bookie_wire import encode_entry, encode_ledger_metadata
from tests.fixtures.pulsar_events import event_entry, schema_info
from tests.fixtures.pulsar_policies import namespace_policies, offload_policies
from tests.fixtures.waiting import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

NS_NODE = "/admin/policies/public/default"
EVENTS = TopicName.parse("persistent://public/default/__change_events")
HOT = TopicName.parse("persistent://public/default/hot")
HELD = TopicName.parse("persistent://public/default/held")
GiB = 1 << 30
LOCAL = f"pulsar topic policy (local) {EVENTS}"
GLOBAL = f"pulsar topic policy (global) {EVENTS}"
NAMESPACE = f"pulsar namespace policy {NS_NODE}"




async def write_ledger(p: FakePulsar, payloads: list[bytes]) -> int:
    """A closed ledger of no topic, as the broker's schema storage writes one (one entry)."""
    ledger_id = p.next_ledger_id
    p.next_ledger_id += 1
    members = [b.address for b in p.bookies[:p.ensemble_size]]
    meta = LedgerMetadata(ledger_id, len(members), p.write_quorum, p.ack_quorum,
                          LedgerStateBK.CLOSED, len(payloads) - 1,
                          sum(map(len, payloads)), int(p.digest_type), p.password,
                          int(time.time() * 1000), ((0, tuple(members)),))
    length = 0
    for e, payload in enumerate(payloads):
        length += len(payload)
        body = encode_entry(p.digest, ledger_id, e, e - 1, length, payload)
        for b in meta.bookies_for(e):
            assert await p._add(b, ledger_id, e, body)
    await p.zk.create(ledger_path(ledger_id, p.ledgers_root), encode_ledger_metadata(meta))
    return ledger_id


async def register_events_schema(p: FakePulsar, ns: str) -> None:
    """The broker's schema registry entry for ``ns``'s ``__change_events`` (version 0)."""
    info = schema_info(ns)
    first = IndexEntry(0, -1, -1, info.hash())
    ledger_id = await write_ledger(p, [SchemaEntry(info.encode(), (first,)).encode()])
    entry = IndexEntry(0, ledger_id, 0, info.hash())
    await p.zk.create(f"/schemas/{ns}/__change_events",
                      SchemaLocator(entry, (entry,)).encode())


def status_json(cfg: Path, *topics: TopicName) -> dict[str, Any]:
    args = [a for t in topics for a in ("--topic", str(t))]
    done = subprocess.run([sys.executable, "-m", "offloadd", "status", "--config", str(cfg),
                           *args, "--json"], capture_output=True, text=True, timeout=90)
    assert done.returncode in (0, 1), done.stderr
    return {t["topic"]: t["policy"] for t in json.loads(done.stdout)["topics"]}


async def test_a_topic_policy_applies_to_its_topic_only_and_falls_back_when_removed(
        cluster: Cluster, tmp_path: Path) -> None:
    p = cluster.pulsar
    rnd = random.Random(11)
    for topic in (HOT, HELD):
        for _ in range(2):
            await p.append(topic, batch(rnd, 40))
            await p.roll(topic)
        await p.append(topic, batch(rnd, 10))
        await p.close_ledger(topic)
    # the namespace keeps the newest GiB in BookKeeper: all of both topics
    await p.zk.create(NS_NODE, namespace_policies(offload_policies(threshold_bytes=GiB)))
    await register_events_schema(p, "public/default")
    # pulsar-admin topics set-offload-policies hot -oat 0 (local) and a global one, which the
    # local one overrides
    await p.append(EVENTS, [event_entry(HOT, PulsarOffloadPolicy(threshold_bytes=0), seq=0),
                            event_entry(HOT, PulsarOffloadPolicy(threshold_bytes=12345,
                                                                 read_priority="bookkeeper-first"),
                                        is_global=True, seq=1)])
    await p.roll(EVENTS)  # the follower goes on across the system topic's ledgers

    cfg = tmp_path / "offloadd.toml"
    cfg.write_text(CONFIG.format(offloadd_url=cluster.offloadd_url,
                                 pulsar_url=cluster.pulsar_url, tier=tmp_path / "tier",
                                 tmp=tmp_path))
    settings = config.load(cfg)
    rt = await Runtime.open(settings, ownership=Ownership())
    daemon = asyncio.ensure_future(rt.daemon.run(install_signals=False))
    try:
        await until(lambda: HOT in rt.daemon.topics and HELD in rt.daemon.topics,
                    "the topics to start")
        assert rt.daemon.policies.policy(HOT).thresholds.bytes == 0
        assert rt.daemon.policies.policy(HELD).thresholds.bytes == GiB
        async with asyncio.timeout(60):
            while not await offloaded_to_the_end(cluster, HOT):
                await asyncio.sleep(0.2)
        info, _ = await managed_ledger.load(cluster.ours, HELD.managed_ledger)
        assert not [s for s in catalog.segments(info) if s.complete]  # held by its namespace
        # the system topic is Pulsar's own: not offloaded, not even mirrored
        assert EVENTS not in rt.daemon.topics
        with pytest.raises(NotFound):
            await managed_ledger.load(cluster.ours, EVENTS.managed_ledger)

        st = await asyncio.to_thread(status_json, cfg, HOT, HELD)
        assert st[str(HOT)]["threshold_bytes"] == {"value": 0, "source": LOCAL}
        # the local policy sets no read priority: per field, the global one's is not used
        # either (Pulsar takes the local object whole), so the default remains
        assert st[str(HOT)]["read_priority"]["source"] == "default"
        assert st[str(HELD)]["threshold_bytes"] == {"value": GiB, "source": NAMESPACE}

        # a global policy for the held topic, written while the daemon runs: BookKeeper
        # confirms the newest entry of an open ledger to readers only with the next add or
        # the close, but ack-quorum bookies hold it, so it is followed now (docs/sidecar.md)
        await p.append(EVENTS, [event_entry(HELD, PulsarOffloadPolicy(threshold_bytes=0),
                                            is_global=True, seq=2)])
        async with asyncio.timeout(90):
            while not await offloaded_to_the_end(cluster, HELD):
                await asyncio.sleep(0.2)
        st = await asyncio.to_thread(status_json, cfg, HELD)
        assert st[str(HELD)]["threshold_bytes"] == {"value": 0, "source": GLOBAL}

        # remove-offload-policies hot (local): the global one applies; removed too: the
        # namespace's
        await p.append(EVENTS, [event_entry(HOT, None, removed=True, seq=3)])
        await until(lambda: rt.daemon.policies.policy(HOT).thresholds.bytes == 12345,
                    "the global one", 60)
        assert rt.daemon.effective(HOT).read_priority.value == "bookkeeper-first"
        assert rt.daemon.effective(HOT).sources["threshold_bytes"] == GLOBAL
        await p.append(EVENTS, [event_entry(HOT, None, removed=True, is_global=True, seq=4)])
        await until(lambda: rt.daemon.policies.policy(HOT).thresholds.bytes == GiB,
                    "the namespace's", 60)
        st = await asyncio.to_thread(status_json, cfg, HOT)
        assert st[str(HOT)]["threshold_bytes"] == {"value": GiB, "source": NAMESPACE}
        # the ledger's close (the broker's rollover) changes nothing
        await p.close_ledger(EVENTS)
        await asyncio.sleep(0.5)
        assert rt.daemon.policies.policy(HOT).thresholds.bytes == GiB
        assert not daemon.done()
    finally:
        rt.daemon.request_stop()
        await asyncio.gather(daemon, return_exceptions=True)
        await rt.close()


async def test_the_entry_past_the_lac_counts_only_with_ack_quorum_copies(
        cluster: Cluster) -> None:
    """An entry on fewer than ``ack_quorum`` bookies may be dropped by BookKeeper's recovery
    (the broker never acknowledged it): it is not applied; one on ``ack_quorum`` bookies is."""
    from offloadd.ledger.bookkeeper.change_tail import durable_entry

    p = cluster.pulsar
    first = event_entry(HOT, PulsarOffloadPolicy(threshold_bytes=1))
    await p.append(EVENTS, [first])
    ledger_id = p.open[EVENTS].meta.ledger_id
    src = cluster.source()
    try:
        (desc,) = await src.ledgers(EVENTS)
        assert desc.last_entry_id == -1  # past the LAC: not readable
        assert await durable_entry(src, EVENTS, ledger_id, 0) == first
        # entry 1 reached one bookie of its write set only (a broker dying mid-add)
        torn = event_entry(HOT, PulsarOffloadPolicy(threshold_bytes=2), seq=1)
        led = p.open[EVENTS]
        body = encode_entry(p.digest, ledger_id, 1, 0, led.length + len(torn), torn)
        assert await p._add(led.meta.bookies_for(1)[0], ledger_id, 1, body)
        assert await durable_entry(src, EVENTS, ledger_id, 1) is None
        assert await durable_entry(src, EVENTS, ledger_id + 7, 0) is None  # no such ledger
    finally:
        await src.close()
