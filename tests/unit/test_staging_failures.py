"""Every way a staged message can fail, against the in-memory broker with the test clock:
message-retry, reports, the dead-letter homes, and a dead-letter destination that refuses."""

from __future__ import annotations

import pytest
from structlog.testing import CapturingLogger

from adapters.base import Message
from bridge.staging import envelope
from bridge.staging.engine import Engine
from bridge.staging.failures import FailureSettings
from bridge.staging.outcomes import Kind, MessageOutcome
from bridge.staging.staging_stats import StagingStats
from policies import reports
from policies.reasons import MQRC_NOT_AUTHORIZED, MQRC_Q_FULL, MQRC_UNKNOWN_OBJECT_NAME
from policies.redelivery import compile_table
from policies.retry import MessageRetry, RetryTable
from tests.unit.memory_broker import MemoryBroker
from tests.unit.test_staging_engine import LAYOUT, T0, TARGET, Clock, drive, engine_for, releases

UNDELIVERABLE = f"{LAYOUT.prefix}.undeliverable"
REPLIES = "/queue/replies"
BODY = bytes(range(256)) * 2  # 512 bytes


def stage(
    broker: MemoryBroker, *, delay_ms: int, now: int = T0, target: str = TARGET,
    ttl_ms: int | None = None, headers: dict[str, str] | None = None,
) -> str:
    original = [("destination", target), ("x-app", "kept"), ("correlation-id", "app-corr"),
                *(headers or {}).items()]
    if ttl_ms is not None:
        original.append(("expiration", str(ttl_ms)))
    staged = envelope.staged_headers(
        original, broker.format, target=target,
        staging_destination=broker.format.client_destination(LAYOUT.queue_for(delay_ms)),
        due_ms=now + delay_ms, sent_ms=now,
        expires_ms=None if ttl_ms is None else now + ttl_ms, drop=(),
    )
    message = Message({n: v for n, v in staged if n != "destination"}, BODY)
    broker.put(LAYOUT.queue_for(delay_ms), message)
    return message.headers[envelope.MESSAGE_ID]


TWICE = MessageRetry(2, 1000)


def setup(
    name: str = "rabbitmq", *, retry: MessageRetry = TWICE, redelivery: object = None,
) -> tuple[Clock, MemoryBroker, Engine, StagingStats, CapturingLogger, list[MessageOutcome]]:
    clock = Clock()
    broker = MemoryBroker(name, clock=clock)
    seen: list[MessageOutcome] = []
    failures = FailureSettings(RetryTable(retry), compile_table(redelivery),
                               "jbt-undelivered")
    engine, stats, log = engine_for(broker, clock, failures=failures, sinks=[seen.extend])
    return clock, broker, engine, stats, log, seen


def on(broker: MemoryBroker, queue: str) -> list[Message]:
    return [e.message for e in broker.queues.get(queue, ())]


BOTH = pytest.mark.parametrize("name", ["rabbitmq", "activemq"])


@BOTH
def test_a_full_target_is_retried_at_the_interval_and_delivered_once_drained(name: str) -> None:
    clock, broker, engine, stats, log, seen = setup(name, retry=MessageRetry(5, 1000))
    broker.refuse(TARGET, MQRC_Q_FULL, "the broker nacked the message")
    others = [stage(broker, delay_ms=5_000 + i) for i in range(3)]
    full = stage(broker, delay_ms=4_000, target=TARGET)
    drive(engine, clock, T0 + 5_500)  # the release at 4 s and a retry at 5 s refused
    # The others are refused at 5 s too (same target), each retried on its own.
    assert stats.retries == 2 + 3
    del broker.refusals[TARGET]
    drive(engine, clock, T0 + 9_000)
    got = releases(broker)
    assert got[full] == [T0 + 6_000]  # the third try, 1 s after the second
    assert all(len(got[m]) == 1 for m in others)
    [(_, released)] = [(t, m) for t, m in broker.delivered(TARGET)
                       if m.headers[envelope.MESSAGE_ID] == full]
    # Released as the application sent it, its delivery time the original due time.
    assert released.headers[envelope.DELIVERY_TIME] == str(T0 + 4_000)
    assert not any(n.startswith(envelope.PREFIX + "retr") for n in released.headers)
    assert released.headers["correlation-id"] == "app-corr" and released.body == BODY
    assert stats.retries == 5 and stats.undeliverable == 0 and stats.reconnects == 0
    retried = [o for o in seen if o.kind is Kind.RETRIED and o.message_id == full]
    assert [o.count for o in retried] == [1, 2] and retried[0].reason is MQRC_Q_FULL
    assert not on(broker, UNDELIVERABLE)


