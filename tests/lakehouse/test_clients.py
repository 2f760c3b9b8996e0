"""Opening the tables from other tools exactly as docs/lakehouse.md says (issue 24 item 5): each
``<!-- doc-test: NAME -->`` recipe of the page runs as written, from the directory holding
``offloadd.toml``, and prints the table's row count; ``offloadd lakehouse tables --json`` gives
the catalog name, URI, warehouse and identifiers; the catalog name is the one the docs give.

One short standalone run (one topic) serves every test.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.lakehouse.support import run, settings_of, summary, table_rows, write_config

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
TOPIC = "persistent://public/default/topic-0"


def doc_recipes() -> dict[str, str]:
    text = (ROOT / "docs" / "lakehouse.md").read_text()
    return dict(re.findall(r"<!-- doc-test: (\w+) -->\n```sh\n(.*?)\n```", text, re.S))


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    cwd = tmp_path_factory.mktemp("lakehouse-clients")
    cfg = write_config(cwd)
    out = run(["standalone", "--json", "--config", str(cfg), "--duration", "4", "--topics", "1",
               "--rate", "300000"], cwd, timeout=240)
    messages = summary(out.stdout)["topics"][TOPIC]["sent"]["messages"]
    assert table_rows(settings_of(cfg), TOPIC).num_rows == messages > 0
    return cwd, messages


def test_tables_json_says_what_a_client_needs(lake: tuple[Path, int]) -> None:
    cwd, messages = lake
    info: dict[str, Any] = json.loads(
        run(["lakehouse", "tables", "--config", "offloadd.toml", "--json"], cwd).stdout)
    data = (cwd / "data" / "lakehouse").resolve()
    assert (info["catalog"], info["type"]) == ("offloadd", "sql")
    assert info["uri"] == f"sqlite:///{data / 'catalog.db'}" == info["properties"]["uri"]
    assert info["warehouse"] == (data / "warehouse").as_uri() == info["properties"]["warehouse"]
    (t,) = info["tables"]
    assert (t["table"], t["identifier"], t["topic"], t["rows"]) == (
        "public.default.topic-0", ["public", "default", "topic-0"], TOPIC, messages)
    assert t["metadata_location"].startswith(info["warehouse"])
    assert "The catalog is named **`offloadd`**" in (ROOT / "docs" / "lakehouse.md").read_text()


def test_another_catalog_name_sees_no_namespace(lake: tuple[Path, int]) -> None:
    """Why the docs insist on the name: pyiceberg's SQL catalog keys its rows by it."""
    from pyiceberg.catalog import load_catalog
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    cwd, _ = lake
    info = json.loads(run(["lakehouse", "tables", "--config", "offloadd.toml", "--json"],
                          cwd).stdout)
    with pytest.raises((NoSuchNamespaceError, NoSuchTableError)):
        load_catalog("default", **info["properties"]).load_table("public.default.topic-0")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", ["pyiceberg", "duckdb", "spark"])
