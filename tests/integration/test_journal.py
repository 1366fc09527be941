"""The event journal of a real bridge in front of RabbitMQ: a delayed send is journaled as
staged (by the bridge's process) and released (by its engine's), once each, with the fields the
schema promises; a refused one as refused."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import jsonschema

from bridge.app.journal import SCHEMA_PATH
from tests.integration.bridgeproc import BridgeProcess
from tests.integration.brokers import BROKERS, require
from tests.integration.clients import connect


def test_staged_and_released_are_journaled_once(tmp_path: Path) -> None:
    broker = BROKERS["rabbitmq"]
    require(broker)
    folder = tmp_path / "journal"
    prefix = f"jbt-{uuid.uuid4().hex[:8]}.staging"  # no other bridge releases ours
    bridge = BridgeProcess(
        broker.name, f"{broker.stomp_host}:{broker.stomp_port}", tmp_path / "bridge.log",
        extra=["--journal", str(folder), "--staging-prefix", prefix],
    ).start()
    queue = f"jbt-{uuid.uuid4().hex[:12]}"
    message_id = f"jt-{uuid.uuid4().hex}"
    try:
        conn, inbox = connect(bridge.stomp_port, broker.user, broker.password)
        dest = broker.queue_destination(queue)
        conn.subscribe(dest, id="d", ack="auto")
        sent_ms = time.time_ns() // 1_000_000
        conn.send(dest, "hello", headers={"x-delay": "1500", "amqp-message-id": message_id})
        (got,) = inbox.take(1, timeout=15) or [None]
        assert got is not None and got.body == "hello", bridge.log()[-3000:]
        received_ms = time.time_ns() // 1_000_000
        conn.disconnect()
        other, errors = connect(bridge.stomp_port, broker.user, broker.password)
        other.send(dest, "refused", headers={"x-delay": "5000", "expiration": "1000",
                                             "amqp-message-id": message_id + "-r"})
        time.sleep(1.0)  # the ERROR frame, and the connection closed after it
        assert bridge.metric("jms_bridge_journal_dropped_total") == 0
    finally:
        code = bridge.stop()
    assert code == 0, bridge.log()

    assert not list(folder.glob("*.tmp")), "a stopped bridge leaves only closed files"
    files = sorted(folder.glob("*.jsonl"))
    roles = {f.name.split("-")[-3] for f in files}
    assert roles == {"bridge", "engine"}, [f.name for f in files]
    assert len({f.name.rsplit("-", 4)[1] for f in files}) == 2  # two processes, two pids
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))
    events = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    for e in events:
        validator.validate(e)
    mine = [e for e in events if e.get("message_id") == message_id]
    assert sorted(e["event"] for e in mine) == ["released", "staged"], mine
    staged = next(e for e in mine if e["event"] == "staged")
    released = next(e for e in mine if e["event"] == "released")
    assert staged["process"] == "bridge" and released["process"] == "engine"
    assert staged["instance"] == released["instance"]
    for e in (staged, released):
        assert e["broker"] == "rabbitmq" and e["destination"] == dest and e["size"] == 5
        assert e["due"] == staged["due"]
    assert sent_ms <= staged["time"] <= staged["due"] - 1500 + 100
    assert staged["queue"].startswith(prefix)
    assert released["late_ms"] == released["time"] - released["due"] >= 0
    # Its time is when the broker confirmed the put, which may come after the consumer has it.
    assert released["due"] <= received_ms <= released["time"] + 1000
    (refused,) = [e for e in events if e.get("message_id") == message_id + "-r"]
    assert refused["event"] == "refused" and refused["process"] == "bridge"
    assert refused["reason"] == "MQRC_EXPIRY_ERROR" and refused["reason_code"] == 2013
    assert refused["size"] == 7

