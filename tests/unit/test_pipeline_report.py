"""The report job on a small journal with known counts."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bridge.app.journal import JournalSink, JournalSpec, JournalWriter
from bridge.pipeline import journal, report
from bridge.pipeline.options import parse_time
from bridge.staging.outcomes import Kind, MessageOutcome
from policies.reasons import MQFB_EXPIRATION, MQRC_BACKOUT_THRESHOLD_REACHED, MQRC_Q_FULL

H10 = 1_700_000_000_000 - 1_700_000_000_000 % 3_600_000  # the start of an hour
H11 = H10 + 3_600_000


def outcomes() -> list[MessageOutcome]:
    out: list[MessageOutcome] = []
    # /queue/a, hour 10: 10 staged, released 0..9 ms late; one expired.
    for i in range(10):
        out.append(MessageOutcome(Kind.STAGED, H10 + i, f"a{i}", "/queue/a", H10 + 1000 + i,
                                  size=10))
        out.append(MessageOutcome(Kind.RELEASED, H10 + 1000 + 2 * i, f"a{i}", "/queue/a",
                                  H10 + 1000 + i, size=10))
    out.append(MessageOutcome(Kind.EXPIRED, H10 + 50, "a10", "/queue/a", H10 + 40,
                              reason=MQFB_EXPIRATION))
    # /queue/a, hour 11: 2 released, 100 and 300 ms late; one released now (early on purpose).
    out.append(MessageOutcome(Kind.RELEASED, H11 + 100, "a11", "/queue/a", H11))
    out.append(MessageOutcome(Kind.RELEASED, H11 + 300, "a12", "/queue/a", H11))
    out.append(MessageOutcome(Kind.RELEASED_NOW, H11, "a13", "/queue/a", H11 + 5000))
    # /queue/o, hour 10: message o1 redelivered 3 times then dead-lettered, o2 once then
    # deleted; one undeliverable.
    for n in (1, 2, 3):
        out.append(MessageOutcome(Kind.REDELIVERED, H10 + n, "o1", "/queue/o", H10 + n + 100,
                                  count=n))
    out.append(MessageOutcome(Kind.DEAD_LETTERED, H10 + 9, "o1", "/queue/o",
                              reason=MQRC_BACKOUT_THRESHOLD_REACHED, queue="/queue/dlq", count=4))
    out.append(MessageOutcome(Kind.REDELIVERED, H10 + 1, "o2", "/queue/o", H10 + 1, count=1))
    out.append(MessageOutcome(Kind.DELETED, H10 + 2, "o2", "/queue/o",
                              reason=MQRC_BACKOUT_THRESHOLD_REACHED, count=2))
    out.append(MessageOutcome(Kind.UNDELIVERABLE, H10 + 2000, "o3", "/queue/o", H10 + 1990,
                              reason=MQRC_Q_FULL, queue="jms-bridge.staging.undeliverable"))
    return out


def write_journal(folder: Path) -> None:
    writer = JournalWriter(JournalSpec(str(folder), "h-1", "rabbitmq", max_bytes=1500),
                           "engine").start()
    sink = JournalSink(writer)
    for o in outcomes():
        sink([o])
    writer.close()
    (folder / "h-1-engine-9-00009.jsonl.tmp").write_text('{"v":1,"time":1,"event":"released"')


def rows(df: Any) -> list[dict[str, Any]]:
    return [r.asDict() for r in df.collect()]


def test_the_report_counts_what_the_journal_says(spark: Any, tmp_path: Path) -> None:
    write_journal(tmp_path / "j")
    out = tmp_path / "out"
    result = report.run(spark, str(tmp_path / "j"), str(out))
    assert result.events == len(outcomes())  # the .tmp file is not read
    t = result.tables
    hour10 = datetime.fromtimestamp(H10 / 1000, UTC).replace(tzinfo=None)
    hour11 = datetime.fromtimestamp(H11 / 1000, UTC).replace(tzinfo=None)

    got = {(r["destination"], r["hour"], r["event"]): r["messages"] for r in rows(t["outcomes"])}
    assert got == {
        ("/queue/a", hour10, "staged"): 10, ("/queue/a", hour10, "released"): 10,
        ("/queue/a", hour10, "expired"): 1, ("/queue/a", hour11, "released"): 2,
        ("/queue/a", hour11, "released-now"): 1, ("/queue/o", hour10, "redelivered"): 4,
        ("/queue/o", hour10, "dead-lettered"): 1, ("/queue/o", hour10, "deleted"): 1,
        ("/queue/o", hour10, "undeliverable"): 1,
    }
    late = rows(t["lateness"])
    assert late == [
        {"destination": "/queue/a", "hour": hour10, "released": 10, "p50_ms": 4, "p90_ms": 8,
         "p99_ms": 9, "max_ms": 9, "early": 0},
        {"destination": "/queue/a", "hour": hour11, "released": 2, "p50_ms": 100,
         "p90_ms": 300, "p99_ms": 300, "max_ms": 300, "early": 0},
    ]
    buckets = {r["bucket"]: r["released"] for r in rows(t["lateness_buckets"])}
    assert buckets == {"<=0 ms": 1, "<=1 ms": 1, "<=2 ms": 1, "<=5 ms": 3, "<=10 ms": 4,
                       "<=100 ms": 1, "<=500 ms": 1}
    assert rows(t["redeliveries"]) == [
        {"destination": "/queue/o", "hour": hour10, "redeliveries": 4, "messages": 2,
         "per_message": 2.0, "max_per_message": 3},
    ]
    dead = {(r["event"], r["reason"]): r["messages"] for r in rows(t["dead_letters"])}
    assert dead == {("dead-lettered", "MQRC_BACKOUT_THRESHOLD_REACHED"): 1,
                    ("deleted", "MQRC_BACKOUT_THRESHOLD_REACHED"): 1,
                    ("undeliverable", "MQRC_Q_FULL"): 1}
    for name in report.TABLES:
        assert list((out / name).glob("*.parquet")), name
    page = (out / "report.html").read_text()
    assert page.startswith("<!doctype html>") and "No message was released early." in page
    assert page.count("Plotly.newPlot") == 3 and "<script src=" not in page  # self-contained
    # With no window asked for, the page states the one its events cover.
    assert re.search(r"events from \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC to \d{4}-", page), \
        re.findall(r"<p>[^<]*events[^<]*</p>", page)


def test_early_releases_and_the_time_window(spark: Any, tmp_path: Path) -> None:
    rows_ = [{"v": 1, "time": H10 + 5, "event": "released", "destination": "/queue/e",
              "late_ms": -5, "broker": "rabbitmq", "instance": "i", "process": "engine"},
             {"v": 1, "time": H11 + 5, "event": "released", "destination": "/queue/e",
              "late_ms": 3, "broker": "rabbitmq", "instance": "i", "process": "engine"},
             {"v": 2, "time": H10 + 6, "event": "released", "destination": "/queue/e",
              "late_ms": -5, "broker": "rabbitmq", "instance": "i", "process": "engine"}]
    df = spark.createDataFrame(rows_, schema=journal.SCHEMA)
    everything = report.lateness(report.events(df))
    assert [r["early"] for r in everything.collect()] == [1, 0]  # v2 is not read
    window = report.lateness(report.events(df, since_ms=H11, until_ms=H11 + 3_600_000))
    assert [(r["released"], r["early"]) for r in window.collect()] == [(1, 0)]


def test_times_on_the_command_line() -> None:
    assert parse_time("1700000000000") == 1_700_000_000_000
    assert parse_time("2023-11-14T22:13:20Z") == 1_700_000_000_000
    assert parse_time("2023-11-14T22:13:20") == 1_700_000_000_000
    assert parse_time("2023-11-14T23:13:20+01:00") == 1_700_000_000_000


def test_a_journal_that_is_not_there_is_one_line_before_spark_starts(tmp_path: Path) -> None:
    from bridge.app.cli import main

    missing = tmp_path / "none"
    assert main(["report", "--journal", str(missing), "--out", str(tmp_path / "out")]) == 1
    assert not (tmp_path / "out").exists()


def test_sparks_own_failures_are_one_line_naming_the_java_exception() -> None:
    import pytest

    from bridge.pipeline.session import in_one_line
    from policies.errors import ConfigError, Refused
    from policies.reasons import MQRC_Q_FULL

    py4j = Exception(
        "An error occurred while calling o301.parquet.\n"
        ": org.apache.hadoop.fs.ParentNotDirectoryException: Parent path is not a directory: "
        "file:/etc/passwd\n\tat org.apache.hadoop.fs.RawLocalFileSystem.mkdirs(x.java:1)\n")
    made = in_one_line(py4j, "report failed in Spark")
    assert isinstance(made, ConfigError)
    assert str(made) == ("report failed in Spark: org.apache.hadoop.fs."
                         "ParentNotDirectoryException: Parent path is not a directory: "
                         "file:/etc/passwd")
    analysis = Exception("[PATH_NOT_FOUND] Path does not exist: file:/x/*.none.")
    assert str(in_one_line(analysis, "w")) == (
        "w: [PATH_NOT_FOUND] Path does not exist: file:/x/*.none.")
    own = Refused(MQRC_Q_FULL, "full")
    assert in_one_line(own, "w") is own  # the bridge's own errors pass as they are
    with pytest.raises(ConfigError):
        raise in_one_line(ValueError(""), "w")
