"""The SparkSession of a job: embedded (``local[*]``) unless a master is given or the job runs
under ``spark-submit``, which sets its own."""

from __future__ import annotations

import os
import sys

from pyspark import SparkConf
from pyspark.sql import SparkSession

# Settings the jobs rely on: UTC hours, Java's integer wrap-around in selector arithmetic (not
# ANSI's overflow errors), a missing map key read as NULL.
REQUIRED = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.ansi.enabled": "false",
}
EMBEDDED = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "16",
    "spark.driver.memory": "4g",
    "spark.sql.adaptive.enabled": "true",
}


def session(master: str | None = None, app: str = "jms-bridge", **conf: str) -> SparkSession:
    builder = SparkSession.builder.appName(app)
    submitted = SparkConf().contains("spark.master")
    if master is not None or not submitted:
        builder = builder.master(master or "local[*]")
        for key, value in EMBEDDED.items():
            builder = builder.config(key, value)
        if (master or "local").startswith("local") and "PYSPARK_PYTHON" not in os.environ:
            # embedded: the Python workers (replay's publishers) run this interpreter, with
            # this installation's packages, not whatever python3 is first on the PATH (PySpark
            # reads the variable when it makes the SparkContext)
            os.environ["PYSPARK_PYTHON"] = sys.executable
    for key, value in {**REQUIRED, **conf}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    for key, value in REQUIRED.items():  # a session already running keeps its own otherwise
        spark.conf.set(key, value)
    spark.sparkContext.setLogLevel("ERROR")
    return spark
