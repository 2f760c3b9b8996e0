"""History backfill on Spark, and the tier as a Spark data source (docs/backfill.md).

``split.py``      pure: cut closed history into segments by binary search over positions
``plan.py``       the segments to upload: kept, redone and new (sizes from the offset files)
``job.py``        driver: ownership, plan, assign, one Spark task per segment, commit, progress
``task.py``       executor: upload one segment's range from the source (no Spark import)
``progress.py``   terminal progress bar and Prometheus gauges of a running backfill
``spark.py``      SparkSession set-up (local or cluster)
``datasource.py`` ``spark.read.format("offloadd")``: committed segments as a DataFrame
``command.py``    ``offloadd backfill``

Only the command line imports it (``offloadd backfill``, lazily), and only ``spark.py``,
``datasource.py`` and ``job.py`` import PySpark, so the daemon never loads Spark. The task
writes its segment through the offload stage's own pieces (``offload/runs.py``,
``offload/attempt.py``) and commits through ``commit/``.
"""
