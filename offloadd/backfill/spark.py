"""SparkSession set-up for the backfill and the data source.

Local masters (``local[N]``) get ``SPARK_LOCAL_IP=127.0.0.1``; every master gets this
interpreter as ``PYSPARK_PYTHON`` unless the environment already names one (executors must
import ``offloadd``: on a cluster, install the same package there). Spark's own console progress
bar is off (the backfill draws its own), Python data-source filter push-down is on (the
``offloadd`` data source implements it), and the data source is registered.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

DEFAULT_MASTER = "local[*]"


def session(master: str | None = None, *, app_name: str = "offloadd",
            conf: Mapping[str, str] | None = None, log_level: str = "WARN") -> Any:
    """A (possibly already running) SparkSession; returns ``pyspark.sql.SparkSession``."""
    master = master or DEFAULT_MASTER
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.python.filterPushdown.enabled", "true"))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    from offloadd.backfill.datasource import register

    register(spark)
    return spark


def parse_conf(pairs: list[str]) -> dict[str, str]:
    """``["k=v", ...]`` (the CLI's repeated ``--spark-conf``) as a dict."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--spark-conf {pair!r}: expected KEY=VALUE")
        out[key.strip()] = value.strip()
    return out