def test_a_release_refused_for_good_is_not_retried() -> None:
    clock, broker, engine, stats, _, _ = setup()
    broker.refuse(TARGET, MQRC_NOT_AUTHORIZED, "ACCESS_REFUSED")
    mid = stage(broker, delay_ms=2_000)
    drive(engine, clock, T0 + 10_000)
    assert stats.retries == 0 and stats.undeliverable == 1
    [dead] = on(broker, UNDELIVERABLE)
    assert dead.headers[envelope.MESSAGE_ID] == mid
    assert dead.headers[envelope.REASON] == "MQRC_NOT_AUTHORIZED"


@BOTH
def test_never_drained_ends_in_an_exception_report_and_the_dead_letter_queue(name: str) -> None:
    clock, broker, engine, stats, log, seen = setup(name)
    broker.refuse(TARGET, MQRC_Q_FULL, "queue full")
    mid = stage(broker, delay_ms=2_000, headers={
        reports.REPORT_EXCEPTION: str(reports.MQRO_EXCEPTION_WITH_DATA),
        "reply-to": REPLIES, "persistent": "true",
    })
    drive(engine, clock, T0 + 10_000)
    assert stats.retries == 2 and stats.undeliverable == 1 and stats.reports_exception == 1
    [report] = on(broker, "replies")
    h = report.headers
    assert h["JMS_IBM_MsgType"] == "4" and h["JMS_IBM_Feedback"] == "2053"
    assert h["correlation-id"] == mid and h[envelope.REPORT] == "exception"
    assert h[envelope.REASON] == "MQRC_Q_FULL" and h[envelope.ORIGINAL_DESTINATION] == TARGET
    assert h["persistent"] == "true"
    assert report.body == BODY[:100]
    [dead] = on(broker, UNDELIVERABLE)
    d = dead.headers
    assert d[envelope.MESSAGE_ID] == mid and dead.body == BODY
    assert d[envelope.REASON] == "MQRC_Q_FULL" and d[envelope.REASON_CODE] == "2053"
    assert d[envelope.ORIGINAL_DESTINATION] == TARGET
    assert d[envelope.ORIGINAL_JMS_DESTINATION] == "Queue[orders]"
    assert d[envelope.RETRIES] == "2" and d[envelope.FAILED_AT] == str(T0 + 4_000)
    assert d[envelope.DELIVERIES_TRIED] == "0" and d["correlation-id"] == "app-corr"
    assert envelope.DELIVERY_COUNT not in d
    assert d[envelope.POLICY] == "message-retry 2:1000" and "put 3 times" in d[
        envelope.REASON_TEXT]
    assert d["x-app"] == "kept" and "expiration" not in d
    kinds = [o.kind for o in seen if o.message_id == mid]
    assert kinds == [Kind.RETRIED, Kind.RETRIED, Kind.REPORTED, Kind.UNDELIVERABLE]
    assert broker.held_count == 0 and all(broker.depth(q) == 0 for q in LAYOUT.queues)
    assert stats.dead_letters() == {("MQRC_Q_FULL", "undeliverable"): 1}


def test_discard_msg_with_a_full_data_report_keeps_nothing() -> None:
    clock, broker, engine, stats, _, seen = setup(retry=MessageRetry(0, 1000))
    broker.refuse(TARGET, MQRC_UNKNOWN_OBJECT_NAME, "no queue")
    mid = stage(broker, delay_ms=2_000, headers={
        reports.REPORT_EXCEPTION: str(reports.MQRO_EXCEPTION_WITH_FULL_DATA),
        reports.REPORT_DISCARD: str(reports.MQRO_DISCARD_MSG), "reply-to": REPLIES,
    })
    drive(engine, clock, T0 + 5_000)
    [report] = on(broker, "replies")
    assert report.body == BODY and report.headers["JMS_IBM_Feedback"] == "2085"
    assert not on(broker, UNDELIVERABLE) and stats.undeliverable == 0
    assert [o.kind for o in seen if o.message_id == mid] == [Kind.REPORTED, Kind.DELETED]
    assert stats.dead_letters() == {("MQRC_UNKNOWN_OBJECT_NAME", "discard"): 1}
    assert broker.held_count == 0 and all(broker.depth(q) == 0 for q in LAYOUT.queues)


