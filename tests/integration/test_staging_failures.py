"""Every way a staged message can fail, against each real broker: a target that is full when the
message is due (RabbitMQ: ``x-max-length`` with ``reject-publish``; ActiveMQ: a ``jbt-full.*``
queue, which scripts/activemq gives a 64 kb memory limit with producer flow control failing
sends) is retried and then delivered once drained; never drained, it ends in an exception report
and the dead-letter queue, or only the report when it asked to be discarded; one that expires
while retried gets its expiration report or goes to the undelivered queue; and one whose
dead-letter destination is full too stays on the staging queues and is delivered later."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pika
import pika.exceptions
import yaml
from stomp.utils import Frame as StompPyFrame

from policies import reports
from tests.integration.bridgeproc import BridgeProcess
from tests.integration.brokers import Broker
from tests.integration.clients import connect
from tests.integration.staging_util import private_bridges

FILLER = "filler " * 1500  # 10.5 kB: a handful fill an ActiveMQ jbt-full.* queue
# Long enough for a test to fill the target after sending (the send-time check would refuse a
# full ActiveMQ target), on a loaded machine too.
DELAY = "3000"
TTL = "4500"  # for the message that expires while it is retried


class FullQueue:
    """A queue that refuses puts once ``fill`` has filled it, until ``drain``."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        tag = uuid.uuid4().hex[:10]
        if broker.name == "rabbitmq":
            self.name = f"jbt-full-{tag}"
            self.destination = f"/amq/queue/{self.name}"
            conn = pika.BlockingConnection(pika.URLParameters(broker.amqp_url or ""))
            conn.channel().queue_declare(self.name, durable=True, arguments={
                "x-max-length": 1, "x-overflow": "reject-publish"})
            conn.close()
        else:
            self.name = f"jbt-full.{tag}"
            self.destination = f"/queue/{self.name}"
        self.fillers = 0
        self.fillers_small = False

    def fill(self) -> int:
        """Put fillers until the broker refuses one; how many it took."""
        if self.broker.name == "rabbitmq":  # publish with confirms until one is nacked
            conn = pika.BlockingConnection(pika.URLParameters(self.broker.amqp_url or ""))
            channel = conn.channel()
            channel.confirm_delivery()
            try:
                for _ in range(64):
                    channel.basic_publish("", self.name, FILLER.encode(), pika.BasicProperties(
                        delivery_mode=2, headers={"filler": "1"}))
                    self.fillers += 1
            except pika.exceptions.NackError:
                pass
            finally:
                conn.close()
            assert 0 < self.fillers < 64, f"{self.destination} took {self.fillers} fillers"
            return self.fillers
        # ActiveMQ counts a message's memory high while it is being stored: the queue may refuse
        # one and take a smaller one a moment later. Fillers, then small ones, until it still
        # refuses after a pause.
        conn, inbox = connect(self.broker.stomp_port, self.broker.user, self.broker.password)
        try:
            refused = 0
            for i in range(200):
                body = FILLER if refused == 0 and not self.fillers_small else "filler"
                errors = len(inbox.errors)
                conn.send(self.destination, body,
                          headers={"receipt": f"f{i}", "persistent": "true", "filler": "1"})
                if _answered(inbox, f"f{i}", errors):
                    self.fillers, refused = self.fillers + 1, 0
                    continue
                self.fillers_small = True
                refused += 1
                if refused == 3:
                    break
                time.sleep(0.5)
            assert inbox.errors, (
                f"{self.destination} never refused a put: this ActiveMQ runs without the "
                "jbt-full.> policy of scripts/activemq/activemq.xml.in (scripts/brokers up "
                "restarts it with the current conf)")
            assert self.fillers, f"{self.destination} refused the first filler"
        finally:
            conn.disconnect()
        return self.fillers

    def subscribe(self) -> tuple[object, Callable[[int, float], list[StompPyFrame]]]:
        conn, inbox = connect(self.broker.stomp_port, self.broker.user, self.broker.password)
        conn.subscribe(self.destination, id="drain", ack="auto")
        return conn, inbox.take

    def drain(self, more: int = 0, timeout: float = 20) -> list[StompPyFrame]:
        """Take the fillers (and ``more`` messages after them, as they come)."""
        conn, take = self.subscribe()
        try:
            got = take(self.fillers + more, timeout)
        finally:
            conn.disconnect()  # type: ignore[attr-defined]
        self.fillers = 0
        return got