def test_the_documented_recipe_opens_the_table(lake: tuple[Path, int], name: str) -> None:
    cwd, messages = lake
    recipes = doc_recipes()
    assert name in recipes, f"docs/lakehouse.md has no `<!-- doc-test: {name} -->` recipe"
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}  # the recipe sets it
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    p = subprocess.run(["bash", "-e", "-c", recipes[name]], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=540, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr[-4000:]
    assert p.stdout.strip().splitlines()[-1] == str(messages), p.stdout[-2000:]


def test_status_counts_the_warehouse_and_each_tables_lag(lake: tuple[Path, int]) -> None:
    """Issue 24 items 4 and 7: ``status`` shows the warehouse's files and bytes (and their
    monthly cost) and, per table, rows, files, last snapshot and lag."""
    cwd, messages = lake
    p = run(["status", "--config", "offloadd.toml", "--json"], cwd, check=False)
    st = json.loads(p.stdout)
    lake_st = st["lakehouse"]
    warehouse = (cwd / "data" / "lakehouse" / "warehouse").resolve()
    files = [f for f in warehouse.rglob("*") if f.is_file()]
    assert lake_st["warehouse"]["location"] == warehouse.as_uri()
    assert lake_st["warehouse"]["files"] == len(files) > 0
    assert lake_st["warehouse"]["bytes"] == sum(f.stat().st_size for f in files)
    assert lake_st["warehouse"]["monthly_cost"] >= 0
    (t,) = lake_st["tables"]
    assert (t["topic"], t["rows"], t["lag_entries"], t["lag_seconds"]) == (TOPIC, messages, 0, 0)
    assert t["data_files"] >= 1 and t["data_bytes"] > 0 and t["last_snapshot_ms"] > 0
    text = run(["status", "--config", "offloadd.toml"], cwd, check=False).stdout
    assert f"lakehouse warehouse {warehouse.as_uri()}: {len(files)} files" in text
    assert f"public.default.topic-0: {messages} rows" in text


@pytest.mark.parametrize("topic_level", [True, False])
async def test_metrics_report_each_tables_lag_rows_files_and_snapshot(
        lake: tuple[Path, int], topic_level: bool) -> None:
    """Issue 24 item 7: /metrics carries the tables' figures, per namespace when the topic-level
    switch is off."""
    from prometheus_client.parser import text_string_to_metric_families

    from offloadd import wiring
    from offloadd.lakehouse.follower import report_tables
    from offloadd.metrics import Metrics

    cwd, messages = lake
    settings = settings_of(cwd / "offloadd.toml")
    metrics = Metrics(topic_level=topic_level)
    md = await wiring.open_metadata(settings)
    try:
        assert await report_tables(settings, md, metrics) == 1
    finally:
        await md.close()
    text = metrics.exposition()[0].decode()
    samples = {s.name: s for f in text_string_to_metric_families(text) for s in f.samples
               if s.name.startswith("offloadd_lakehouse_")}
    assert samples["offloadd_lakehouse_rows"].value == messages
    assert samples["offloadd_lakehouse_lag_entries"].value == 0
    assert samples["offloadd_lakehouse_lag_seconds"].value == 0
    assert samples["offloadd_lakehouse_data_files"].value >= 1
    assert samples["offloadd_lakehouse_last_snapshot_timestamp_seconds"].value > 1.7e9
    from tests.ops.test_metric_coverage import dashboard_names, docs_names, rule_names

    named = {n for n in rule_names() | dashboard_names() | docs_names()
             if n.startswith("offloadd_lakehouse_")}
    # the five table series and the three read-committed ones (per namespace)
    assert len(named) == 8 and named <= set(samples)  # what the deploy files name is served
    labels = samples["offloadd_lakehouse_rows"].labels
    assert labels.get("namespace") == "public/default"
    assert ("topic" in labels) is topic_level


@pytest.mark.timeout(300)
def test_sync_and_maintain_show_progress_on_a_terminal_only(lake: tuple[Path, int]) -> None:
    """Issue 24 item 7: a progress line on stderr when it is a TTY; nothing extra otherwise,
    and stdout's JSON is the same either way."""
    import pty

    cwd, _ = lake
    for cmd in (["lakehouse", "sync"], ["lakehouse", "maintain"]):
        argv = [sys.executable, "-m", "offloadd", *cmd, "--json", "--config", "offloadd.toml",
                "--log-level", "ERROR"]
        plain = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=240,
                               stdin=subprocess.DEVNULL)
        assert plain.returncode == 0 and "\r" not in plain.stderr and plain.stderr == "", \
            plain.stderr
        leader, follower = pty.openpty()
        try:
            tty = subprocess.run(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=follower,
                                 text=True, timeout=240, stdin=subprocess.DEVNULL)
            os.close(follower)
            seen = b""
            while True:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # the pty is closed once the child is gone and it is drained
                    break
                if not chunk:
                    break
                seen += chunk
        finally:
            os.close(leader)
        assert tty.returncode == 0
        assert json.loads(tty.stdout) is not None
        text = seen.decode()
        assert f"{' '.join(cmd)}: 1/1 {TOPIC}" in text and "1 topic done" in text, text
