"""History backfill on Spark, and the tier as a Spark data source.

``split.py``      pure: cut closed history into segments by binary search over positions
``task.py``       executor side: upload one segment's range from the source (one Spark task)
``job.py``        driver side: ownership, plan, assign, run tasks, commit, progress
``progress.py``   terminal progress bar and Prometheus gauges for a running backfill
``spark.py``      SparkSession set-up (local or cluster)
``datasource.py`` ``spark.read.format("offloadd")``: committed segments as a DataFrame

Only ``split.py`` is imported eagerly by nothing else; the rest pull in PySpark lazily where it
is needed, so the daemon never loads it.
"""