def _answered(inbox: object, receipt: str, errors: int, timeout: float = 5) -> bool:
    """Whether the SEND with ``receipt`` got its RECEIPT (False as soon as an ERROR came)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if receipt in inbox.receipts:  # type: ignore[attr-defined]
            return True
        if len(inbox.errors) > errors:  # type: ignore[attr-defined]
            return False
        time.sleep(0.005)
    return False


@contextmanager
def bridge_with(
    broker: Broker, tmp_path: Path, config: Mapping[str, object], *extra: str,
) -> Iterator[tuple[str, BridgeProcess]]:
    """A bridge of its own with ``config`` as its YAML file; yields its staging prefix."""
    path = tmp_path / "bridge.yaml"
    path.write_text(yaml.safe_dump(config))
    with private_bridges(broker, tmp_path, extra=("--config", str(path), *extra)) as (
        layout, (bridge,)
    ):
        yield layout.prefix, bridge


def wait_metric(bridge: BridgeProcess, name: str, at_least: float, timeout: float = 20,
                **labels: str) -> float:
    deadline = time.monotonic() + timeout
    value = 0.0
    while time.monotonic() < deadline:
        value = bridge.metric(name, **labels)
        if value >= at_least:
            return value
        time.sleep(0.2)
    raise AssertionError(f"{name}{labels} is {value}, not at least {at_least}; the bridge's log "
                         f"ends: {bridge.log()[-2000:]}")


def queue_of(broker: Broker, name: str) -> str:
    """A queue the engine declared, as a STOMP client names it without declaring it again."""
    return f"/amq/queue/{name}" if broker.name == "rabbitmq" else f"/queue/{name}"


def send(bridge: BridgeProcess, broker: Broker, destination: str, body: str,
         **headers: str) -> None:
    conn, sent = connect(bridge.stomp_port, broker.user, broker.password)
    conn.send(destination, body, headers={**headers, "receipt": "r", "persistent": "true"})
    if not sent.wait_receipt("r"):
        error = sent.wait_error(0.1)
        raise AssertionError(f"send refused: {error.headers if error else 'no receipt'}")
    conn.disconnect()


def test_a_target_full_when_due_is_retried_and_delivered_once_drained(
    broker: Broker, tmp_path: Path,
) -> None:
    full = FullQueue(broker)
    config = {"message-retry": {"count": 60, "interval-ms": 300}}
    try:
        with bridge_with(broker, tmp_path, config) as (prefix, bridge):
            send(bridge, broker, full.destination, "the delayed one", **{"x-delay": DELAY})
            fillers = full.fill()  # full during the delay
            retries = wait_metric(bridge, "jms_bridge_staging_retries_total", 2)
            got = full.drain(more=1)
            released = [f for f in got if "filler" not in f.headers]
            assert [f.body for f in released] == ["the delayed one"], got
            assert len(got) == fillers + 1
            assert bridge.metric("jms_bridge_staging_undeliverable_total") == 0
            assert bridge.settled_metric("jms_bridge_staging_released_total", 1) == 1
            log = bridge.log()
    finally:
        full.drain()
    headers = released[0].headers
    assert not any(n.startswith("jms-bridge-retr") for n in headers)
    assert "staged message refused by its target, to be tried again" in log
    assert "MQRC_Q_FULL" in log and "reconnecting" not in log
    print(f"{broker.name}: {fillers} fillers, {retries:.0f} retries before the drain")


def test_never_drained_ends_in_an_exception_report_and_the_dead_letter_queue(
    broker: Broker, tmp_path: Path,
) -> None:
    full = FullQueue(broker)
    replies = f"/queue/jbt-replies-{uuid.uuid4().hex[:10]}"
    body = "a" * 150 + "b" * 150
    config = {"message-retry": {"count": 2, "interval-ms": 300}}
    try:
        with bridge_with(broker, tmp_path, config) as (prefix, bridge):
            reader, answers = connect(broker.stomp_port, broker.user, broker.password)
            reader.subscribe(replies, id="replies", ack="auto")
            ids = {}
            if broker.name == "rabbitmq":  # a producer's own id; ActiveMQ's is the bridge's
                ids = {"kept": {"amqp-message-id": "jbt-id-kept"},
                       "discarded": {"amqp-message-id": "jbt-id-discarded"}}
            send(bridge, broker, full.destination, body, **{
                "x-delay": DELAY, "reply-to": replies, "seq": "kept",
                reports.REPORT_EXCEPTION: str(reports.MQRO_EXCEPTION_WITH_DATA),
                **ids.get("kept", {}),
            })
            send(bridge, broker, full.destination, "discard me", **{
                "x-delay": DELAY, "reply-to": replies, "seq": "discarded",
                reports.REPORT_EXCEPTION: str(reports.MQRO_EXCEPTION_WITH_FULL_DATA),
                reports.REPORT_DISCARD: str(reports.MQRO_DISCARD_MSG),
                **ids.get("discarded", {}),
            })
            full.fill()
            got = answers.take(2, timeout=20)
            reader.disconnect()
            dlq_reader, dead = connect(broker.stomp_port, broker.user, broker.password)
            dlq_reader.subscribe(queue_of(broker, f"{prefix}.undeliverable"), id="d",
                                 ack="auto")
            dead_letters = dead.take(1, timeout=10) + dead.quiet(1.0)
            dlq_reader.disconnect()
            metrics = {
                "exception": bridge.metric("jms_bridge_staging_reports_total", kind="exception"),
                "undeliverable": bridge.metric("jms_bridge_staging_dead_letters_total",
                                               reason="MQRC_Q_FULL", to="undeliverable"),
                "discard": bridge.metric("jms_bridge_staging_dead_letters_total",
                                         reason="MQRC_Q_FULL", to="discard"),
                "retries": bridge.metric("jms_bridge_staging_retries_total"),
            }
            log = bridge.log()
    finally:
        full.drain()
    by_seq = {f.headers["jms-bridge-message-id"]: f for f in got}
    assert len(by_seq) == 2, got
    for report in got:
        h = report.headers
        assert h["JMS_IBM_MsgType"] == "4" and h["JMS_IBM_Feedback"] == "2053"
        assert h["correlation-id"] == h["jms-bridge-message-id"]  # the original message id
        assert h["jms-bridge-report"] == "exception" and h["jms-bridge-reason"] == "MQRC_Q_FULL"
        assert h["jms-bridge-original-destination"] == full.destination
    bodies = sorted(f.body for f in got)
    assert bodies == sorted([body[:100], "discard me"])
    if broker.name == "rabbitmq":
        assert set(by_seq) == {"jbt-id-kept", "jbt-id-discarded"}
    [dead_letter] = dead_letters
    d = dead_letter.headers
    assert d["seq"] == "kept" and dead_letter.body == body
    assert d["jms-bridge-reason"] == "MQRC_Q_FULL" and d["jms-bridge-reason-code"] == "2053"
    assert d["jms-bridge-original-destination"] == full.destination
    assert d["jms-bridge-original-jms-destination"] == f"Queue[{full.name}]"
    assert d["jms-bridge-retries"] == "2" and d["jms-bridge-policy"] == "message-retry 2:300"
    assert d["jms-bridge-message-id"] in by_seq
    assert metrics == {"exception": 2, "undeliverable": 1, "discard": 1, "retries": 4}
    assert "exception report sent" in log


def test_a_message_that_expires_while_retried_is_reported_or_kept_undelivered(
    broker: Broker, tmp_path: Path,
) -> None:
    full = FullQueue(broker)
    replies = f"/queue/jbt-replies-{uuid.uuid4().hex[:10]}"
    undelivered = f"jbt-undelivered-{uuid.uuid4().hex[:10]}"
    config = {"message-retry": {"count": 100, "interval-ms": 300}}
    try:
        with bridge_with(broker, tmp_path, config, "--undelivered-queue", undelivered) as (
            _, bridge
        ):
            reader, answers = connect(broker.stomp_port, broker.user, broker.password)
            reader.subscribe(replies, id="replies", ack="auto")
            common = {"x-delay": DELAY, "expiration": TTL}
            send(bridge, broker, full.destination, "x" * 300, **common, **{
                "reply-to": replies, "seq": "reported",
                reports.REPORT_EXPIRATION: str(reports.MQRO_EXPIRATION_WITH_DATA)})
            send(bridge, broker, full.destination, "keep me", **common, **{
                "seq": "kept", "JMS_TIBCO_PRESERVE_UNDELIVERED": "true"})
            send(bridge, broker, full.destination, "drop me", **common, seq="dropped")
            full.fill()
            [report] = answers.take(1, timeout=20)
            reader.disconnect()
            kept_reader, kept = connect(broker.stomp_port, broker.user, broker.password)
            kept_reader.subscribe(f"/queue/{undelivered}", id="u", ack="auto")
            preserved = kept.take(1, timeout=10) + kept.quiet(0.5)
            kept_reader.disconnect()
            wait_metric(bridge, "jms_bridge_staging_expired_total", 3, timeout=10)
            metrics = {
                "expiration": bridge.metric("jms_bridge_staging_reports_total",
                                            kind="expiration"),
                "undelivered": bridge.metric("jms_bridge_staging_dead_letters_total",
                                             reason="MQFB_EXPIRATION", to="undelivered"),
                "discard": bridge.metric("jms_bridge_staging_dead_letters_total",
                                         reason="MQFB_EXPIRATION", to="discard"),
                "released": bridge.metric("jms_bridge_staging_released_total"),
            }
    finally:
        full.drain()
    h = report.headers
    assert h["JMS_IBM_Feedback"] == "258" and h["jms-bridge-reason"] == "MQFB_EXPIRATION"
    assert h["correlation-id"] == h["jms-bridge-message-id"] and report.body == "x" * 100
    [copy] = preserved
    assert copy.headers["seq"] == "kept" and copy.body == "keep me"
    assert copy.headers["jms-bridge-reason"] == "MQFB_EXPIRATION"
    assert copy.headers["jms-bridge-policy"] == "JMS_TIBCO_PRESERVE_UNDELIVERED"
    assert copy.headers["jms-bridge-original-jms-destination"] == f"Queue[{full.name}]"
    assert "expiration" not in copy.headers and copy.headers.get("expires", "0") == "0"
    assert metrics == {"expiration": 1, "undelivered": 1, "discard": 2, "released": 0}


def test_a_full_dead_letter_destination_keeps_the_message_until_it_can_be_delivered(
    broker: Broker, tmp_path: Path,
) -> None:
    target, dlq = FullQueue(broker), FullQueue(broker)
    config = {
        "message-retry": {"count": 1, "interval-ms": 400},
        "redelivery": {target.destination: {
            "dialect": "weblogic", "redelivery-limit": 5, "error-destination": dlq.destination}},
    }
    try:
        with bridge_with(broker, tmp_path, config) as (_, bridge):
            dlq_fillers = dlq.fill()  # full before the message is due
            send(bridge, broker, target.destination, "not lost", **{"x-delay": DELAY})
            target.fill()
            wait_metric(bridge, "jms_bridge_staging_dead_letter_blocked", 1)
            refused = wait_metric(bridge, "jms_bridge_staging_dead_letter_refused_total", 2)
            log = bridge.log()
            got = target.drain(more=1)
            wait_metric(bridge, "jms_bridge_staging_released_total", 1)
            blocked = bridge.metric("jms_bridge_staging_dead_letter_blocked")
            dead_letters = bridge.metric("jms_bridge_staging_dead_letters_total",
                                         reason="MQRC_Q_FULL", to="dead-letter")
            in_dlq = dlq.drain(more=1, timeout=3)
    finally:
        target.drain()
        dlq.drain()
    assert [f.body for f in got if "filler" not in f.headers] == ["not lost"]
    assert blocked == 0 and dead_letters == 0
    assert len(in_dlq) == dlq_fillers and all("filler" in f.headers for f in in_dlq)
    assert "dead-letter destination refused the message" in log
    print(f"{broker.name}: the dead-letter destination refused {refused:.0f} times")


def test_an_exception_report_reaches_the_senders_temporary_queue(
    broker: Broker, tmp_path: Path,
) -> None:
    """JMS's request pattern: the reply-to is the sender's TemporaryQueue (STOMP /temp-queue/),
    and the report comes back on the sender's own connection through the bridge."""
    full = FullQueue(broker)
    try:
        with bridge_with(broker, tmp_path, {"message-retry": "0:300"}) as (_, bridge):
            conn, inbox = connect(bridge.stomp_port, broker.user, broker.password)
            if broker.name == "activemq":  # RabbitMQ subscribes the sender by itself
                conn.subscribe("/temp-queue/jbt-reports", id="reports", ack="auto")
            conn.send(full.destination, "who asked?", headers={
                "x-delay": DELAY, "reply-to": "/temp-queue/jbt-reports", "receipt": "r",
                reports.REPORT_EXCEPTION: str(reports.MQRO_EXCEPTION_WITH_FULL_DATA)})
            assert inbox.wait_receipt("r"), inbox.wait_error(0.1)
            full.fill()
            got = inbox.take(1, timeout=20)
            conn.disconnect()
            log = bridge.log()
    finally:
        full.drain()
    assert got, f"no report; the bridge's log ends: {log[-1500:]}"
    [report] = got
    assert report.headers["JMS_IBM_Feedback"] == "2053" and report.body == "who asked?"
    assert report.headers["JMS_IBM_MsgType"] == "4"
