"""What a job sets for its master, and a failure of Spark's in one line."""

from __future__ import annotations

from bridge.pipeline.session import (
    EMBEDDED,
    REQUIRED,
    in_one_line,
    is_local,
    python_error,
    settings,
)

# An executor's failure as the driver's Py4J error carries it (cut short).
EXECUTOR_FAILURE = (
    "An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.\n"
    ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 24.0 "
    "failed 4 times, most recent failure: Lost task 0.3 in stage 24.0 (TID 77) (127.0.0.1 "
    "executor 0): org.apache.spark.api.python.PythonException: Traceback (most recent call "
    "last):\n"
    '  File "/tmp/spark/python/lib/pyspark.zip/pyspark/worker.py", line 1231, in main\n'
    "    func, profiler, deserializer, serializer = read_command(pickleSer, infile)\n"
    '  File "/tmp/spark/python/lib/pyspark.zip/pyspark/serializers.py", line 471, in loads\n'
    "    return cloudpickle.loads(obj, encoding=encoding)\n"
    "ModuleNotFoundError: No module named 'bridge'\n"
    "\n"
    "\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException("
    "PythonRunner.scala:572)\n"
    "\tat org.apache.spark.scheduler.Task.run(Task.scala:141)\n"
    "\n"
    "Driver stacktrace:\n"
    "\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages(x.scala:2856)\n"
    "Caused by: org.apache.spark.api.python.PythonException: Traceback (most recent call "
    "last):\n"
    '  File "/tmp/spark/python/lib/pyspark.zip/pyspark/worker.py", line 1231, in main\n'
    "ModuleNotFoundError: No module named 'bridge'\n"
    "\n"
    "\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException("
    "PythonRunner.scala:572)\n"
)


def test_an_executors_python_error_is_its_exception_line_with_the_master() -> None:
    assert python_error(EXECUTOR_FAILURE) == "ModuleNotFoundError: No module named 'bridge'"
    made = in_one_line(Exception(EXECUTOR_FAILURE), "replay failed on spark://127.0.0.1:7077")
    assert str(made) == ("replay failed on spark://127.0.0.1:7077: ModuleNotFoundError: "
                         "No module named 'bridge'")


def test_chained_python_errors_give_the_last_one() -> None:
    text = ("PythonException: Traceback (most recent call last):\n  File \"a\", line 1\n"
            "KeyError: 'x'\n\nDuring handling of the above exception, another exception "
            "occurred:\n\nTraceback (most recent call last):\n  File \"b\", line 2\n"
            "    raise PutRefused()\npolicies.errors.PutRefused: MQRC_Q_FULL (2053)\n")
    assert python_error(text) == "policies.errors.PutRefused: MQRC_Q_FULL (2053)"
    assert python_error("org.apache.spark.SparkException: no Python here") is None


def test_the_embedded_settings_only_on_a_local_master_the_job_chose() -> None:
    for master in ("local", "local[*]", "local[2]", "local[2,3]"):
        assert is_local(master)
        assert settings(master, {}) == {**EMBEDDED, **REQUIRED}
    for master in ("spark://127.0.0.1:7077", "yarn", "k8s://https://h:6443",
                   "local-cluster[2,1,1024]"):
        assert not is_local(master)
        assert settings(master, {}) == REQUIRED, master
    assert settings("local[4]", {}, chosen=False) == REQUIRED  # spark-submit's local run
    mine = {"spark.executor.memory": "500m", "spark.sql.shuffle.partitions": "200"}
    assert settings("spark://h:7077", mine) == {**REQUIRED, **mine}
    assert settings("local[*]", mine)["spark.sql.shuffle.partitions"] == "200"
