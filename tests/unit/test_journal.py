"""The event journal: lines by the schema, rotation, never half a file, drops counted."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import jsonschema
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from bridge.app.config import resolve
from bridge.app.journal import (
    SCHEMA_PATH,
    JournalSink,
    JournalSpec,
    JournalWriter,
    finish_orphans,
    record,
    register,
)
from bridge.staging.outcomes import Kind, MessageOutcome
from policies.reasons import (
    MQFB_EXPIRATION,
    MQRC_BACKOUT_THRESHOLD_REACHED,
    MQRC_EXPIRY_ERROR,
    MQRC_UNKNOWN_OBJECT_NAME,
)

SCHEMA = json.loads(SCHEMA_PATH.read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)

EVERY_KIND = [
    MessageOutcome(Kind.STAGED, 1000, "ID:1", "/queue/a", 6000, None,
                   queue="jms-bridge.staging.L12", size=5),
    MessageOutcome(Kind.REFUSED, 1000, "ID:2", "/queue/a", reason=MQRC_EXPIRY_ERROR,
                   detail="expires before it is due", size=3),
    MessageOutcome(Kind.RELEASED, 6003, "ID:1", "/queue/a", 6000, None, size=5),
    MessageOutcome(Kind.RELEASED_NOW, 3000, "ID:3", "/queue/a", 6000, 9000, size=0),
    MessageOutcome(Kind.EXPIRED, 6001, "ID:4", "/queue/a", 6000, 5000, reason=MQFB_EXPIRATION),
    MessageOutcome(Kind.CANCELLED, 2000, "ID:5", "/queue/a", 6000),
    MessageOutcome(Kind.UNDELIVERABLE, 6010, "ID:6", "/amq/queue/gone", 6000,
                   reason=MQRC_UNKNOWN_OBJECT_NAME, detail="NOT_FOUND",
                   queue="jms-bridge.staging.undeliverable", size=7),
    MessageOutcome(Kind.INVALID, 10, "x", None, queue="jms-bridge.staging.invalid",
                   detail="no target"),
    MessageOutcome(Kind.REDELIVERED, 100, "ID:7", "/queue/o", 1100, detail="jmsjca: 5:1000",
                   count=6, size=2),
    MessageOutcome(Kind.DEAD_LETTERED, 100, "ID:7", "/queue/o",
                   reason=MQRC_BACKOUT_THRESHOLD_REACHED, detail="jmsjca: 50:move(queue:dlq)",
                   queue="/queue/dlq", count=51, size=2),
    MessageOutcome(Kind.UNDELIVERED, 100, "ID:8", "/queue/o",
                   reason=MQRC_BACKOUT_THRESHOLD_REACHED, queue="/queue/jms-bridge.undelivered",
                   count=5),
    MessageOutcome(Kind.DELETED, 100, "ID:9", "/queue/o", reason=MQRC_BACKOUT_THRESHOLD_REACHED,
                   count=3),
    # The staging engine's failures: a report, and an expired message kept as undelivered.
    MessageOutcome(Kind.REPORTED, 6010, "ID:10", "/queue/a", reason=MQFB_EXPIRATION,
                   detail="expiration", queue="/queue/replies"),
    MessageOutcome(Kind.UNDELIVERED, 6010, "ID:11", "/queue/a", 6000, 5000, reason=MQFB_EXPIRATION,
                   queue="/queue/jms-bridge.undelivered"),
]


def spec(tmp_path: Path, **kw: object) -> JournalSpec:
    return JournalSpec(str(tmp_path), "host-1", "rabbitmq", **kw)  # type: ignore[arg-type]


def lines(tmp_path: Path) -> list[dict[str, object]]:
    out = []
    for f in sorted(tmp_path.glob("*.jsonl")):
        out.extend(json.loads(line) for line in f.read_text().splitlines())
    return out


def test_every_outcome_but_a_hop_is_one_line_by_the_schema(tmp_path: Path) -> None:
    writer = JournalWriter(spec(tmp_path), "engine").start()
    sink = JournalSink(writer)
    sink([*EVERY_KIND[:3], MessageOutcome(Kind.HOPPED, 5, count=40),
          MessageOutcome(Kind.RETRIED, 5, "ID:1", "/queue/a", reason=MQFB_EXPIRATION),
          MessageOutcome(Kind.KEPT, 5, "ID:1", "/queue/a", reason=MQFB_EXPIRATION)])
    sink(EVERY_KIND[3:])
    writer.close()
    got = lines(tmp_path)
    assert [g["event"] for g in got] == [o.kind.value for o in EVERY_KIND]
    for g in got:
        VALIDATOR.validate(g)
        assert g["v"] == 1 and g["broker"] == "rabbitmq" and g["instance"] == "host-1"
        assert g["process"] == "engine"
    released = got[2]
    assert released == {"v": 1, "time": 6003, "event": "released", "broker": "rabbitmq",
                        "instance": "host-1", "process": "engine", "message_id": "ID:1",
                        "destination": "/queue/a", "size": 5, "due": 6000, "late_ms": 3}
    assert got[3]["late_ms"] == -3000  # released on an operator's order: early on purpose
    assert got[1]["reason"] == "MQRC_EXPIRY_ERROR" and got[1]["reason_code"] == 2013
    assert got[4]["reason"] == "MQFB_EXPIRATION"
    assert got[8]["delivery_count"] == 6 and got[8]["delay_ms"] == 1000 and "due" not in got[8]
    assert got[9]["queue"] == "/queue/dlq" and got[9]["reason_code"] == 2362
    assert writer.written == len(EVERY_KIND) and writer.dropped == 0


def test_the_schema_refuses_what_is_not_an_event() -> None:
    good = record(EVERY_KIND[2], broker="activemq", instance="h-1", role="engine")
    VALIDATOR.validate(good)
    for bad in ({**good, "event": "hopped"}, {**good, "v": 2}, {**good, "extra": 1},
                {k: v for k, v in good.items() if k != "late_ms"},
                {**good, "reason": "MQRC_X"}):
        with pytest.raises(jsonschema.ValidationError):
            VALIDATOR.validate(bad)


def test_files_rotate_by_size_and_only_whole_files_have_the_final_name(tmp_path: Path) -> None:
    writer = JournalWriter(spec(tmp_path, max_bytes=2000), "bridge").start()
    sink = JournalSink(writer)
    for i in range(100):
        sink([MessageOutcome(Kind.STAGED, i, f"ID:{i}", "/queue/a", i + 5000, size=1)])
    writer.close()
    assert not list(tmp_path.glob("*.tmp"))
    files = sorted(tmp_path.glob("*.jsonl"))
    assert len(files) > 5
    for f in files:
        assert f.stat().st_size < 2000 + 300  # rotated at the first batch past the limit
        assert f.read_text().endswith("\n")
        assert f"-{os.getpid()}-bridge-" in f.name
    assert [g["message_id"] for g in lines(tmp_path)] == [f"ID:{i}" for i in range(100)]


def test_an_open_file_is_only_a_tmp_file_and_rotates_by_age(tmp_path: Path) -> None:
    now = [1000.0]
    writer = JournalWriter(spec(tmp_path, max_age_s=10), "bridge", clock=lambda: now[0]).start()
    sink = JournalSink(writer)
    sink(EVERY_KIND[:1])
    _wait(lambda: writer.written == 1)
    assert len(list(tmp_path.glob("*.jsonl.tmp"))) == 1
    assert not list(tmp_path.glob("*.jsonl"))  # a reader sees nothing yet
    now[0] += 11
    sink(EVERY_KIND[1:2])  # wakes the writer, which finds its file too old after writing
    _wait(lambda: len(list(tmp_path.glob("*.jsonl"))) == 1)
    assert not list(tmp_path.glob("*.tmp"))
    writer.close()


def test_a_full_queue_drops_and_counts_never_waits(tmp_path: Path) -> None:
    writer = JournalWriter(spec(tmp_path), "bridge", queue_batches=2)  # not started: no drain
    sink = JournalSink(writer)
    for _ in range(5):
        sink(EVERY_KIND[:3])
    assert writer.dropped == 9
    registry = CollectorRegistry()
    register(registry, writer.counters, [4, 1, 2])
    text = generate_latest(registry).decode()
    assert "jms_bridge_journal_dropped_total 12.0" in text
    assert "jms_bridge_journal_written_total 4.0" in text


def test_a_disk_error_drops_and_counts_and_leaves_no_half_file(tmp_path: Path) -> None:
    folder = tmp_path / "j"
    writer = JournalWriter(spec(folder), "bridge").start()
    sink = JournalSink(writer)
    sink(EVERY_KIND[:2])
    _wait(lambda: writer.written == 2)
    for f in folder.iterdir():
        f.unlink()
    folder.rmdir()  # the folder is gone: the next file cannot be opened
    writer._close_file()  # noqa: SLF001 -- the same as a rotation, from the test's thread
    sink(EVERY_KIND[2:5])
    _wait(lambda: writer.dropped >= 3)
    writer.close()
    assert writer.written + writer.dropped == 5
    assert not folder.exists() or not list(folder.glob("*.jsonl"))


def test_a_killed_writers_tmp_file_is_finished_at_its_last_whole_line(tmp_path: Path) -> None:
    dead = tmp_path / "h-999999999-engine-1-00001.jsonl.tmp"
    dead.write_text('{"a": 1}\n{"b": 2}\n{"c": ')
    alive = tmp_path / f"h-{os.getpid()}-engine-1-00001.jsonl.tmp"
    alive.write_text('{"a": 1}\n')
    other_host = tmp_path / "g-999999999-engine-1-00001.jsonl.tmp"
    other_host.write_text('{"a": 1}\n')
    assert finish_orphans(tmp_path, "h") == [tmp_path / "h-999999999-engine-1-00001.jsonl"]
    assert (tmp_path / "h-999999999-engine-1-00001.jsonl").read_text() == '{"a": 1}\n{"b": 2}\n'
    assert alive.exists() and other_host.exists()


def test_journal_setting_from_flag_environment_and_file(tmp_path: Path) -> None:
    assert resolve({}, environ={}).journal is None
    assert resolve({"journal": "/var/j"}, environ={}).journal == "/var/j"
    assert resolve({}, environ={"JMS_BRIDGE_JOURNAL": "/e"}).journal == "/e"
    config = tmp_path / "c.yaml"
    config.write_text("journal: /f\n")
    assert resolve({}, config_file=str(config), environ={}).journal == "/f"


def _wait(done: object, timeout: float = 5.0) -> None:
    event = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if done():  # type: ignore[operator]
            return
        event.wait(0.01)
    raise AssertionError("timed out")
