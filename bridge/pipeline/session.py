"""The SparkSession of a job: embedded (``local[*]``) unless a master is given or the job runs
under ``spark-submit``, which sets its own."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

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


def in_one_line(exc: BaseException, what: str) -> Exception:
    """A failure of Spark's own (Py4J, analysis, a master it cannot reach) as a ConfigError of
    one line naming ``what`` failed: the job's user gets its first line, not its traceback. The
    bridge's own errors pass as they are."""
    from policies.errors import BridgeError, ConfigError

    if isinstance(exc, BridgeError):
        return exc
    # (Py4J's text: "An error occurred while calling ...", then ": <the Java exception>", then
    # its stack, "at ..." lines; the Java exception's line says what went wrong.)
    lines = [ln.strip().lstrip(": ") for ln in str(exc).strip().splitlines()]
    useful = [ln for ln in lines if ln and not ln.startswith(("at ", "An error occurred", "..."))]
    java = next((ln for ln in useful if "Exception:" in ln or "Error:" in ln), None)
    text = java or (useful[0] if useful else type(exc).__name__)
    return ConfigError(f"{what}: {text[:500]}")


def started(master: str | None, app: str, conf: Sequence[tuple[str, str]] = ()) -> SparkSession:
    """``session``, or a ConfigError of one line when Spark cannot start (a master it cannot
    reach, no Java)."""
    try:
        return session(master, app, **dict(conf))
    except Exception as exc:  # noqa: BLE001 - see in_one_line
        raise in_one_line(exc, f"Spark did not start (master {master or 'local[*]'})") from None


def existing_paths(paths: Sequence[str], flag: str) -> None:
    """A ConfigError for a local path (no ``scheme://``, no wildcard) that is not there."""
    from policies.errors import ConfigError

    for path in paths:
        if "://" not in path and not any(c in path for c in "*?[") and not Path(path).exists():
            raise ConfigError(f"{flag} {path}: no such file or folder")
