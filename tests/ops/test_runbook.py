"""docs/runbook.md has a section for every alert the shipped rules define, each rule points at
its section, the section gives at least three commands, and every offloadd command in it is
one the CLI accepts."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped]  # PyYAML arrives with moto[server]

from offloadd.shell import cli

ROOT = Path(__file__).resolve().parents[2]
RUNBOOK = ROOT / "docs" / "runbook.md"
RULES = ROOT / "deploy" / "prometheus" / "offloadd-rules.yml"


def alerts() -> dict[str, dict[str, str]]:
    doc = yaml.safe_load(RULES.read_text())
    return {r["alert"]: r.get("annotations", {}) for g in doc["groups"] for r in g["rules"]}


def sections() -> dict[str, str]:
    parts = re.split(r"^## (\w+)\s*$", RUNBOOK.read_text(), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def commands(text: str) -> list[str]:
    blocks = re.findall(r"```sh\n(.*?)```", text, flags=re.S)
    return [line.split("#")[0].strip() for b in blocks for line in b.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_every_alert_has_a_section_with_its_meaning_and_three_commands() -> None:
    secs = sections()
    for name in alerts():
        assert name in secs, f"docs/runbook.md has no section for {name}"
        assert "**Means:**" in secs[name], name
        assert len(commands(secs[name])) >= 3, name


def test_every_alert_links_its_section() -> None:
    for name, ann in alerts().items():
        assert ann.get("runbook_url") == f"docs/runbook.md#{name.lower()}", name


@pytest.mark.parametrize("line", [c for s in sections().values() for c in commands(s)
                                  if c.startswith("offloadd ")])
def test_every_offloadd_command_in_the_runbook_parses(line: str) -> None:
    argv = shlex.split(line.split("|")[0].replace("TOPIC", "persistent://public/default/t"))
    try:
        cli.build_parser().parse_args(argv[1:])
    except SystemExit as exc:
        pytest.fail(f"{line!r}: offloadd refuses it (exit {exc.code})")


def test_the_readme_and_the_metrics_page_link_the_runbook() -> None:
    assert "docs/runbook.md" in (ROOT / "README.md").read_text()
    assert "runbook.md" in (ROOT / "docs" / "metrics.md").read_text()
