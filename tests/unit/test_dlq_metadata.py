"""What a dead letter says about itself (the bridge's, ActiveMQ's, RabbitMQ's, a staged copy
the engine could not release), and the application's message a replay puts back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adapters import activemq, rabbitmq
from adapters.base import Message
from adapters.queues import DROP, Found, Visit
from bridge.deadletter import archive, metadata, ops
from bridge.staging import envelope
from policies.errors import ConfigError
from policies.selector import ACTIVEMQ, RABBITMQ

BRIDGE = {
    "persistent": "true", "region": "EU", envelope.MESSAGE_ID: "ID:app-1",
    envelope.DELIVERY_COUNT: "6", envelope.REASON: "MQRC_BACKOUT_THRESHOLD_REACHED",
    envelope.REASON_CODE: "2362", envelope.REASON_TEXT: "delivered 6 times",
    envelope.FAILED_AT: "1795596000000", envelope.ORIGINAL_DESTINATION: "/queue/orders",
    envelope.ORIGINAL_JMS_DESTINATION: "Queue[orders]", envelope.POLICY: "jmsjca: 5:move",
    envelope.ORIGINAL + "priority": "300",  # a property the broker refused, kept plain
}


def test_bridge_dead_letter() -> None:
    info = metadata.describe(BRIDGE)
    assert (info.kind, info.reason, info.reason_code, info.original_destination) == (
        "bridge", "MQRC_BACKOUT_THRESHOLD_REACHED", 2362, "/queue/orders")
    assert (info.failed_at_ms, info.delivery_count, info.persistent, info.original_id) == (
        1795596000000, 6, True, "ID:app-1")
    out = metadata.replay_headers(BRIDGE, info, rabbitmq.FORMAT)
    assert not set(out) & metadata.BRIDGE_HEADERS
    assert out["priority"] == "300" and out["region"] == "EU"  # restored, kept
    assert out[metadata.REPLAY_OF] == "ID:app-1" and out[envelope.MESSAGE_ID] == "ID:app-1"
    moved = metadata.moved_headers({**BRIDGE, "message-id": "x", "subscription": "1"}, info)
    assert moved[envelope.REASON] == "MQRC_BACKOUT_THRESHOLD_REACHED"
    assert "message-id" not in moved and "subscription" not in moved


def test_activemq_dead_letters() -> None:
    expired = {"original-destination": "/queue/src", "persistent": "true",
               "dlqDeliveryFailureCause": "java.lang.Throwable: Message Expired. Expiration:1",
               "originalExpiration": "1", "timestamp": "1795596000000", "n": "0"}
    info = metadata.describe(expired, "ID:broker-7")
    assert (info.kind, info.reason, info.reason_code, info.original_id) == (
        "activemq", "MQFB_EXPIRATION", 258, "ID:broker-7")
    out = metadata.replay_headers(expired, info, activemq.FORMAT)
    assert out == {"persistent": "true", "timestamp": "1795596000000", "n": "0",
                   metadata.REPLAY_OF: "ID:broker-7", envelope.MESSAGE_ID: "ID:broker-7"}
    nacked = metadata.describe({"original-destination": "/queue/src"}, "ID:8")
    assert nacked.reason == "MQRC_BACKOUT_THRESHOLD_REACHED"


def test_rabbitmq_dead_letters() -> None:
    h = {"x-first-death-queue": "src", "x-first-death-reason": "expired",
         "x-first-death-exchange": "", "x-death-count": "2", "x-death-time": "1795596000000",
         "x-death-queue": "src", "x-death-reason": "expired", "amqp-message-id": "m1", "a": "b"}
    info = metadata.describe(h)
    assert (info.kind, info.reason, info.original_destination, info.delivery_count) == (
        "rabbitmq", "MQFB_EXPIRATION", "/amq/queue/src", 2)
    out = metadata.replay_headers(h, info, rabbitmq.FORMAT)
    assert out == {"amqp-message-id": "m1", "a": "b", metadata.REPLAY_OF: "m1",
                   envelope.MESSAGE_ID: "m1"}


def test_staged_copy_the_engine_could_not_release() -> None:
    staged = {envelope.TARGET: "/queue/late", envelope.DUE: "1000", envelope.SENT: "900",
              envelope.ENTERED: "950", envelope.MESSAGE_ID: "ID:s1", "correlation-id": "ID:s1",
              envelope.CORRELATION_ID: "app-corr", envelope.REASON: "MQRC_Q_FULL",
              envelope.REASON_CODE: "2053", "region": "US"}
    info = metadata.describe(staged)
    assert (info.kind, info.original_destination, info.reason_code) == (
        "staged", "/queue/late", 2053)
    out = metadata.replay_headers(staged, info, rabbitmq.FORMAT, now_ms=2000)
    assert out["correlation-id"] == "app-corr" and out["region"] == "US"
    assert envelope.TARGET not in out and envelope.REASON not in out
    assert out["amqp-message-id"] == "ID:s1" and out[metadata.REPLAY_OF] == "ID:s1"


@pytest.mark.parametrize(("name", "yes"), [
    ("jms-bridge.undelivered", True), ("jms-bridge.staging.undeliverable", True),
    ("other.staging.undeliverable", True), ("ActiveMQ.DLQ", True), ("DLQ.orders", True),
    ("orders.dlq", True), ("orders.DLQ.eu", True), ("orders-dlq", True), ("orders_DLQ", True),
    ("dlq-orders", True), ("orders.dead-letters", True), ("DeadLetters", True),
    ("orders", False), ("jms-bridge.staging.ready", False), ("dlqueue", False),
    ("orders.dlqs", False), ("xdlq", False), ("dlq_orders", False), ("orders-dlq-eu", False),
])
def test_candidate_names(name: str, yes: bool) -> None:
    assert metadata.is_candidate(name) is yes


def _rule(name: str, prefix: str = "jms-bridge.staging") -> bool:
    """The candidate rule as conditions over the name (the regular expression must agree)."""
    low = name.lower()
    return (name == metadata.UNDELIVERED or name == f"{prefix}.undeliverable"
            or name == "ActiveMQ.DLQ" or name.startswith("DLQ.") or low.endswith(".dlq")
            or "dlq" in low.split(".") or "dead" in low or "undeliver" in low
            or low.endswith("-dlq") or low.endswith("_dlq") or low.startswith("dlq-"))


def test_the_candidate_expression_says_what_the_rule_says() -> None:
    parts = ["", "dlq", "DLQ", "Dlq", ".", "-", "_", "orders", "dead", "DeAd", "undeliver",
             "x", "q", "dl"]
    names = {a + b + c for a in parts for b in parts for c in parts}
    for name in sorted(names):
        assert metadata.is_candidate(name) is _rule(name), name


def test_tibco_selector_reads_the_original_destination() -> None:
    for base in (ACTIVEMQ, RABBITMQ):
        pick = ops.Picker.of("JMSDestination = 'Queue[orders]'", base)
        assert pick(dict(BRIDGE))
        assert pick({"x-first-death-queue": "orders"})
        assert not pick({"original-destination": "/queue/other"})
        like = ops.Picker.of("JMSDestination LIKE 'Topic[p%'", base)
        assert like({envelope.ORIGINAL_DESTINATION: "/topic/prices"})
    assert ops.Picker.of("  ", ACTIVEMQ).selector is None


def visits(n: int) -> list[Visit]:
    return [Visit(Found(Message({**BRIDGE, "n": str(i)}, bytes([i, 255])), f"b{i}", i), DROP)
            for i in range(n)]


def test_archive_jsonl(tmp_path: Path) -> None:
    writer = archive.Writer(tmp_path / "out", "orders.dlq")
    path = writer.write(archive.visit_rows("orders.dlq", "rabbitmq", visits(3)))
    assert path is not None and writer.write([]) is None
    assert [p.name for p in (tmp_path / "out").iterdir()] == [path.name]  # no temporary left
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["broker_id"] for r in rows] == ["b0", "b1", "b2"]
    r = rows[1]
    assert r["schema"] == 1 and r["headers"]["n"] == "1" and r["body_base64"] == "Af8="
    assert r["reason_code"] == 2362 and r["original_destination"] == "/queue/orders"


def test_archive_parquet(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    writer = archive.Writer(tmp_path, "q", "parquet")
    path = writer.write(archive.visit_rows("q", "activemq", visits(2)))
    assert path is not None
    table = pq.read_table(path)
    assert table.num_rows == 2 and table.column("body")[1].as_py() == bytes([1, 255])
    assert dict(table.column("headers")[0].as_py())["n"] == "0"


def test_archive_bad_folder_or_format(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="cannot make the folder"):
        archive.Writer(tmp_path / "file" / "sub", "q")
    with pytest.raises(ConfigError, match="--format"):
        archive.Writer(tmp_path, "q", "csv")


def test_browse_names_each_kind_of_retry() -> None:
    """``dlq browse --json`` says whose retries it counts: the staging engine's message-retry
    (``jms-bridge-retries``, puts its target refused) and the rules handler's ACTION(RETRY)
    (``jms-bridge-dlq-retries``); no field called plain ``retries`` leaves a reader guessing."""
    headers = {**BRIDGE, envelope.RETRIES: "3", metadata.RETRIES: "1"}
    info = metadata.describe(headers)
    shown = json.loads(ops.render_entries([ops.Entry(0, "b-1", info, headers, b"x")],
                                          as_json=True, body=False))[0]
    assert (shown["message_retries"], shown["handler_retries"]) == (3, 1)
    assert "retries" not in shown
    plain = metadata.describe({"persistent": "true"}).as_dict()
    assert (plain["message_retries"], plain["handler_retries"]) == (0, 0)
