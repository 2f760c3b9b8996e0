"""A topic table as a Spark DataFrame, read through Iceberg's own metadata (no runtime jar).

No Iceberg Spark runtime can be fetched here (only PyPI/Debian/npm are reachable), so Spark reads
the table the way pyiceberg does, through a PySpark Python data source
(``spark.read.format("offloadd-iceberg")``): the driver plans the scan of the table's current
snapshot (manifests → data files, one partition per file), and each task opens the same snapshot
with ``StaticTable`` and streams its file as Arrow batches. Executors need the ``lakehouse``
extra and access to the warehouse (the same filesystem path, or the S3 endpoint).

Options: ``config`` (the TOML file; default: built-in defaults + environment) and ``topic``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from offloadd import config as config_mod
from offloadd.config import Settings
from offloadd.errors import ConfigError
from offloadd.lakehouse.tables import catalog_properties, identifier, open_catalog
from offloadd.model import TopicName

__all__ = ["IcebergTableSource", "read_table", "spark_ddl"]

_SPARK_TYPES = {"string": "string", "long": "bigint", "int": "int", "boolean": "boolean",
                "double": "double", "float": "float", "binary": "binary",
                "timestamptz": "timestamp", "timestamp": "timestamp_ntz", "date": "date",
                "uuid": "string", "time": "bigint"}


def spark_ddl(schema: Any) -> str:
    """Spark DDL for a pyiceberg schema: the log's columns and the typed ones (``value``,
    ``kv_key``: structs, nested, with lists, maps, decimals and timestamps)."""
    return ", ".join(f"`{f.name}` {_spark_type(f.field_type)}" for f in schema.fields)


def _spark_type(t: Any) -> str:
    from pyiceberg.types import DecimalType, FixedType, ListType, MapType, StructType

    if isinstance(t, StructType):
        return "struct<" + ", ".join(f"`{f.name}`: {_spark_type(f.field_type)}"
                                     for f in t.fields) + ">"
    if isinstance(t, ListType):
        return f"array<{_spark_type(t.element_type)}>"
    if isinstance(t, MapType):
        return f"map<{_spark_type(t.key_type)}, {_spark_type(t.value_type)}>"
    if isinstance(t, DecimalType):
        return f"decimal({t.precision}, {t.scale})"
    if isinstance(t, FixedType):
        return "binary"
    return _SPARK_TYPES[str(t)]


@dataclass(frozen=True)
class _File(InputPartition):
    path: str


class IcebergTableSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "offloadd-iceberg"

    def _settings(self) -> Settings:
        return config_mod.load(self.options.get("config"))

    def _topic(self) -> TopicName:
        topic = self.options.get("topic")
        if not topic:
            raise ConfigError('spark.read.format("offloadd-iceberg") needs .option("topic", ...)')
        return TopicName.parse(topic)

    def schema(self) -> str:
        table = open_catalog(self._settings(), create=False).load_table(
            identifier(self._topic()))
        return spark_ddl(table.schema())

    def reader(self, schema: StructType) -> DataSourceReader:
        settings = self._settings()
        table = open_catalog(settings, create=False).load_table(identifier(self._topic()))
        props = {k: v for k, v in catalog_properties(settings).items()
                 if k.startswith(("s3.", "py-io-impl"))}
        return _Reader(table.metadata_location, props,
                       [t.file.file_path for t in table.scan().plan_files()])


class _Reader(DataSourceReader):
    def __init__(self, location: str, props: dict[str, str], paths: list[str]) -> None:
        self.location = location
        self.props = props
        self.paths = paths

    def partitions(self) -> list[InputPartition]:
        return [_File(p) for p in self.paths] or [_File("")]

    def read(self, partition: _File) -> Iterator[Any]:  # type: ignore[override]
        if not partition.path:
            return
        from pyiceberg.expressions import AlwaysTrue
        from pyiceberg.io.pyarrow import ArrowScan
        from pyiceberg.table import StaticTable

        t = StaticTable.from_metadata(self.location, self.props)
        tasks = [task for task in t.scan().plan_files() if task.file.file_path == partition.path]
        target = None
        for batch in ArrowScan(t.metadata, t.io, t.schema(), AlwaysTrue()).to_record_batches(
                tasks):
            if target is None:
                target = _plain_types(batch.schema)
            yield batch.cast(target)


def _plain_types(schema: Any) -> Any:
    """The scan's Arrow schema as Spark's Arrow reader wants it: 32-bit string and binary
    offsets (pyiceberg reads large_string / large_binary), every field nullable (the DDL)."""
    import pyarrow as pa

    def plain(t: Any) -> Any:
        if pa.types.is_large_string(t):
            return pa.string()
        if pa.types.is_large_binary(t):
            return pa.binary()
        if pa.types.is_map(t):
            return pa.map_(plain(t.key_type), pa.field(t.item_field.name, plain(t.item_type)))
        if pa.types.is_large_list(t) or pa.types.is_list(t):
            return pa.list_(pa.field(t.value_field.name, plain(t.value_type)))
        if pa.types.is_struct(t):
            return pa.struct([pa.field(f.name, plain(f.type), nullable=True) for f in t])
        return t

    return pa.schema([pa.field(f.name, plain(f.type), nullable=True) for f in schema])


def read_table(spark: Any, config: str | None, topic: TopicName) -> Any:
    """``pyspark.sql.DataFrame`` of the topic's table at its current snapshot."""
    spark.dataSource.register(IcebergTableSource)
    reader = spark.read.format("offloadd-iceberg").option("topic", str(topic))
    if config is not None:
        reader = reader.option("config", config)
    return reader.load()
