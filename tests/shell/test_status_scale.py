"""``offloadd status`` over many topics, on a real embedded store: the summary view (counts by
state, the worst lags, every failing topic), the namespace and topic filters, and the batched
reads giving the same answer as reading topic by topic."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from bench.status_scale import CONFIG, FAILING_EVERY, HALF_EVERY, synthetic_catalog
from offloadd import config, wiring
from offloadd.metadata import managed_ledger
from offloadd.metadata.embedded import EmbeddedMetadataStore
from offloadd.model import TopicName
from offloadd.model.cost import Prices
from offloadd.model.keys import managed_ledger_path
from offloadd.shell import status
from offloadd.shell.cli import main

pytestmark = pytest.mark.timeout(120)

TOPICS = 120


async def _build(tmp_path: Path) -> None:
    await synthetic_catalog(tmp_path / "metadata", TOPICS, namespaces=3)
    # one topic whose catalog is junk: an error, listed with the failing ones
    md = await EmbeddedMetadataStore.open(tmp_path / "metadata")
    try:
        bad = TopicName.parse("persistent://tenant-1/ns-2/t-5").managed_ledger
        await md.set(managed_ledger_path(bad), b"\xff junk")
    finally:
        await md.close()


@pytest.fixture
def deployment(tmp_path: Path) -> Path:
    asyncio.run(_build(tmp_path))  # the commands run their own event loop: none here
    cfg = tmp_path / "offloadd.toml"
    cfg.write_text(CONFIG.format(root=tmp_path))
    return cfg


def _run(cfg: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["status", "--config", str(cfg), *args])
    return code, capsys.readouterr().out


def test_the_summary_counts_states_and_lists_the_worst_lags_and_every_failure(
        deployment: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _run(deployment, capsys, "--json", "--summary")
    doc = json.loads(out)
    assert code == status.EXIT_FAILING
    assert "topics" not in doc  # the summary replaces the list
    s = doc["summary"]
    failing = {f"persistent://tenant-{i % 2}/ns-{i % 3}/t-{i}" for i in range(TOPICS)
               if i % FAILING_EVERY == 0}
    assert s["topics"] == TOPICS
    assert s["by_state"] == {"error": 1, "failing": len(failing), "ok": TOPICS - 1 - len(failing)}
    assert {f["topic"] for f in s["failing"]} == failing | {
        "persistent://tenant-1/ns-2/t-5"}
    assert all(f["error"] for f in s["failing"])
    # half-offloaded topics have lag; the top list is theirs, worst first, at most 20
    lagging = {f"persistent://tenant-{i % 2}/ns-{i % 3}/t-{i}" for i in range(TOPICS)
               if i % HALF_EVERY == 0}
    top = [x["topic"] for x in s["top_lag"]]
    assert len(top) == 18 and set(top) <= lagging
    assert [x["lag"]["bytes"] for x in s["top_lag"]] == sorted(
        (x["lag"]["bytes"] for x in s["top_lag"]), reverse=True)


def test_many_topics_in_text_show_the_summary_unless_all_are_asked_for(
        deployment: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, text = _run(deployment, capsys)
    assert f"{TOPICS} topic(s): 1 error, 3 failing, {TOPICS - 4} ok" in text
    assert "top 18 by lag:" in text
    assert "persistent://tenant-0/ns-0/t-0: FAILING, 3 failed attempt(s): boom 0" in text
    assert len(text.splitlines()) < 50
    _, full = _run(deployment, capsys, "--all-topics")
    assert len(full.splitlines()) > 2 * TOPICS


def test_the_namespace_and_topic_filters(deployment: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _run(deployment, capsys, "--json", "--namespace", "tenant-1/ns-1")
    names = [t["topic"] for t in json.loads(out)["topics"]]
    assert names == sorted(f"persistent://tenant-1/ns-1/t-{i}" for i in range(TOPICS)
                           if i % 2 == 1 and i % 3 == 1)
    assert code == status.EXIT_OK  # none of these fails
    _, out = _run(deployment, capsys, "--json", "--namespace", "tenant-0/*")
    assert {t["topic"].split("/")[2] for t in json.loads(out)["topics"]} == {"tenant-0"}
    code, out = _run(deployment, capsys, "--topic", "persistent://tenant-0/ns-0/t-0")
    assert code == status.EXIT_FAILING
    assert out.count("persistent://") == 1 and "FAILING" in out


def test_batched_reads_say_what_topic_by_topic_reads_say(deployment: Path) -> None:
    batched, one_by_one = asyncio.run(_both_ways(deployment))
    assert batched == one_by_one


async def _both_ways(cfg: Path) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    settings = config.load(cfg)
    md = await wiring.open_metadata(settings, read_only=True)
    src = wiring.connect_source(settings, md, read_only=True)
    try:
        names = [TopicName.from_managed_ledger(n)
                 for n in await managed_ledger.list_names(md)]
        batched = await status.topics_status(md, src, names, 1_000_000, Prices())
        one_by_one = [await status.topic_status(md, src, n, 1_000_000, Prices())
                      for n in names]
    finally:
        await src.source.close()
        await md.close()
    return batched, one_by_one


def test_json_over_many_topics_is_one_document_with_a_topic_a_line(
        deployment: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Above ``SUMMARY_OVER`` topics ``--json`` is still one JSON document (what scripts
    load), each topic a line of its own that parses alone once its comma is cut."""
    code, out = _run(deployment, capsys, "--json")
    doc = json.loads(out)
    assert code == status.EXIT_FAILING and len(doc["topics"]) == TOPICS
    lines = out.splitlines()
    start = lines.index('  "topics": [')
    one_a_line = [json.loads(line.rstrip(",")) for line in lines[start + 1:start + 1 + TOPICS]]
    assert one_a_line == doc["topics"]
    assert lines[start + 1 + TOPICS:] == ["  ]", "}"]
    # few topics: indented as before
    _, few = _run(deployment, capsys, "--json", "--namespace", "tenant-1/ns-1")
    assert '    "topic": "persistent://tenant-1/ns-1/' in few
