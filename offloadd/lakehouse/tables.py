"""The Iceberg catalog, warehouse and tables (blocking: pyiceberg is synchronous; the follower
calls these from a worker thread).

- Catalog: pyiceberg's SQL catalog on SQLite at ``<[lakehouse] path>/catalog.db`` by default
  (no service needed), any SQLAlchemy URL, or an Iceberg REST catalog.
- Warehouse: on the tier's driver — ``file://<path>/warehouse`` for ``filesystem``,
  ``s3://<bucket>/<prefix>lakehouse`` for ``aws-s3`` through pyiceberg's PyArrow FileIO with the
  tier's endpoint and credentials.
- Tables: one per topic, identifier ``(<tenant>, <namespace>, <topic>)`` like Pulsar's own
  hierarchy, schema :func:`~offloadd.lakehouse.schema.table_schema`, partitioned by
  ``day(publish_time)``.
- Progress: every commit of the projection records the last projected position in its snapshot
  summary (:data:`LAST_POSITION`), so the table itself says where to resume — in the same atomic
  commit as the rows.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import (
    NamespaceAlreadyExistsError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.table import Table, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import update_table_metadata

from offloadd.config import Settings
from offloadd.errors import ConfigError, FormatError
from offloadd.lakehouse import layout
from offloadd.lakehouse.schema import json_type, table_schema
from offloadd.model import Position, TopicName

__all__ = [
    "CATALOG_NAME",
    "LAST_POSITION",
    "TOPIC_PROPERTY",
    "append",
    "catalog_properties",
    "client_properties",
    "identifier",
    "last_position",
    "open_catalog",
    "open_table",
    "warehouse_location",
]

# The name offloadd gives its catalog. pyiceberg's SQL catalog stores it in every row of its
# tables (``catalog_name``): a client loading the same database under another name sees no
# namespace at all (``NoSuchNamespaceError``), so clients must use this one.
CATALOG_NAME = "offloadd"
LAST_POSITION = "offloadd.last-position"
TOPIC_PROPERTY = "offloadd.topic"
TABLE_PROPERTIES = {
    # pyiceberg retries a failed commit by re-applying the append on top of whatever won: for
    # the projection that would add rows another projector already added. A lost race must
    # reach us, to resume from the winner's position.
    "commit.retry.num-retries": "0",
    # keep the metadata directory from growing one JSON file per commit forever
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "20",
    "write.parquet.compression-codec": "zstd",
}


def warehouse_location(settings: Settings) -> str:
    lh = settings.lakehouse
    if lh.warehouse:
        return lh.warehouse
    bs = settings.blobstore
    if bs.driver == "aws-s3":
        prefix = bs.prefix.strip("/")
        return f"s3://{bs.bucket}/{prefix + '/' if prefix else ''}lakehouse"
    return (Path(lh.path).resolve() / "warehouse").as_uri()


def catalog_properties(settings: Settings) -> dict[str, str]:
    """pyiceberg catalog properties for the configuration (secrets included: never log these)."""
    lh = settings.lakehouse
    props: dict[str, str] = {"warehouse": warehouse_location(settings)}
    if lh.catalog == "sql":
        props["type"] = "sql"
        props["uri"] = lh.catalog_uri or f"sqlite:///{Path(lh.path).resolve() / 'catalog.db'}"
    else:
        if not lh.catalog_uri:
            raise ConfigError('[lakehouse] catalog = "rest" needs catalog_uri')
        props["type"] = "rest"
        props["uri"] = lh.catalog_uri
        if lh.rest_credential is not None:
            props["credential"] = lh.rest_credential.get_secret_value()
        if lh.rest_token is not None:
            props["token"] = lh.rest_token.get_secret_value()
    bs = settings.blobstore
    if props["warehouse"].startswith("s3://"):
        props["py-io-impl"] = "pyiceberg.io.pyarrow.PyArrowFileIO"
        props["s3.region"] = bs.region
        if bs.endpoint:
            props["s3.endpoint"] = bs.endpoint
        if bs.access_key_id is not None and bs.secret_access_key is not None:
            props["s3.access-key-id"] = bs.access_key_id
            props["s3.secret-access-key"] = bs.secret_access_key.get_secret_value()
        if bs.session_token is not None:
            props["s3.session-token"] = bs.session_token.get_secret_value()
    return props


_SECRET_PROPERTIES = ("credential", "token", "s3.access-key-id", "s3.secret-access-key",
                      "s3.session-token")


def client_properties(settings: Settings) -> dict[str, str]:
    """What another pyiceberg client passes to ``load_catalog(CATALOG_NAME, **props)`` to open
    offloadd's catalog — :func:`catalog_properties` without a secret (a client brings its own
    credentials) and with a password in the URI masked."""
    props = {k: v for k, v in catalog_properties(settings).items()
             if k not in _SECRET_PROPERTIES}
    props["uri"] = _mask_password(props["uri"])
    return props


def _mask_password(uri: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


def open_catalog(settings: Settings, *, create: bool = True) -> Catalog:
    """The configured catalog; ``create=False`` for read-only commands (no directory made)."""
    lh = settings.lakehouse
    props = catalog_properties(settings)
    if lh.catalog == "sql" and not lh.catalog_uri:
        db = Path(lh.path) / "catalog.db"
        if not create and not db.exists():
            raise ConfigError(f"no lakehouse catalog at {db}: nothing was projected yet (run "
                              "`offloadd lakehouse sync` or enable [lakehouse] in the daemon)")
        Path(lh.path).mkdir(parents=True, exist_ok=True)
        if props["warehouse"].startswith("file://"):
            Path(props["warehouse"][len("file://"):]).mkdir(parents=True, exist_ok=True)
    for attempt in range(5):
        try:
            return load_catalog(CATALOG_NAME, **props)
        except Exception as exc:  # two processes creating the catalog tables at once
            if "already exists" not in str(exc) or attempt == 4:
                raise
            time.sleep(0.1 * (attempt + 1))
    raise AssertionError("unreachable")


def identifier(topic: TopicName) -> tuple[str, str, str]:
    return (topic.tenant, topic.namespace, topic.local)


def open_table(catalog: Catalog, topic: TopicName, json_fields: dict[str, str] | None = None,
               *, create: bool = True, partition: str = layout.DEFAULT) -> Table:
    """The topic's table, created on first use; JSON fields configured since are added, the
    partition spec and sort order brought to ``partition`` and the log order
    (:mod:`~offloadd.lakehouse.layout`)."""
    ident = identifier(topic)
    try:
        table = catalog.load_table(ident)
    except NoSuchTableError:
        if not create:
            raise
        _create_namespace(catalog, (topic.tenant, topic.namespace))
        try:
            table = catalog.create_table(
                ident, schema=table_schema(json_fields),
                partition_spec=layout.partition_spec(partition), sort_order=layout.sort_order(),
                properties={**TABLE_PROPERTIES, TOPIC_PROPERTY: str(topic)})
        except TableAlreadyExistsError:  # another process created it meanwhile
            table = catalog.load_table(ident)
    wrong = {k: v for k, v in TABLE_PROPERTIES.items() if table.properties.get(k) != v}
    if wrong:  # a table created by an older offloadd, or changed by hand
        with table.transaction() as tx:
            tx.set_properties(wrong)
        table = catalog.load_table(ident)
    have = {f.name for f in table.schema().fields}
    added = [f for f in table_schema().fields if f.name not in have]
    if added:  # a table created by an older offloadd: columns added since (null in old rows)
        with table.update_schema() as upd:
            for f in added:
                upd.add_column(f.name, f.field_type, f.doc)
        table = catalog.load_table(ident)
    if layout.evolve(table, partition):
        table = catalog.load_table(ident)
    missing = {k: v for k, v in (json_fields or {}).items()
               if k not in {f.name for f in table.schema().fields}}
    if missing:
        with table.update_schema() as upd:
            for name, kind in sorted(missing.items()):
                upd.add_column(name, json_type(kind))
        table = catalog.load_table(ident)
    return table


def _create_namespace(catalog: Catalog, namespace: tuple[str, str]) -> None:
    try:
        catalog.create_namespace(namespace)
    except NamespaceAlreadyExistsError:
        pass
    except Exception:
        # two projectors creating it at once: the SQL catalog checks, then inserts, and the
        # one whose insert comes second gets the database's IntegrityError for what is only
        # "it exists now"
        if not catalog.namespace_exists(namespace):
            raise


def last_position(table: Table) -> Position | None:
    """The last position the projection committed, from the newest snapshot that records it.

    ``None`` for a table nothing was projected into. A table that has rows but no snapshot
    recording a position (rows written by something else, or history expired) is refused rather
    than guessed at: projecting from the start would duplicate rows.
    """
    snap = table.current_snapshot()
    while snap is not None:
        value = snap.summary[LAST_POSITION] if snap.summary is not None else None
        if value:
            try:
                return Position.parse(value)
            except ValueError:
                raise FormatError(str(table.name()), 0, f"snapshot {snap.snapshot_id} records "
                                  f"{LAST_POSITION}={value!r}, not a position") from None
        if snap.parent_snapshot_id is None:
            break
        snap = table.snapshot_by_id(snap.parent_snapshot_id)
    current = table.current_snapshot()
    rows = int(current.summary["total-records"] or 0) if current and current.summary else 0
    if rows:
        raise FormatError(".".join(table.name()), 0, f"the table has {rows} rows but no snapshot "
                          f"records {LAST_POSITION}: it was written by something else (or its "
                          "history expired); refusing to guess where to resume")
    return None


def summary_properties(last: Position, **extra: Any) -> dict[str, str]:
    return {LAST_POSITION: str(last), **{k: str(v) for k, v in extra.items()}}


class _Transaction(Transaction):
    """pyiceberg's transaction, with its staged metadata computed once per staged state.

    pyiceberg rebuilds ``table_metadata`` — the table's whole metadata with the staged updates
    applied, then deep-copied — on every read, and one append reads it about twenty times; the
    copy walks every snapshot the table keeps, so a commit's CPU grew with the table's history
    (issue 22: 34 ms at 50 snapshots, 142 ms at 200). The base metadata is a frozen pydantic
    model and the staged updates a tuple replaced on each change, so the result is kept while
    both are the same objects (17 ms and 41 ms then).
    """

    _memo: tuple[TableMetadata, tuple[Any, ...], TableMetadata] | None = None

    @property
    def table_metadata(self) -> TableMetadata:
        memo = self._memo
        if memo is None or memo[0] is not self._table.metadata or memo[1] is not self._updates:
            meta = update_table_metadata(self._table.metadata, self._updates)
            memo = self._memo = (self._table.metadata, self._updates, meta)
        return memo[2]


def append(table: Table, rows: Any, properties: dict[str, str]) -> None:
    """``table.append(rows, snapshot_properties=properties)`` through :class:`_Transaction`
    (one commit; a lost compare-and-set raises ``CommitFailedException``)."""
    with _Transaction(table) as tx:
        tx.append(rows, snapshot_properties=properties)
