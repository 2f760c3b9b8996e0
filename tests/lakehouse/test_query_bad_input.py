"""``offloadd query`` with no statement (issue 23, item 11): a message and exit 2, not an
AttributeError traceback (DuckDB answers text without a statement with no cursor)."""

from __future__ import annotations

from pathlib import Path

import pytest

from offloadd import config
from offloadd.shell import cli


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sql", ["-- only a comment", ";", ""])
def test_a_query_without_a_statement_exits_2_with_a_message(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], sql: str) -> None:
    from offloadd.lakehouse.tables import open_catalog

    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[lakehouse]\npath = "{tmp_path / "lh"}"\n')
    open_catalog(config.load(cfg), create=True)  # an empty catalog: the query gets to DuckDB
    with pytest.raises(SystemExit) as exited:
        raise SystemExit(cli.main(["query", "--config", str(cfg), sql]))
    err = capsys.readouterr().err
    assert exited.value.code == 2, err
    assert "Traceback" not in err
    assert ("has no SQL statement" if sql else "the query is empty") in err, err
