"""bench/run_all.py's summary table: a benchmark rerun alone (``--only``) or stored from a saved
run (``--from NAME=FILE``) replaces its own rows and nothing else; the other benchmarks' stored
results stay; rows put in the table before any result was stored are kept, not dropped."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import run_all

BK_DOC: dict[str, Any] = {
    "benchmark": "bookkeeper_read", "loadavg_before": [1.5, 1, 1], "loadavg_after": [2.25, 1, 1],
    "results": [
        {"entry_bytes": 1024, "ensemble": 3, "wq": 2, "latency_ms": 0.2,
         "modes": {"v2": {"cpu_s_per_gib": 9.5, "us_per_entry": 9.1, "mib_s": 250.0}}},
        {"entry_bytes": 65536, "ensemble": 2, "wq": 2, "latency_ms": 0.2,  # not the goal's
         "modes": {"v2": {"cpu_s_per_gib": 1.0, "us_per_entry": 60.0, "mib_s": 900.0}}},
    ],
}

OLD_TABLE = """# Benchmarks

<!-- summary:begin -->

Last full run: 2026-11-22 00:03 UTC · x86_64 · commit `226b3b6` · 404 s for the whole suite.

| benchmark | goal | figure | met |
|---|---|---|---|
| P3 writer append p99 with offload ÷ without | ≤ 1.10 | 7.405 | **no** |
| P10 lakehouse table lag p99, 1 MB/s, 3 topics | ≤ 30 s | 4.7 s | yes |
| BookKeeper source read ÷ raw socket read, 1024 B entries | (figure) | 0.03× | — |

<!-- summary:end -->

