"""Redelivery through the STOMP session, without I/O: what goes to the broker, and when."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from adapters import rabbitmq
from adapters.rabbitmq_stomp import nack_requeues
from bridge.frontends.stomp import HEARTBEAT, Frame, FrameParser, serialize
from bridge.frontends.stomp.session import Output, Session, State
from bridge.intercept.chain import Chain
from bridge.intercept.redelivery import RedeliveryInterceptor, delivery_count
from bridge.staging import envelope
from bridge.staging.levels import Layout
from bridge.staging.outcomes import MessageOutcome, Sink
from policies.redelivery import compile_table

NOW = 1_800_000_000_000
TABLE = compile_table({
    "/queue/orders": "2:1000; 3:move(queue:dlq$error)",
    "/queue/gone": "delete",
})


def session(version: str = "1.2", ack: str = "client-individual",
            sinks: Sequence[Sink] = (), count_first: Sequence[str] = (),
            requeues: Callable[[str | None], bool] | None = None) -> Session:
    icpt = RedeliveryInterceptor(table=TABLE, fmt=rabbitmq.FORMAT, layout=Layout(),
                                 clock=lambda: NOW, rand=lambda: 0.5, sinks=sinks,
                                 count_first=count_first)
    s = Session(chain=Chain([icpt]), requeues=requeues)
    s.from_client(f"CONNECT\naccept-version:{version}\nhost:/\nlogin:u\npasscode:p\n\n\x00"
                  .encode())
    s.from_broker(f"CONNECTED\nversion:{version}\n\n\x00".encode())
    assert s.state is State.CONNECTED
    s.from_client(serialize("SUBSCRIBE", [("destination", "/queue/orders"), ("id", "s1"),
                                          ("ack", ack)], b""))
    s.from_client(serialize("SUBSCRIBE", [("destination", "/queue/gone"), ("id", "s2"),
                                          ("ack", ack)], b""))
    return s


def message(n: int, dest: str = "/queue/orders", *extra: tuple[str, str]) -> bytes:
    sub = "s1" if dest == "/queue/orders" else "s2"
    return serialize("MESSAGE", [("destination", dest), ("subscription", sub),
                                 ("message-id", f"T_{n}"), ("ack", f"a{n}"),
                                 ("amqp-message-id", f"M{n}"), ("app", "v"),
                                 ("content-length", "6"), *extra],
                     b"body\x00" + bytes([n]))


def frames(chunks: list[bytes], role: str = "server") -> list[Frame]:
    return [f for f in FrameParser(role=role, version="1.2").feed(b"".join(chunks))
            if f is not HEARTBEAT]  # type: ignore[misc]


def delivered(s: Session, data: bytes) -> Frame:
    (frame,) = frames(s.from_broker(data).to_client, role="client")
    return frame


def receipt(frame: Frame) -> bytes:
    return serialize("RECEIPT", [("receipt-id", frame.get("receipt") or "")], b"")


def test_a_redelivery_carries_its_delivery_count_and_a_first_delivery_the_brokers_bytes() -> None:
    s = session()
    first = message(1)
    assert "JMSXDeliveryCount" not in delivered(s, first)
    assert s.from_broker(first).to_client == [first]  # as the broker sent it, byte for byte
    again = message(2, "/queue/orders", ("redelivered", "true"))
    assert delivered(s, again).get("JMSXDeliveryCount") == "2"
    copy = message(3, "/queue/orders", (envelope.DELIVERY_COUNT, "4"))
    assert delivered(s, copy).get("JMSXDeliveryCount") == "5"
    assert delivery_count({"x-delivery-count": "2", envelope.DELIVERY_COUNT: "1"}) == 4


def test_first_deliveries_carry_the_count_where_a_pattern_asks_for_it() -> None:
    s = session(count_first=["/queue/ord*", "/queue/orders"])
    assert delivered(s, message(1)).get("JMSXDeliveryCount") == "1"
    other = session(count_first=["/queue/gone"])
    assert "JMSXDeliveryCount" not in delivered(other, message(1))


def test_a_nack_within_the_immediate_range_puts_a_copy_back_then_acks() -> None:
    s = session()
    delivered(s, message(1))
    out = s.from_client(serialize("NACK", [("id", "a1"), ("receipt", "client-r")], b""))
    (copy,) = frames(out.to_broker)
    assert copy.command == "SEND" and copy.get("destination") == "/queue/orders"
    assert copy.get(envelope.DELIVERY_COUNT) == "1" and copy.get("app") == "v"
    assert copy.get("amqp-message-id") == "M1" and copy.body == b"body\x00\x01"
    assert copy.get("message-id") is None and copy.get("ack") is None
    assert not out.hold  # a client-individual NACK does not hold the client up
    # the client's next frames that are not such a NACK or ACK wait for the broker's receipt
    later = serialize("SEND", [("destination", "/queue/x")], b"next")
    held = s.from_client(later)
    assert held.to_broker == [] and held.hold
    done = s.from_broker(receipt(copy))
    assert done.to_client == [] and done.unhold  # our receipt is not the client's
    ack, send = frames(done.to_broker)
    assert ack.command == "ACK" and ack.get("id") == "a1"
    assert ack.get("receipt") == "client-r"  # the client's NACK receipt comes with the ACK
    assert send.get("destination") == "/queue/x"


def test_the_receipt_of_a_copy_takes_its_end_of_line_along() -> None:
    """ActiveMQ ends each frame with an EOL; a receipt kept from the client must not leave
    its EOL behind: stomp.py 8 drops a frame that starts a read with two EOLs."""
    s = session()
    delivered(s, message(1))
    delivered(s, message(2))
    (first,) = frames(s.from_client(serialize("NACK", [("id", "a1")], b"")).to_broker)
    assert s.from_broker(receipt(first) + b"\n").to_client == []
    (second,) = frames(s.from_client(serialize("NACK", [("id", "a2")], b"")).to_broker)
    both = s.from_broker(receipt(second) + b"\n" + message(3) + b"\n")
    assert b"".join(both.to_client).startswith(b"MESSAGE\n")
    assert b"".join(both.to_client).endswith(b"\x00\n")  # the broker's own EOLs still pass


def test_client_individual_failures_go_on_while_copies_wait_for_receipts() -> None:
    """Each original is acknowledged when its own copy is confirmed, in whatever order the
    receipts come; an ACK of another delivery goes up at once."""
    s = session()
    for n in (1, 2, 3):
        delivered(s, message(n))
    (c1,) = frames(s.from_client(serialize("NACK", [("id", "a1")], b"")).to_broker)
    (c2,) = frames(s.from_client(serialize("NACK", [("id", "a2")], b"")).to_broker)
    (ack3,) = frames(s.from_client(serialize("ACK", [("id", "a3")], b"")).to_broker)
    assert ack3.command == "ACK" and ack3.get("id") == "a3"
    (ack2,) = frames(s.from_broker(receipt(c2)).to_broker)
    assert ack2.get("id") == "a2"
    (ack1,) = frames(s.from_broker(receipt(c1)).to_broker)
    assert ack1.get("id") == "a1"


def test_in_client_mode_a_failure_holds_the_client_until_its_copy_is_confirmed() -> None:
    """A cumulative ACK after a NACK could settle the original before its copy is safe."""
    s = session(ack="client")
    delivered(s, message(1))
    delivered(s, message(2))
    (copy,) = frames(s.from_client(serialize("NACK", [("id", "a1")], b"")).to_broker)
    held = s.from_client(serialize("ACK", [("id", "a2")], b""))
    assert held.to_broker == [] and held.hold
    ack1, ack2 = frames(s.from_broker(receipt(copy)).to_broker)
    assert (ack1.get("id"), ack2.get("id")) == ("a1", "a2")


def test_a_disconnect_with_deliveries_unsettled_fails_them_first() -> None:
    """The copies go up, then the ACKs of the originals once confirmed, then the DISCONNECT
    (an immediate redelivery is left to the broker, as when the connection drops)."""
    s = session(version="1.0", ack="client")
    delivered(s, message(1, "/queue/orders", (envelope.DELIVERY_COUNT, "2")))
    out = s.from_client(serialize("DISCONNECT", [("receipt", "bye")], b""))
    (copy,) = frames(out.to_broker)
    assert copy.command == "SEND" and copy.get(envelope.DELIVERY_COUNT) == "3"
    assert out.hold
    ack, bye = frames(s.from_broker(receipt(copy)).to_broker)
    assert (ack.command, ack.get("message-id")) == ("ACK", "T_1")
    assert (bye.command, bye.get("receipt")) == ("DISCONNECT", "bye")


def test_a_nack_in_the_delayed_range_is_staged_back_to_its_queue() -> None:
    s = session()
    delivered(s, message(1, "/queue/orders", (envelope.DELIVERY_COUNT, "2")))  # count 3
    out = s.from_client(serialize("NACK", [("id", "a1")], b""))
    (staged,) = frames(out.to_broker)
    assert staged.get("destination") == "/amq/queue/" + Layout().queue_for(1000)
    assert staged.get(envelope.TARGET) == "/queue/orders"
    assert staged.get(envelope.DUE) == str(NOW + 1000)
    assert staged.get(envelope.MESSAGE_ID) == "M1"  # the original id travels on
    assert staged.get(envelope.DELIVERY_COUNT) == "3"


def test_past_the_limit_a_nack_moves_the_message_with_why() -> None:
    s = session()
    delivered(s, message(1, "/queue/orders", (envelope.DELIVERY_COUNT, "3")))  # count 4
    (dead,) = frames(s.from_client(serialize("NACK", [("id", "a1")], b"")).to_broker)
    assert dead.get("destination") == "/queue/dlqorderserror"
    assert dead.get(envelope.REASON) == "MQRC_BACKOUT_THRESHOLD_REACHED"
    assert dead.get(envelope.REASON_CODE) == "2362"
    assert dead.get(envelope.ORIGINAL_DESTINATION) == "/queue/orders"
    assert dead.get(envelope.ORIGINAL_JMS_DESTINATION) == "Queue[orders]"
    assert dead.get(envelope.DELIVERIES_TRIED) == "4" and envelope.DELIVERY_COUNT not in dead
    assert "jmsjca" in (dead.get(envelope.POLICY) or "")


def test_a_deleting_policy_just_acks() -> None:
    s = session()
    delivered(s, message(1, "/queue/gone"))
    out = s.from_client(serialize("NACK", [("id", "a1")], b""))
    (ack,) = frames(out.to_broker)
    assert ack.command == "ACK" and ack.get("id") == "a1" and not out.hold


def test_an_abort_goes_up_first_then_copies_replace_what_it_rolled_back() -> None:
    s = session()
    delivered(s, message(1))
    s.from_client(serialize("BEGIN", [("transaction", "t")], b""))
    assert s.from_client(serialize("ACK", [("id", "a1"), ("transaction", "t")], b"")) \
        .to_broker  # relayed inside the transaction
    out = s.from_client(serialize("ABORT", [("transaction", "t")], b""))
    abort, copy = frames(out.to_broker)
    assert abort.command == "ABORT" and copy.command == "SEND"
    (ack,) = frames(s.from_broker(receipt(copy)).to_broker)
    assert ack.command == "ACK" and ack.get("transaction") is None


def test_a_lost_client_s_deliveries_are_replaced_before_the_upstream_closes() -> None:
    s = session()
    delivered(s, message(1, "/queue/orders", (envelope.DELIVERY_COUNT, "2")))  # delayed
    delivered(s, message(2, "/queue/gone"))
    delivered(s, message(3))  # redelivered at once: left to the broker
    out: Output = s.client_lost()
    assert out.close is None
    (copy,) = frames(out.to_broker)  # the deleted one needs no copy
    assert copy.get(envelope.TARGET) == "/queue/orders"
    done = s.from_broker(receipt(copy))
    acks = frames(done.to_broker)
    assert sorted(a.get("id") or "" for a in acks) == ["a1", "a2"]  # a3 is not acked
    assert done.close is not None


def test_auto_ack_deliveries_and_acks_are_untouched() -> None:
    s = session(ack="auto")
    delivered(s, message(1))
    assert s.client_lost().close is not None
    s2 = session()
    delivered(s2, message(1))
    ack = serialize("ACK", [("id", "a1")], b"")
    assert s2.from_client(ack).to_broker == [ack]


def test_stomp_1_1_acks_name_message_id_and_subscription() -> None:
    s = session(version="1.1")
    delivered(s, message(1, "/queue/gone"))
    (ack,) = frames(s.from_client(serialize("NACK", [("message-id", "T_1"),
                                                     ("subscription", "s1")], b"")).to_broker)
    assert ack.get("message-id") == "T_1" and ack.get("subscription") == "s2"


def test_an_unsubscribe_fails_its_subscriptions_deliveries_before_it_goes_up() -> None:
    """Once the UNSUBSCRIBE is up, RabbitMQ refuses an ACK of what the subscription was
    handed and ActiveMQ has taken it back: the ACKs of the originals go first. The other
    subscription's deliveries stay the client's, and the DISCONNECT after fails nothing more."""
    s = session()
    delivered(s, message(1, "/queue/orders", (envelope.DELIVERY_COUNT, "2")))  # delayed
    delivered(s, message(2, "/queue/gone"))
    delivered(s, message(3))  # redelivered at once: left to the broker
    out = s.from_client(serialize("UNSUBSCRIBE", [("id", "s1"), ("receipt", "u")], b""))
    (copy,) = frames(out.to_broker)
    assert copy.command == "SEND" and copy.get(envelope.TARGET) == "/queue/orders"
    assert out.hold
    done = s.from_broker(receipt(copy))
    ack, unsubscribe = frames(done.to_broker)
    assert (ack.command, ack.get("id")) == ("ACK", "a1")
    assert (unsubscribe.command, unsubscribe.get("receipt")) == ("UNSUBSCRIBE", "u")
    assert done.unhold
    # s2's delivery is still the client's to settle; s1's are forgotten
    (bye_ack,) = frames(s.from_client(serialize("ACK", [("id", "a2")], b"")).to_broker)
    assert bye_ack.get("id") == "a2"
    bye = serialize("DISCONNECT", [("receipt", "bye")], b"")
    assert s.from_client(bye).to_broker == [bye]


def test_an_unsubscribe_with_nothing_to_replace_goes_up_at_once() -> None:
    s = session()
    delivered(s, message(3))  # redelivered at once: the broker takes it back
    unsubscribe = serialize("UNSUBSCRIBE", [("id", "s1")], b"")
    out = s.from_client(unsubscribe)
    assert out.to_broker == [unsubscribe] and not out.hold
    assert s.client_lost().close is not None  # nothing left of s1 to fail


def test_a_client_lost_while_copies_are_in_flight_keeps_the_upstream_until_they_are_in() -> None:
    """Closing the upstream connection before the receipt would give the broker back the
    original as well as the copy it may already have taken."""
    s = session()
    delivered(s, message(1, "/queue/orders", (envelope.DELIVERY_COUNT, "2")))
    (copy,) = frames(s.from_client(serialize("NACK", [("id", "a1")], b"")).to_broker)
    assert s.client_lost().close is None
    done = s.from_broker(receipt(copy))
    (ack,) = frames(done.to_broker)
    assert ack.get("id") == "a1" and done.close is not None


def test_frames_held_behind_copies_go_up_when_the_client_is_lost() -> None:
    """An ACK the client sent before it went away is honoured, not failed with the rest."""
    s = session(ack="client")
    delivered(s, message(1, "/queue/orders", (envelope.DELIVERY_COUNT, "2")))
    delivered(s, message(2, "/queue/orders", (envelope.DELIVERY_COUNT, "2")))
    delivered(s, message(3, "/queue/orders", (envelope.DELIVERY_COUNT, "2")))
    (copy,) = frames(s.from_client(serialize("NACK", [("id", "a1")], b"")).to_broker)
    assert s.from_client(serialize("ACK", [("id", "a2")], b"")).hold
    assert s.client_lost().close is None
    done = s.from_broker(receipt(copy))
    ack1, ack2, lost = frames(done.to_broker)
    assert (ack1.get("id"), ack2.get("id")) == ("a1", "a2")
    assert lost.command == "SEND" and (lost.get("destination") or "").startswith("/amq/")
    assert done.close is None
    last = s.from_broker(receipt(lost))
    (ack3,) = frames(last.to_broker)
    assert ack3.get("id") == "a3" and last.close is not None


def test_a_disconnect_held_for_copies_then_a_lost_client_fails_each_delivery_once() -> None:
    seen: list[MessageOutcome] = []

    def sink(outcomes: Sequence[MessageOutcome]) -> None:
        seen.extend(outcomes)

    s = session(sinks=[sink])
    delivered(s, message(1, "/queue/orders", (envelope.DELIVERY_COUNT, "2")))
    delivered(s, message(3))  # redelivered at once: left to the broker, offered once
    out = s.from_client(serialize("DISCONNECT", [("receipt", "bye")], b""))
    (copy,) = frames(out.to_broker)
    assert s.client_lost().close is None
    done = s.from_broker(receipt(copy))
    ack, bye = frames(done.to_broker)
    assert ack.get("id") == "a1" and bye.command == "DISCONNECT"
    assert done.close is not None
    assert sorted(o.message_id or "" for o in seen) == ["M1", "M3"]

def _subscribed(destination: str) -> Session:
    s = session()
    s.from_client(serialize("SUBSCRIBE", [("destination", destination), ("id", "s3"),
                                          ("ack", "client-individual")], b""))
    return s


def _via(dest: str, n: int = 1) -> bytes:
    return serialize("MESSAGE", [("destination", dest), ("subscription", "s3"),
                                 ("message-id", f"T_{n}"), ("ack", f"a{n}"),
                                 ("content-length", "4")], b"body")


def test_a_message_sent_through_an_exchange_is_failed_for_the_queue_its_subscriber_reads() -> None:
    s = _subscribed("/amq/queue/orders")
    delivered(s, _via("/exchange/amq.direct/orders"))
    (copy,) = frames(s.from_client(serialize("NACK", [("id", "a1")], b"")).to_broker)
    assert copy.command == "SEND" and copy.get("destination") == "/amq/queue/orders"
    delivered(s, _via("/exchange/amq.direct/orders", 2) .replace(
        b"content-length", f"{envelope.DELIVERY_COUNT}:3\ncontent-length".encode()))
    (dead,) = frames(s.from_client(serialize("NACK", [("id", "a2")], b"")).to_broker)
    assert dead.get("destination") == "/queue/dlqorderserror"  # /queue/orders' policy
    assert dead.get(envelope.ORIGINAL_DESTINATION) == "/amq/queue/orders"


def test_a_topic_or_exchange_subscriber_s_failure_is_left_to_the_broker() -> None:
    for subscription in ("/topic/orders", "/exchange/amq.direct/orders"):
        s = _subscribed(subscription)
        delivered(s, _via(subscription))
        (nack,) = frames(s.from_client(serialize("NACK", [("id", "a1")], b"")).to_broker)
        assert nack.command == "NACK", subscription


@pytest.mark.parametrize("ack", ["client-individual", "client"])
@pytest.mark.parametrize("value", ["false", "False"])
def test_on_rabbitmq_a_nack_without_requeue_goes_up_as_sent(ack: str, value: str) -> None:
    """RabbitMQ's plugin drops or dead-letters it by the queue's own settings, as it does an
    AMQP Nack without requeue: no policy, no copy; and it settled what it covered."""
    s = session(ack=ack, requeues=nack_requeues)
    delivered(s, message(1))
    delivered(s, message(2))
    nack = serialize("NACK", [("id", "a2"), ("requeue", value), ("receipt", "r")], b"")
    out = s.from_client(nack)
    assert out.to_broker == [nack] and not out.hold
    # It settled what it covered: a NACK of the first is a failure only if it was not covered
    out = s.from_client(serialize("NACK", [("id", "a1")], b""))
    assert [f.get("amqp-message-id") for f in frames(out.to_broker) if f.command == "SEND"] == (
        [] if ack == "client" else ["M1"])


@pytest.mark.parametrize(("requeues", "value"), [
    (nack_requeues, "FALSE"),  # RabbitMQ's plugin requeues it: a failure
    (nack_requeues, "true"),
    (None, "false"),  # ActiveMQ: no such header, every NACK is a failure
])
def test_a_nack_the_broker_requeues_is_a_failure(
    requeues: Callable[[str | None], bool] | None, value: str,
) -> None:
    s = session(requeues=requeues)
    delivered(s, message(1))
    out = s.from_client(serialize("NACK", [("id", "a1"), ("requeue", value)], b""))
    (copy,) = frames(out.to_broker)
    assert copy.command == "SEND" and copy.get(envelope.DELIVERY_COUNT) == "1"


def test_the_plugins_reading_of_requeue() -> None:
    assert [nack_requeues(v) for v in (None, "true", "True", "false", "False", "FALSE", "no")] == [
        True, True, True, False, False, True, True]