def test_a_report_the_reply_to_refuses_goes_to_the_dead_letter_queue_with_the_original() -> None:
    clock, broker, engine, stats, _, _ = setup(retry=MessageRetry(0, 1000))
    broker.refuse(TARGET, MQRC_Q_FULL, "full")
    broker.refuse(REPLIES, MQRC_UNKNOWN_OBJECT_NAME, "no reply queue")
    stage(broker, delay_ms=2_000, headers={
        reports.REPORT_EXCEPTION: str(reports.MQRO_EXCEPTION),
        reports.REPORT_DISCARD: str(reports.MQRO_DISCARD_MSG), "reply-to": REPLIES,
    })
    drive(engine, clock, T0 + 5_000)
    dead = on(broker, UNDELIVERABLE)
    assert [m.headers.get(envelope.REPORT) for m in dead] == ["exception", None]
    assert "the report to /queue/replies was refused" in dead[1].headers[envelope.REASON_TEXT]
    assert stats.reports_refused == 1 and stats.reports_exception == 0


def test_expiry_report_and_a_plain_expiry_discarded() -> None:
    clock, broker, engine, stats, _, seen = setup()
    plain = stage(broker, delay_ms=3_000, ttl_ms=2_500)
    asked = stage(broker, delay_ms=3_000, ttl_ms=2_500, headers={
        reports.REPORT_EXPIRATION: str(reports.MQRO_EXPIRATION_WITH_FULL_DATA),
        "reply-to": REPLIES,
    })
    drive(engine, clock, T0 + 5_000)
    assert not broker.delivered(TARGET) and not on(broker, UNDELIVERABLE)
    [report] = on(broker, "replies")
    assert report.headers["JMS_IBM_Feedback"] == "258"
    assert report.headers["correlation-id"] == asked and report.body == BODY
    assert report.headers[envelope.REASON] == "MQFB_EXPIRATION"
    assert stats.expired == 2 and stats.reports_expiration == 1
    assert {o.message_id for o in seen if o.kind is Kind.EXPIRED} == {plain, asked}


def test_preserve_undelivered_keeps_the_expired_and_the_refused() -> None:
    clock, broker, engine, stats, _, seen = setup(retry=MessageRetry(0, 1000))
    broker.refuse("/queue/full", MQRC_Q_FULL, "full")
    keep = {"JMS_TIBCO_PRESERVE_UNDELIVERED": "true"}
    expired = stage(broker, delay_ms=3_000, ttl_ms=2_500, headers=keep)
    refused = stage(broker, delay_ms=3_000, target="/queue/full", headers=keep)
    drive(engine, clock, T0 + 5_000)
    kept = {m.headers[envelope.MESSAGE_ID]: m.headers for m in on(broker, "jbt-undelivered")}
    assert set(kept) == {expired, refused}
    assert kept[expired][envelope.REASON] == "MQFB_EXPIRATION"
    assert kept[expired][envelope.POLICY] == "JMS_TIBCO_PRESERVE_UNDELIVERED"
    assert kept[refused][envelope.REASON] == "MQRC_Q_FULL"
    assert kept[refused][envelope.ORIGINAL_JMS_DESTINATION] == "Queue[full]"
    assert stats.expired == 1 and stats.undeliverable == 0
    assert {o.kind for o in seen if o.message_id in kept} == {Kind.UNDELIVERED}


def test_a_policys_dead_letter_and_expiry_destinations() -> None:
    clock, broker, engine, stats, _, _ = setup(retry=MessageRetry(0, 1000), redelivery={
        "/queue/orders": {"dialect": "artemis", "dead-letter-address": "/queue/DLA",
                          "expiry-address": "/queue/EXP"}})
    broker.refuse(TARGET, MQRC_Q_FULL, "full")
    refused = stage(broker, delay_ms=3_000)
    expired = stage(broker, delay_ms=3_000, ttl_ms=1_000)
    drive(engine, clock, T0 + 5_000)
    [dla] = on(broker, "DLA")
    [exp] = on(broker, "EXP")
    assert dla.headers[envelope.MESSAGE_ID] == refused
    assert dla.headers[envelope.POLICY].startswith("message-retry 0:1000; artemis: ")
    assert exp.headers[envelope.MESSAGE_ID] == expired
    assert stats.dead_letters() == {("MQRC_Q_FULL", "dead-letter"): 1,
                                    ("MQFB_EXPIRATION", "dead-letter"): 1}


