"""The SparkSession of a job: embedded (``local[*]``) unless a master is given or the job runs
under ``spark-submit``, which sets its own. On a cluster the job ships its executors' Python
code itself (``executor_zip``) and sets none of the embedded run's settings."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from pyspark import SparkConf
from pyspark.sql import SparkSession

# Settings the jobs rely on: UTC hours, Java's integer wrap-around in selector arithmetic (not
# ANSI's overflow errors), a missing map key read as NULL.
REQUIRED = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.ansi.enabled": "false",
}
# The embedded run's only: a cluster's own defaults (and the user's --conf) hold there.
EMBEDDED = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "16",
    "spark.driver.memory": "4g",
    "spark.sql.adaptive.enabled": "true",
}
PROBE_TIMEOUT_S = 5.0


def is_local(master: str) -> bool:
    """``local``, ``local[N]``, ``local[*]``, ``local[N,F]``: Spark inside this process's JVM
    (``local-cluster[...]`` starts executors of its own: a cluster)."""
    return master == "local" or master.startswith("local[")


def settings(master: str, conf: Mapping[str, str], *, chosen: bool = True) -> dict[str, str]:
    """What the job sets for ``master``: the embedded settings for a local master the job chose
    itself (spark-submit's are the submitter's to tune), the required ones always; the user's
    ``conf`` over both."""
    embedded = EMBEDDED if chosen and is_local(master) else {}
    return {**embedded, **REQUIRED, **conf}


def unreachable(master: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Why a standalone master (``spark://h:p``, or ``spark://h1:p1,h2:p2``) cannot be reached
    with a TCP connect, or None: Spark itself retries for a minute before it gives up."""
    if not master.startswith("spark://"):
        return None
    problems = []
    for address in master.removeprefix("spark://").split(","):
        host, _, port = address.strip().rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
                return None
        except (OSError, ValueError) as exc:
            problems.append(f"{address}: {getattr(exc, 'strerror', None) or exc}")
    return "; ".join(problems)


def session(master: str | None = None, app: str = "jms-bridge", **conf: str) -> SparkSession:
    from policies.errors import ConfigError

    builder = SparkSession.builder.appName(app)
    submitted = SparkConf().get("spark.master")
    effective = master or submitted or "local[*]"
    chosen = master is not None or not submitted
    if chosen:
        builder = builder.master(effective)
    local = is_local(effective)
    if conf.get("spark.pyspark.python"):
        # PySpark started from a builder takes the Python workers' interpreter from the
        # variable only (spark-submit turns the setting into it)
        os.environ["PYSPARK_PYTHON"] = conf["spark.pyspark.python"]
    elif local and "PYSPARK_PYTHON" not in os.environ:
        # embedded: the Python workers (replay's publishers) run this interpreter, with
        # this installation's packages, not whatever python3 is first on the PATH (PySpark
        # reads the variable when it makes the SparkContext)
        os.environ["PYSPARK_PYTHON"] = sys.executable
    if (why := unreachable(effective)) is not None:
        raise ConfigError(f"Spark master {effective} is not reachable: {why}")
    for key, value in settings(effective, conf, chosen=chosen).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    for key, value in REQUIRED.items():  # a session already running keeps its own otherwise
        spark.conf.set(key, value)
    spark.sparkContext.setLogLevel("ERROR")
    if not local:
        from bridge.pipeline.executor_zip import executor_zip

        # The executors import the project's packages and the broker clients from it (PySpark
        # also puts it on this driver's sys.path: the same files as those installed here).
        spark.sparkContext.addPyFile(str(executor_zip()))
    return spark


def in_one_line(exc: BaseException, what: str) -> Exception:
    """A failure of Spark's own (Py4J, analysis, a master it cannot reach) as a ConfigError of
    one line naming ``what`` failed: the job's user gets its first line, not its traceback. The
    bridge's own errors pass as they are."""
    from policies.errors import BridgeError, ConfigError

    if isinstance(exc, BridgeError):
        return exc
    if (python := python_error(str(exc))) is not None:
        return ConfigError(f"{what}: {python[:500]}")
    # (Py4J's text: "An error occurred while calling ...", then ": <the Java exception>", then
    # its stack, "at ..." lines; the Java exception's line says what went wrong.)
    lines = [ln.strip().lstrip(": ") for ln in str(exc).strip().splitlines()]
    useful = [ln for ln in lines if ln and not ln.startswith(("at ", "An error occurred", "..."))]
    java = next((ln for ln in useful if "Exception:" in ln or "Error:" in ln), None)
    text = java or (useful[0] if useful else type(exc).__name__)
    return ConfigError(f"{what}: {text[:500]}")


def python_error(text: str) -> str | None:
    """The exception line of the last Python traceback in ``text``, as in an executor's failure
    that Spark passes on (``...PythonException: Traceback (most recent call last):``, the
    frames, then e.g. ``ModuleNotFoundError: No module named 'x'``), or None."""
    lines = text.splitlines()
    starts = [i for i, ln in enumerate(lines) if "Traceback (most recent call last):" in ln]
    if not starts:
        return None
    for line in lines[starts[-1] + 1:]:
        if line.strip() and not line[0].isspace():  # a traceback's frames are indented
            return line.strip()
    return None


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
