"""The interception core on protocol-neutral views: no STOMP or AMQP bytes anywhere."""

from __future__ import annotations

import asyncio

from adapters import activemq, rabbitmq
from adapters.base import PutCheck
from bridge.intercept.chain import Chain, Interceptor, Interest
from bridge.intercept.decisions import RELAY, Decision, Hold, Refuse, Rewrite
from bridge.intercept.delay import DelayInterceptor
from bridge.intercept.guard import StagingGuard
from bridge.intercept.views import Delivery, Principal, Send, Settle, Settlement, Subscribe
from bridge.staging import envelope
from bridge.staging.levels import Layout
from bridge.staging.outcomes import Kind, MessageOutcome
from bridge.staging.targets import TargetChecks, TargetKey
from policies.delay import DelayConfig
from policies.errors import Refused
from policies.reasons import (
    MQRC_EXPIRY_ERROR,
    MQRC_NOT_AUTHORIZED,
    MQRC_OPTIONS_ERROR,
    MQRC_Q_FULL,
)

NOW = 1_800_000_000_000
ALICE = Principal("alice", "secret", "/")


def delay(fmt=rabbitmq.FORMAT, targets: TargetChecks | None = None) -> DelayInterceptor:  # type: ignore[no-untyped-def]
    return DelayInterceptor(fmt=fmt, config=DelayConfig(), layout=Layout(),
                            clock=lambda: NOW, targets=targets)


def send(destination: str = "/queue/orders", **headers: str) -> Send:
    return Send(destination, {"destination": destination, **headers}, body_size=10,
                principal=ALICE)


def test_a_send_without_a_delay_is_relayed() -> None:
    assert delay().on_send(send(other="1")) is RELAY
    assert delay().on_send(send(**{"x-delay": "0"})) is RELAY


def test_a_delayed_send_becomes_its_staged_copy() -> None:
    decision = delay().on_send(send(**{"x-delay": "5000", "amqp-message-id": "M1", "app": "v"}))
    assert isinstance(decision, Rewrite)
    assert decision.destination == "/amq/queue/jms-bridge.staging.L12"
    h = dict(decision.headers)
    assert h["destination"] == decision.destination
    assert h[envelope.TARGET] == "/queue/orders" and h[envelope.DUE] == str(NOW + 5000)
    assert h["correlation-id"] == "M1" and h["amqp-message-id"] != "M1"
    assert h["app"] == "v" and "x-delay" not in h


def test_the_staged_copy_follows_the_format_the_adapter_states() -> None:
    decision = delay(activemq.FORMAT).on_send(send(AMQ_SCHEDULED_DELAY="2000"))
    assert isinstance(decision, Rewrite)
    assert decision.destination == "/queue/jms-bridge.staging.L10"  # binary levels, /queue/
    assert "amqp-message-id" not in dict(decision.headers)


def test_ibm_mq_rules_refuse_with_the_reason() -> None:
    decision = delay().on_send(send(**{"x-delay": "5000", "expiration": "10"}))
    assert isinstance(decision, Refuse) and decision.refusal.reason is MQRC_EXPIRY_ERROR


def test_an_unchecked_target_holds_the_send_until_the_broker_has_answered() -> None:
    answers = {"/topic/full": PutCheck(refused=Refused(MQRC_Q_FULL, "full"))}
    checks = TargetChecks(lambda key: answers.get(key.destination, PutCheck()))
    icpt = delay(targets=checks)
    held = icpt.on_send(send("/topic/full", **{"x-delay": "5000"}))
    assert isinstance(held, Hold)
    assert held.key == TargetKey("alice", "/", "/topic/full")
    asyncio.run(held.check())  # what the front-end's check runner does
    again = icpt.on_send(send("/topic/full", **{"x-delay": "5000"}))
    assert isinstance(again, Refuse) and again.refusal.reason is MQRC_Q_FULL


def test_a_failing_check_lets_sends_through_instead_of_holding_them() -> None:
    def broken(key: TargetKey) -> PutCheck:
        raise RuntimeError("probe bug")

    checks = TargetChecks(broken)
    held = delay(targets=checks).on_send(send("/topic/t", **{"x-delay": "5000"}))
    assert isinstance(held, Hold)
    asyncio.run(held.check())
    assert isinstance(delay(targets=checks).on_send(send("/topic/t", **{"x-delay": "5"})),
                      Rewrite)


def test_the_guard_refuses_the_staging_area_and_nothing_else() -> None:
    guard = StagingGuard(Layout())
    refused = guard.on_send(send("/amq/queue/jms-bridge.staging.L3"))
    assert isinstance(refused, Refuse) and refused.refusal.reason is MQRC_NOT_AUTHORIZED
    assert isinstance(guard.on_subscribe(Subscribe("/queue/>", ALICE)), Refuse)
    assert guard.on_send(send("/queue/jms-bridge.staging-not")) is RELAY
    assert guard.on_subscribe(Subscribe("/queue/orders", ALICE)) is RELAY


class Recorder(Interceptor):
    def __init__(self, interest: Interest, answer: Decision = RELAY) -> None:
        self.interest, self.answer = interest, answer
        self.seen: list[object] = []

    def on_send(self, send: Send) -> Decision:
        self.seen.append(send)
        return self.answer

    def on_delivery(self, delivery: Delivery) -> Decision:
        self.seen.append(delivery)
        return self.answer

    def on_settle(self, settle: Settle) -> Decision:
        self.seen.append(settle)
        return self.answer


def test_the_chain_offers_each_view_only_to_those_that_asked_and_stops_at_a_decision() -> None:
    refuse = Refuse(Refused(MQRC_NOT_AUTHORIZED, "no"))
    first = Recorder(Interest(send_headers=frozenset({"a"})))
    second = Recorder(Interest(send_headers=frozenset({"b"})), refuse)
    third = Recorder(Interest(send_headers=frozenset({"c"})))
    watcher = Recorder(Interest(settlements=True))
    chain = Chain([first, second, third, watcher])
    assert chain.interest == Interest(send_headers=frozenset({"a", "b", "c"}), settlements=True)
    assert chain.on_send(send()) is refuse
    assert len(first.seen) == 1 and len(second.seen) == 1 and third.seen == []
    assert watcher.seen == []
    lost = Settle(Settlement.LOST, ())
    assert chain.on_settle(lost) is RELAY and watcher.seen == [lost]
    assert chain.on_delivery(Delivery("/queue/a", "s", "1", {}, 0)) is RELAY


def test_interests_merge() -> None:
    a = Interest(send_mentions=("x",), subscribes=True)
    b = Interest(send_mentions=("x", "y"), deliveries=True)
    assert a | b == Interest(send_mentions=("x", "y"), subscribes=True, deliveries=True)
    assert not Interest(subscribes=True).sends and Interest(send_mentions=("x",)).sends


def test_staged_and_refused_sends_are_outcomes_for_the_sinks() -> None:
    seen: list[MessageOutcome] = []
    icpt = DelayInterceptor(fmt=rabbitmq.FORMAT, config=DelayConfig(), layout=Layout(),
                            clock=lambda: NOW, sinks=[seen.extend])
    icpt.on_send(send(**{"x-delay": "5000", "amqp-message-id": "M1"}))
    icpt.on_send(send(**{"x-delay": "-1"}))
    staged, refused = seen
    assert staged.kind is Kind.STAGED and staged.message_id == "M1"
    assert staged.queue == "jms-bridge.staging.L12" and staged.due_ms == NOW + 5000
    assert refused.kind is Kind.REFUSED and refused.reason is MQRC_OPTIONS_ERROR
