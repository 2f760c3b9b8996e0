"""The lakehouse: offloaded Pulsar messages as Apache Iceberg tables, queryable by any engine.

====================  ==============================================================================
module                does
====================  ==============================================================================
``schema.py``         the table: one row per message, partitioned by day(publish_time)
``rows.py``           entries → decoded messages → Arrow rows (undecodable entries: flagged rows)
``tables.py``         catalog (SQL on SQLite, or REST), warehouse on the tier's driver, progress
``transactions.py``   read-committed: markers and aborted transactions hidden, undecided ones held
``chunks.py``         chunked messages reassembled as Pulsar's consumer does (``<topic>__messages``)
``projector.py``      committed segments → table commits, exactly once; compaction, expiry; follower
``query.py``          ``offloadd query``: SQL over the tables with DuckDB on pyiceberg's Arrow scans
``spark.py``          a table as a Spark DataFrame (through Arrow; no Iceberg runtime jar needed)
====================  ==============================================================================

Needs the ``lakehouse`` extra (pyiceberg, sqlalchemy, duckdb). The package reads committed
segments through :mod:`offloadd.read` and :mod:`offloadd.model.catalog` only; it knows nothing
of the offload pipeline. See docs/lakehouse.md.
"""

from __future__ import annotations

from offloadd.errors import ConfigError

__all__ = ["require"]


def require() -> None:
    """A clear error when the extra is not installed."""
    import importlib.util

    for name in ("pyiceberg", "pyiceberg_core", "sqlalchemy", "duckdb"):
        if importlib.util.find_spec(name) is None:  # looked up, not imported: start-up stays
            raise ConfigError(f"the lakehouse needs the lakehouse extra ({name} is missing): "
                              "pip install 'offloadd[lakehouse]'")
