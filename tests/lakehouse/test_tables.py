"""Catalog and warehouse properties follow the configuration (no service needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from offloadd import config
from offloadd.errors import ConfigError
from offloadd.lakehouse.tables import catalog_properties, open_catalog, warehouse_location


def test_default_is_a_sqlite_catalog_with_the_warehouse_beside_it(tmp_path: Path) -> None:
    s = config.load(None, lakehouse__path=str(tmp_path / "lh"))
    props = catalog_properties(s)
    assert props["type"] == "sql"
    assert props["uri"] == f"sqlite:///{tmp_path / 'lh' / 'catalog.db'}"
    assert props["warehouse"] == (tmp_path / "lh" / "warehouse").as_uri()


def test_s3_warehouse_uses_the_tiers_endpoint_and_credentials(tmp_path: Path) -> None:
    s = config.load(None, blobstore__driver="aws-s3", blobstore__bucket="b",
                    blobstore__prefix="p/q/", blobstore__endpoint="http://127.0.0.1:9",
                    blobstore__access_key_id="AK", blobstore__secret_access_key="SK",
                    lakehouse__path=str(tmp_path))
    props = catalog_properties(s)
    assert warehouse_location(s) == props["warehouse"] == "s3://b/p/q/lakehouse"
    assert (props["s3.endpoint"], props["s3.access-key-id"], props["s3.secret-access-key"]) == (
        "http://127.0.0.1:9", "AK", "SK")


def test_rest_catalog_by_configuration() -> None:
    s = config.load(None, lakehouse__catalog="rest", lakehouse__catalog_uri="http://cat:8181",
                    lakehouse__rest_token="tok", lakehouse__warehouse="s3://w/h")
    props = catalog_properties(s)
    assert (props["type"], props["uri"], props["token"], props["warehouse"]) == (
        "rest", "http://cat:8181", "tok", "s3://w/h")
    assert "tok" in config.secret_values(s)  # redacted from logs like every secret
    with pytest.raises(ConfigError, match="needs catalog_uri"):
        catalog_properties(config.load(None, lakehouse__catalog="rest"))


def test_read_only_commands_do_not_create_a_catalog(tmp_path: Path) -> None:
    s = config.load(None, lakehouse__path=str(tmp_path / "none"))
    with pytest.raises(ConfigError, match="nothing was projected yet"):
        open_catalog(s, create=False)
    assert not (tmp_path / "none").exists()


def test_what_clients_are_told_holds_no_secret(tmp_path: Path) -> None:
    """``lakehouse tables --json`` prints client_properties: no credential, no password."""
    from offloadd.lakehouse.tables import CATALOG_NAME, client_properties

    s = config.load(None, blobstore__driver="aws-s3", blobstore__bucket="b",
                    blobstore__endpoint="http://127.0.0.1:9", blobstore__access_key_id="AK",
                    blobstore__secret_access_key="SK", blobstore__session_token="ST",
                    lakehouse__catalog_uri="postgresql://user:hunter2@db:5432/cat",
                    lakehouse__path=str(tmp_path))
    props = client_properties(s)
    assert CATALOG_NAME == "offloadd"
    assert props["uri"] == "postgresql://user:***@db:5432/cat"
    assert props["s3.endpoint"] == "http://127.0.0.1:9" and props["warehouse"] == "s3://b/lakehouse"
    text = repr(props)
    for secret in ("hunter2", "AK", "SK", "ST"):
        assert secret not in text



def test_a_namespace_created_meanwhile_by_another_projector_is_not_an_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SQL catalog checks that the namespace is absent, then inserts it: another projector
    inserting in between made this one's insert fail with the database's IntegrityError."""
    from offloadd.lakehouse.tables import identifier, open_table
    from offloadd.model import TopicName

    s = config.load(None, lakehouse__path=str(tmp_path / "lh"))
    topic = TopicName.parse("persistent://public/default/t")
    cat = open_catalog(s)
    cat.create_namespace(("public", "default"))  # the other projector's, done meanwhile
    real = cat.namespace_exists
    checks: list[object] = []

    def exists(ns: str | tuple[str, ...]) -> bool:
        checks.append(ns)
        return len(checks) > 1 and real(ns)  # the first check ran before the other's insert

    monkeypatch.setattr(cat, "namespace_exists", exists)
    table = open_table(cat, topic)
    assert table.name() == identifier(topic)
