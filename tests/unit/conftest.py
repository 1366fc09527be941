"""Fixtures of the unit tests."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest


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
