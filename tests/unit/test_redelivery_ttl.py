"""A copy's time to live counts from the original send: the stamp on a send with a relative TTL,
and what the redelivery interceptor makes of a failed delivery's TTL, without I/O."""

from __future__ import annotations

from types import MappingProxyType

from adapters import activemq, rabbitmq
from adapters.base import StagedFormat
from bridge.intercept.decisions import RELAY, Copy, Replace, Stamp
from bridge.intercept.expiry import ExpiryStamp
from bridge.intercept.redelivery import RedeliveryInterceptor
from bridge.intercept.views import Delivery, Send, Settle, Settlement
from bridge.staging import envelope
from bridge.staging.levels import Layout
from bridge.staging.outcomes import Kind, MessageOutcome
from policies.redelivery import compile_table

NOW = 1_800_000_000_000
SENT = NOW - 1000  # the original send, a second before the failure
TABLE = compile_table({
    "/queue/now": "5:move(queue:dlq)",
    "/queue/later": {"dialect": "weblogic", "redelivery-delay": 400, "redelivery-limit": 5},
    "/queue/dead": {"dialect": "weblogic", "redelivery-limit": 0,
                    "error-destination": "/queue/dlq"},
})


def fail(dest: str, headers: dict[str, str], fmt: StagedFormat = rabbitmq.FORMAT,
         ) -> tuple[Copy, list[MessageOutcome]]:
    outcomes: list[MessageOutcome] = []
    icpt = RedeliveryInterceptor(table=TABLE, fmt=fmt, layout=Layout(), clock=lambda: NOW,
                                 rand=lambda: 0.5, sinks=[outcomes.extend])
    delivery = Delivery(dest, "s1", "a1", MappingProxyType(
        {"message-id": "T_1", "amqp-message-id": "M1", **headers}), 4)
    decision = icpt.on_settle(Settle(Settlement.NACK, (delivery,)))
    assert isinstance(decision, Replace)
    (copy,) = decision.copies
    return copy, outcomes


def test_a_send_with_a_relative_ttl_is_stamped_with_its_expiry() -> None:
    stamp = ExpiryStamp(clock=lambda: SENT)
    assert stamp.on_send(Send("/queue/a", {"expiration": "2500"}, 1)) == Stamp(
        ((envelope.EXPIRES, str(SENT + 2500)),))
    for never in ("0", "", "abc", "-5", "9" * 16, "٣"):
        assert stamp.on_send(Send("/queue/a", {"expiration": never}, 1)) is RELAY, never
    assert stamp.on_send(Send("/queue/a", {"expires": str(SENT + 5)}, 1)) is RELAY


def test_expiry_is_the_earliest_the_headers_tell() -> None:
    assert envelope.expiry_ms({"expiration": "2500"}, NOW) == NOW + 2500
    assert envelope.expiry_ms({"expiration": "2500", envelope.EXPIRES: str(SENT + 2500)},
                              NOW) == SENT + 2500
    assert envelope.expiry_ms({"expires": str(SENT + 9), "expiration": "0"}, NOW) == SENT + 9
    assert envelope.expiry_ms({"expires": "0", "expiration": "x"}, NOW) is None


def test_a_copy_put_back_at_once_carries_what_is_left() -> None:
    copy, outcomes = fail("/queue/now", {"expiration": "2500",
                                         envelope.EXPIRES: str(SENT + 2500)})
    h = dict(copy.headers)
    assert copy.destination == "/queue/now"
    assert h["expiration"] == "1500" and h[envelope.EXPIRES] == str(SENT + 2500)
    assert [o.kind for o in outcomes] == [Kind.REDELIVERED]


def test_an_unstamped_copy_counts_from_its_first_failure_and_no_later() -> None:
    copy, _ = fail("/queue/now", {"expiration": "2500"})
    h = dict(copy.headers)
    assert h["expiration"] == "2500" and h[envelope.EXPIRES] == str(NOW + 2500)


def test_an_absolute_ttl_stays_as_sent() -> None:
    copy, _ = fail("/queue/now", {"expires": str(SENT + 2500)}, activemq.FORMAT)
    h = dict(copy.headers)
    assert h["expires"] == str(SENT + 2500) and "expiration" not in h


def test_a_delayed_redelivery_is_staged_with_the_expiry_of_the_send() -> None:
    copy, _ = fail("/queue/later", {"expiration": "2500", envelope.EXPIRES: str(SENT + 2500)})
    h = dict(copy.headers)
    assert copy.destination is not None and "staging" in copy.destination
    staged = envelope.Staged.of(h)
    assert staged.due_ms == NOW + 400 and staged.expires_ms == SENT + 2500
    released = envelope.released_headers(h, rabbitmq.FORMAT, now_ms=NOW + 400)
    assert released["expiration"] == str(SENT + 2500 - NOW - 400)
    assert released[envelope.EXPIRES] == str(SENT + 2500)


def test_a_dead_letter_carries_what_is_left() -> None:
    copy, outcomes = fail("/queue/dead", {"expiration": "2500",
                                          envelope.EXPIRES: str(SENT + 2500)})
    assert copy.destination == "/queue/dlq"
    assert dict(copy.headers)["expiration"] == "1500"
    assert [o.kind for o in outcomes] == [Kind.DEAD_LETTERED]


def test_a_message_whose_time_is_up_is_staged_to_expire_there() -> None:
    for dest in ("/queue/now", "/queue/later", "/queue/dead"):
        copy, outcomes = fail(dest, {"expiration": "2500", envelope.EXPIRES: str(NOW - 1),
                                     "JMS_TIBCO_PRESERVE_UNDELIVERED": "true"})
        assert copy.destination is not None and "staging" in copy.destination, dest
        staged = envelope.Staged.of(dict(copy.headers))
        assert staged.target == dest and staged.due_ms == NOW
        assert staged.expires_ms == NOW - 1  # the engine's expiry path takes it from here
        assert outcomes == []
