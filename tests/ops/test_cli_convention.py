"""One command-line convention (issue 23 item 12): every command prints text by default and
one JSON document with ``--json``; every command's help shows examples and takes
``--log-level``; sizes take units on the command line and in the TOML file.

The commands run for real, as subprocesses, on one embedded store and filesystem tier: a
``standalone`` run writes and offloads, ``produce`` writes a history that ``backfill`` uploads
on Spark, then ``compact`` and ``lakehouse sync|maintain`` work on what is there.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import pytest

from offloadd.shell import cli
from tests.ops.support import offloadd

pytestmark = pytest.mark.integration

HISTORY = "persistent://public/default/history"
# sizes with units in the file itself (item 12): the commands below load it
CONFIG = """
[source]
rollover_bytes = "200KB"
[offload]
max_size_per_segment_mbytes = "100KiB"
max_segment_rollover_time_minutes = 0.01
max_block_size_bytes = "64KiB"
deletion_lag_ms = 0
flow_permits_per_second = "50MiB"
[compact]
target_mbytes = 1
[retention]
orphan_grace_s = 36000
[metrics]
bind = "127.0.0.1:0"
[lakehouse]
enabled = true
"""


def _not_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return True
    return False


def _json(p: Any) -> Any:
    assert p.stdout.strip(), p.stderr
    return json.loads(p.stdout)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("convention")
    (root / "c.toml").write_text(CONFIG)
    return root


def run(site: Path, *args: str, timeout: float = 240, check: bool = True) -> Any:
    return offloadd([*args, "--config", "c.toml"], site, timeout=timeout, check=check)


@pytest.mark.timeout(400)
def test_standalone_prints_a_summary_and_json_with_the_flag(site: Path) -> None:
    p = run(site, "standalone", "--duration", "3", "--rate", "200KB", "--entry-size", "1KiB",
            "--topics", "2")
    text = p.stdout
    assert text.startswith("standalone: wrote "), text
    assert "persistent://public/default/topic-0: " in text and "drained: yes" in text, text
    assert _not_json(text)
    doc = _json(run(site, "standalone", "--json", "--duration", "2", "--rate", "200KB",
                    "--topics", "2"))
    assert doc["drained"] is True and doc["entries_written"] > 0, doc
    assert set(doc["topics"]) == {"persistent://public/default/topic-0",
                                  "persistent://public/default/topic-1"}


@pytest.mark.timeout(300)
def test_produce_prints_a_summary_and_json_with_the_flag(site: Path) -> None:
    text = run(site, "produce", "--topic", HISTORY, "--bytes", "300KB", "--entry-size",
               "1KiB").stdout
    assert re.fullmatch(rf"produce: wrote \d+ entries, 29\d\.\d KiB to {HISTORY} in "
                        r"\d+\.\d s \(\d+\.\d [KMG]?i?B/s\)\n", text), text
    assert _not_json(text)
    doc = _json(run(site, "produce", "--json", "--topic", HISTORY, "--bytes", "100KiB",
                    "--entry-size", "1KiB", "--rate", "10MB"))
    assert doc["entries"] >= 100 and doc["bytes"] >= 100 * 1024, doc  # whole batches
    assert doc["topics"] == [HISTORY]


@pytest.mark.timeout(600)
def test_backfill_prints_a_summary_and_json_with_the_flag(site: Path) -> None:
    spark = ("--master", "local[1]", "--spark-conf", "spark.ui.enabled=false")
    doc = _json(run(site, "backfill", "--json", "--topic", HISTORY, *spark, timeout=500))
    assert doc["ok"] and doc["offloaded_segments"] > 0 and doc["topic"] == HISTORY, doc
    # again: everything is there, nothing to upload (and no JVM started)
    text = run(site, "backfill", "--topic", HISTORY, *spark).stdout
    assert text.startswith(f"backfill {HISTORY}: OK: 0 segment(s) offloaded"), text
    assert f"{doc['offloaded_segments']} already offloaded" in text, text
    assert _not_json(text)


@pytest.mark.timeout(300)
def test_compact_prints_a_summary_and_json_with_the_flag(site: Path) -> None:
    doc = _json(run(site, "compact", "--json", "--target-bytes", "1MiB"))
    assert doc["ok"] is True, doc
    topics = {r["topic"]: r for r in doc["topics"]}
    assert "persistent://public/default/topic-0" in topics, doc
    assert any(r["merged"] for r in doc["topics"]), doc  # 100 KiB segments under 1 MiB
    text = run(site, "compact").stdout
    assert text.endswith("compact: OK\n"), text
    assert "persistent://public/default/topic-0: " in text and " segment(s), " in text, text
    assert _not_json(text)


@pytest.mark.timeout(300)
def test_lakehouse_sync_and_maintain_print_a_summary_and_json_with_the_flag(site: Path) -> None:
    doc = _json(run(site, "lakehouse", "sync", "--json"))
    assert {r["topic"] for r in doc["topics"]} >= {"persistent://public/default/topic-0"}, doc
    assert not any(r["error"] for r in doc["topics"]), doc
    text = run(site, "lakehouse", "sync").stdout
    assert "persistent://public/default/topic-0: " in text and "projected up to" in text, text
    assert _not_json(text)
    doc = _json(run(site, "lakehouse", "maintain", "--json"))
    assert isinstance(doc, list) and doc and "files_rewritten" in doc[0], doc
    text = run(site, "lakehouse", "maintain").stdout
    assert "small file(s) rewritten into" in text and "snapshot(s) expired" in text, text
    assert _not_json(text)


@pytest.mark.timeout(120)
def test_read_prints_json_lines_with_the_flag(site: Path) -> None:
    lines = run(site, "read", "--topic", "persistent://public/default/topic-0", "--count", "3",
                "--json").stdout.splitlines()
    assert len(lines) == 3
    first = json.loads(lines[0])
    assert set(first) == {"position", "payload"} and ":" in first["position"], first


def _leaves() -> dict[str, argparse.ArgumentParser]:
    """Every command a user runs, ``lakehouse sync`` and ``config check`` included."""
    out: dict[str, argparse.ArgumentParser] = {}

    def walk(prefix: str, parser: argparse.ArgumentParser) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            out[prefix.strip()] = parser
        for sub in subs:
            for name, sp in sub.choices.items():
                walk(f"{prefix} {name}", sp)

    walk("", cli.build_parser())
    return out


def test_every_command_shows_examples_and_takes_log_level_and_json() -> None:
    leaves = _leaves()
    assert {"lakehouse sync", "lakehouse maintain", "config check", "compact"} <= set(leaves)
    for name, sp in leaves.items():
        text = sp.format_help()
        assert "examples:\n  offloadd " + name in text, (name, text)
        options = {o for a in sp._actions for o in a.option_strings}
        assert "--log-level" in options, name
        # run is the daemon (logs only); the reference is Markdown
        if name not in ("run", "config reference"):
            assert "--json" in options, name


@pytest.mark.parametrize(("argv", "message"), [
    (["produce", "--topic", HISTORY, "--bytes", "12 parsecs"],
     "argument --bytes: '12 parsecs' is not a size; a size is an integer number of bytes, or "
     "a number with a unit: \"64MiB\", \"2MB\""),
    (["standalone", "--rate", "2MBps"],
     "argument --rate: '2MBps' is not a rate: bytes per second as a number, or a size"),
    (["compact", "--target-bytes", "0MiB"], "argument --target-bytes: '0MiB' is not a "
     "positive size"),
    (["produce", "--topic", HISTORY, "--bytes", "1", "--entry-size", "1GiB"],
     "argument --entry-size: 1073741824 is more than the 67,108,864 bytes per entry allowed"),
])
def test_a_bad_size_on_the_command_line_names_the_flag_and_the_forms(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_sizes_on_the_command_line() -> None:
    p = cli.build_parser()
    a = p.parse_args(["produce", "--topic", HISTORY, "--bytes", "1GiB", "--rate", "2MB",
                      "--entry-size", "4KiB"])
    assert (a.bytes, a.rate, a.entry_size) == (2**30, 2_000_000.0, 4096)
    a = p.parse_args(["standalone", "--rate", "1500000.5"])  # a plain number still works
    assert a.rate == 1500000.5


def test_the_standalone_summary_of_many_topics_gives_totals_and_says_why_it_failed() -> None:
    from offloadd.shell.summaries import compact_text, standalone_text

    topics = {f"persistent://t/n/x{i}": {"ledgers": 1, "segments": 0, "entries_offloaded": 0,
                                         "last_offloaded": None} for i in range(25)}
    text = standalone_text({"seconds": 1.0, "entries_written": 50, "bytes_written": 5000,
                            "topics": topics, "drained": False, "problem": "nothing offloaded"})
    assert "(25 topics: --json lists each)" in text and "x0" not in text
    assert "drained: NO" in text and text.endswith("problem: nothing offloaded")
    assert compact_text([{"topic": "t", "error": "owned by 'd'"}], False) == (
        "FAILED t: owned by 'd'\ncompact: FAILED")