@BOTH
def test_a_dead_letter_destination_that_refuses_keeps_the_message_staged(name: str) -> None:
    clock, broker, engine, stats, log, seen = setup(name, retry=MessageRetry(1, 1000))
    broker.refuse(TARGET, MQRC_Q_FULL, "full")
    broker.refuse(broker.format.client_destination(UNDELIVERABLE), MQRC_Q_FULL, "dlq full")
    mid = stage(broker, delay_ms=2_000)
    drive(engine, clock, T0 + 6_500)  # release at 2 s, retry at 3 s, kept at 3, 4, 6 s
    assert stats.blocked == 1 and stats.kept == 3 and stats.reconnects == 0
    assert not on(broker, UNDELIVERABLE) and broker.held_count <= 1
    assert sum(broker.depth(q) for q in LAYOUT.queues) == 1  # held ones counted
    warnings = [c for c in log.calls if c.kwargs["event"].startswith("dead-letter destination")]
    assert [c.method_name for c in warnings] == ["warning", "warning"]  # the 3rd: debug
    assert warnings[0].kwargs["message_id"] == mid
    del broker.refusals[TARGET]  # the target drained: delivered, not dead-lettered
    drive(engine, clock, T0 + 9_900)
    assert not releases(broker)  # kept the third time at 6 s: tried again 4 s later
    drive(engine, clock, T0 + 10_100)
    assert releases(broker) == {mid: [T0 + 10_000]} and stats.blocked == 0
    assert not on(broker, UNDELIVERABLE)
    assert all(broker.depth(q) == 0 for q in LAYOUT.queues) and broker.held_count == 0


def test_a_release_now_order_refused_falls_to_message_retry() -> None:
    """An operator's release-now of a message whose target is full: tried at once, then at the
    message-retry interval, not again and again at once."""
    from bridge.staging.orders import Order, OrderAction

    clock, broker, engine, stats, _, _ = setup(retry=MessageRetry(3, 1000))
    broker.refuse(TARGET, MQRC_Q_FULL, "full")
    mid = stage(broker, delay_ms=600_000)
    engine.step(clock.now)
    engine.orders.take(Order.new(OrderAction.RELEASE, mid, "").message(), clock.now)
    drive(engine, clock, T0 + 2_500)
    assert stats.retries == 3 and stats.undeliverable == 0  # at 0, 1 and 2 s
    drive(engine, clock, T0 + 10_000)
    assert stats.undeliverable == 1 and not broker.delivered(TARGET)


def test_a_temporary_reply_queue_is_a_destination_and_an_unknown_reply_to_a_refusal() -> None:
    """A STOMP client's /temp-queue/ reply-to reads /reply-queue/<q> on RabbitMQ: the adapter
    puts to it; a reply-to no adapter can name is a refused report, not a crash."""
    from adapters.rabbitmq_stomp import Route, route

    assert route("/reply-queue/amq.gen-Xy") == Route("", "amq.gen-Xy", queue=True)

    class Unnameable(MemoryBroker):
        def publish(self, destination: str, message: Message) -> None:
            if destination.startswith("/nowhere/"):
                raise ValueError(f"unsupported destination {destination!r}")
            super().publish(destination, message)

    clock = Clock()
    broker = Unnameable(clock=clock)
    failures = FailureSettings(RetryTable(MessageRetry(0, 1000)), compile_table(None))
    engine, stats, _ = engine_for(broker, clock, failures=failures)
    broker.refuse(TARGET, MQRC_Q_FULL, "full")
    stage(broker, delay_ms=2_000, headers={
        reports.REPORT_EXCEPTION: str(reports.MQRO_EXCEPTION), "reply-to": "/nowhere/x"})
    drive(engine, clock, T0 + 5_000)
    assert stats.reports_refused == 1 and stats.reconnects == 0
    assert [m.headers.get(envelope.REPORT) for m in on(broker, UNDELIVERABLE)] == [
        "exception", None]