Text below the table.
"""


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "benchmarks.md").write_text(OLD_TABLE)
    results = tmp_path / "bench" / "results"
    results.mkdir(parents=True)
    stored = {"meta": {"date": "2026-11-22 00:03 UTC", "machine": "x86_64", "commit": "226b3b6",
                       "seconds": "404"},
              "results": {"P3": {"seconds": 28.0, "error": None, "result": {"p99_ratio": 7.405}},
                          "BK": {"seconds": 5.0, "error": None, "result": {"results": []}}}}
    (results / "latest.json").write_text(json.dumps(stored))
    monkeypatch.setattr(run_all, "ROOT", tmp_path)
    monkeypatch.setattr(run_all, "DOC", tmp_path / "docs" / "benchmarks.md")
    monkeypatch.setattr(run_all, "commit", lambda: "abc1234")
    return tmp_path


def _main(monkeypatch: pytest.MonkeyPatch, *args: str) -> None:
    monkeypatch.setattr(sys, "argv", ["run_all.py", *args])
    run_all.main()


def test_a_saved_run_replaces_its_rows_and_keeps_the_rest(
        tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    saved = tree / "bk.json"
    saved.write_text("log line before the document\n" + json.dumps(BK_DOC))
    _main(monkeypatch, "--from", f"BK={saved}", "--update")
    text = (tree / "docs" / "benchmarks.md").read_text()
    rows = run_all.table_rows()
    labels = [r[0] for r in rows]
    # the stored P3 result renders as before; P10, never stored, keeps its row
    assert ("P3 writer append p99 with offload ÷ without", "≤ 1.10", "7.405", False) in rows
    assert ("P10 lakehouse table lag p99, 1 MB/s, 3 topics", "≤ 30 s", "4.7 s", True) in rows
    # BK's rows come from the saved run (only the 3/2 layout is the goal's), the stale one is gone
    assert ("BookKeeper source, 1 KiB entries, bookies +0.2 ms: CPU-s/GiB", "≤ 8",
            "9.50 (9.1 µs/entry) (load 1.5→2.2)", False) in rows
    assert ("BookKeeper source, 1 KiB entries, bookies +0.2 ms: MiB/s", "≥ 100",
            "250 (load 1.5→2.2)", True) in rows
    assert not any("raw socket" in label or "64 KiB" in label for label in labels)
    # the header still names the full run, and the rerun with its day and commit
    assert "Last full run: 2026-11-22 00:03 UTC" in text
    assert "BK on " in text and "commit `abc1234`" in text
    assert text.endswith("Text below the table.\n")
    stored = json.loads((tree / "bench" / "results" / "latest.json").read_text())
    assert stored["meta"]["commit"] == "226b3b6"
    assert stored["results"]["P3"]["result"] == {"p99_ratio": 7.405}
    assert stored["results"]["BK"]["result"] == BK_DOC
    assert stored["results"]["BK"]["from"] == str(saved)


def test_without_update_the_table_is_left_alone(
        tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    saved = tree / "bk.json"
    saved.write_text(json.dumps(BK_DOC))
    _main(monkeypatch, "--from", f"BK={saved}")
    assert (tree / "docs" / "benchmarks.md").read_text() == OLD_TABLE
    stored = json.loads((tree / "bench" / "results" / "latest.json").read_text())
    assert set(stored["results"]) == {"P3", "BK"}


def test_render_and_table_rows_agree(tree: Path) -> None:
    rows: list[run_all.Row] = [("a ÷ b", "≥ 0.9", "1.2 (load 3.0)", True),
                               ("c", "≤ 2", "3", False), ("d", "(figure)", "4", None)]
    run_all.write_summary(run_all.render(rows, {"date": "d", "machine": "m", "commit": "c",
                                                "seconds": "1"}))
    assert run_all.table_rows() == rows


@pytest.mark.parametrize(("args", "message"), [
    (("--only", "P42"), "--only P42: no such benchmark"),
    (("--from", "BK"), "expected NAME=FILE"),
    (("--from", "XX=f.json"), "expected NAME=FILE, NAME one of"),
    (("--from", "BK=/nonexistent/bk.json"), "cannot read a benchmark's JSON document"),
])
def test_bad_arguments_say_what_is_wrong(tree: Path, monkeypatch: pytest.MonkeyPatch,
                                         args: tuple[str, ...], message: str) -> None:
    with pytest.raises(SystemExit, match=message):
        _main(monkeypatch, *args)
    assert (tree / "docs" / "benchmarks.md").read_text() == OLD_TABLE


def test_topic_scaling_rows_judge_the_largest_finished_run_and_name_an_aborted_one() -> None:
    def run(n: int, cpu: float, rss: float, scrape_bytes: int) -> dict[str, Any]:
        scrape = {"bytes": scrape_bytes, "series": n * 10}
        return {"store": "embedded", "topics": n, "max_block_size_bytes": "default",
                "idle_open": {"cpu_pct_of_core": cpu, "rss_mib": rss, "scrape": scrape},
                "idle_committed": {"cpu_pct_of_core": cpu, "rss_mib": rss / 2,
                                   "scrape": scrape},
                "commit_open": {"commits_per_s_daemon": 600.0},
                "stop": {"seconds": 4.0, "killed": False}, "status_text": {"seconds": 2.0},
                "metric_modes": [{"topic_level": "true", "skipped": "refused"},
                                 {"topic_level": "false",
                                  "scrape": {"bytes": 90_000, "series": 900}}]}

    doc = {"loadavg": [1.0], "runs": [
        run(10, 5.0, 300, 5_000), run(10_000, 0.5, 340, 9_000_000),
        {"store": "embedded", "topics": 20_000, "aborted": "RSS over the bound: killed"},
    ]}
    rows = run_all._scale(doc)
    assert rows[0] == ("Topics (embedded, 20,000 topics)", "runs to the end",
                       "aborted: RSS over the bound: killed", False)
    by_what = {r[0].split(": ", 1)[1]: r for r in rows[1:]}
    assert all("10,000 topics" in r[0] for r in rows[1:])
    assert by_what["idle CPU % of a core"][2:] == ("0.5 (load 1.0)", True)
    assert by_what["RSS MiB, open segments or not"][1:] == ("≤ 345 (150 + 20 KiB/topic)", "340",
                                                            True)
    assert by_what["/metrics scrape, topic_level = false"][2:] == ("90 KB, 900 series", True)
    assert by_what["commits/s, offload-now --wait"][3] is True
    assert by_what["SIGTERM to exit, every segment open"][3] is True
    assert by_what["offloadd status wall time"][3] is True
