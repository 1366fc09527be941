"""Suite-wide settings, and the one embedded SparkSession."""

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from hypothesis import settings

# Property tests check what is parsed or refused, never how fast: on two shared cores a busy
# moment must not fail one example for exceeding hypothesis's default 200 ms deadline.
settings.register_profile("jms-bridge", deadline=None, print_blob=True)
settings.load_profile("jms-bridge")


@pytest.fixture(autouse=True)
def _structlog_as_before() -> Iterator[None]:
    """A test that runs the CLI's main() sets structlog up to print to the sys.stderr of that
    moment, capsys's, closed after the test: put structlog back so later tests do not log there."""
    yield
    structlog.reset_defaults()


# Every JVM the tests start for Spark (the embedded session, the CLI's reports, spark-submit, a
# standalone cluster's daemons and executors) compiles with the client compiler only and collects
# garbage on one thread: on small test data a JVM's own optimising compiler and parallel
# collector cost more CPU than the jobs, and two cores are shared by the whole suite.
SPARK_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


@pytest.fixture(scope="session", autouse=True)
def _spark_jvm_options() -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in ("SPARK_SUBMIT_OPTS", "SPARK_DAEMON_JAVA_OPTS")}
    for key, value in saved.items():
        os.environ[key] = f"{value} {SPARK_JVM_OPTIONS}" if value else SPARK_JVM_OPTIONS
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One embedded SparkSession for every PySpark test (starting one takes seconds). Without
    PySpark or Java the tests skip, and fail when CI is set."""
    problem = None
    try:
        import pyspark  # noqa: F401
    except ImportError as exc:
        problem = f"PySpark is not installed: {exc}"
    if problem is None and not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        problem = "Java is not installed (PySpark needs it)"
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(problem)
        pytest.skip(problem)
    from bridge.pipeline.session import session

    spark = session("local[2]", "jms-bridge tests", **{
        "spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false",
        "spark.default.parallelism": "2",
    })
    yield spark
    spark.stop()
