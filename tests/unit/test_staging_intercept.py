from __future__ import annotations

import pytest

from adapters import activemq, rabbitmq
from bridge.frontends.stomp import FrameParser, serialize
from bridge.frontends.stomp.session import Session, State
from bridge.intercept.chain import Chain
from bridge.intercept.delay import DelayInterceptor
from bridge.intercept.guard import StagingGuard
from bridge.staging import envelope
from bridge.staging.levels import Layout
from policies.delay import DelayConfig

NOW = 1_800_000_000_000


FORMATS = {"rabbitmq": rabbitmq.FORMAT, "activemq": activemq.FORMAT}


def interceptor(broker: str = "rabbitmq", **config: object) -> Chain:
    """The chain the bridge runs: the staging guard, then delivery delay."""
    delay = DelayInterceptor(fmt=FORMATS[broker], config=DelayConfig(**config),  # type: ignore[arg-type]
                             layout=Layout(), clock=lambda: NOW)
    return Chain([StagingGuard(Layout()), delay])


def connected(chain: Chain) -> Session:
    s = Session(chain=chain)
    s.from_client(b"CONNECT\naccept-version:1.2\nhost:/\nlogin:u\npasscode:p\n\n\x00")
    s.from_broker(b"CONNECTED\nversion:1.2\nheart-beat:0,0\n\n\x00")
    assert s.state is State.CONNECTED
    return s


def send(headers: list[tuple[str, str]], body: bytes = b"payload\x00bytes") -> bytes:
    return serialize("SEND", [*headers, ("content-length", str(len(body)))], body)


def parse(data: bytes):  # type: ignore[no-untyped-def]
    (frame,) = FrameParser(role="server", version="1.2").feed(data)
    return frame


def test_undelayed_send_is_relayed_byte_for_byte() -> None:
    s = connected(interceptor())
    raw = send([("destination", "/queue/a"), ("x-other", "1")])
    assert s.from_client(raw).to_broker == [raw]


def test_zero_delay_is_relayed_unchanged() -> None:
    s = connected(interceptor())
    raw = send([("destination", "/queue/a"), ("x-delay", "0")])
    assert s.from_client(raw).to_broker == [raw]


@pytest.mark.parametrize(("delay", "queue"), [(5, "ready"), (1500, "L10"), (5000, "L12"),
                                              (30 * 86_400_000, "L31")])
def test_delayed_send_is_staged_on_its_level(delay: int, queue: str) -> None:
    s = connected(interceptor())
    out = s.from_client(send([("destination", "/queue/orders"), ("x-delay", str(delay)),
                              ("receipt", "r1"), ("transaction", "tx1"), ("app", "v"),
                              ("correlation-id", "app-corr"), ("amqp-message-id", "M1"),
                              ("expiration", str(delay * 2)), ("persistent", "true")]))
    staged = parse(out.to_broker[0])
    h = dict(staged.headers)
    assert h["destination"] == f"/amq/queue/jms-bridge.staging.{queue}"
    assert "x-delay" not in h and "expiration" not in h
    assert h["receipt"] == "r1" and h["transaction"] == "tx1"  # the broker confirms / commits
    assert h[envelope.TARGET] == "/queue/orders"
    assert h[envelope.DUE] == str(NOW + delay) and h[envelope.SENT] == str(NOW)
    assert h[envelope.EXPIRES] == str(NOW + delay * 2)
    # IBM MQ: a new message id, the original one as the correlation id.
    assert h["correlation-id"] == "M1" and h[envelope.MESSAGE_ID] == "M1"
    assert h["amqp-message-id"] != "M1"
    assert h[envelope.CORRELATION_ID] == "app-corr"
    assert h["app"] == "v" and h["persistent"] == "true"
    assert staged.body == b"payload\x00bytes"


def test_bridge_assigns_a_message_id_when_the_producer_set_none() -> None:
    s = connected(interceptor("activemq"))
    out = s.from_client(send([("destination", "/topic/t"), ("AMQ_SCHEDULED_DELAY", "2000")]))
    h = dict(parse(out.to_broker[0]).headers)
    assert h["destination"] == "/queue/jms-bridge.staging.L10"
    assert h[envelope.MESSAGE_ID].startswith("ID:jms-bridge-")
    assert h["correlation-id"] == h[envelope.MESSAGE_ID]
    assert "AMQ_SCHEDULED_DELAY" not in h  # ActiveMQ's own scheduler must never see it


def test_absolute_delivery_time() -> None:
    s = connected(interceptor())
    out = s.from_client(send([("destination", "/queue/a"), ("JMSDeliveryTime", str(NOW + 7000))]))
    h = dict(parse(out.to_broker[0]).headers)
    assert h[envelope.DUE] == str(NOW + 7000) and "JMSDeliveryTime" not in h


@pytest.mark.parametrize(
    ("headers", "reason", "code"),
    [
        ([("x-delay", "5000"), ("expiration", "1000")], "MQRC_EXPIRY_ERROR", "2013"),
        ([("x-delay", "5000"), ("JMSXGroupID", "g")], "MQRC_OPTIONS_ERROR", "2046"),
        ([("x-delay", "5000"), ("JMS_IBM_RETAIN", "1")], "MQRC_OPTIONS_ERROR", "2046"),
        ([("x-delay", "soon")], "MQRC_OPTIONS_ERROR", "2046"),
        ([("x-delay", "-1")], "MQRC_OPTIONS_ERROR", "2046"),
    ],
)
def test_refusal_reaches_the_client_as_error(
    headers: list[tuple[str, str]], reason: str, code: str
) -> None:
    s = connected(interceptor())
    out = s.from_client(send([("destination", "/queue/a"), ("receipt", "r9"), *headers]))
    assert out.to_broker == [] and out.close is not None
    error = FrameParser(role="client", version="1.2").feed(out.to_client[0])[0]
    assert error.command == "ERROR"  # type: ignore[union-attr]
    assert error.get("message").startswith(reason)  # type: ignore[union-attr]
    assert error.get("reason-code") == code  # type: ignore[union-attr]
    assert error.get("receipt-id") == "r9"  # type: ignore[union-attr]
    assert s.stats.refusals[reason] == 1


def test_delay_disabled_for_a_destination() -> None:
    s = connected(interceptor(disabled_destinations=("orders.*",)))
    out = s.from_client(send([("destination", "/queue/orders.eu"), ("x-delay", "10")]))
    assert out.close is not None and b"MQRC_OPTIONS_ERROR" in out.to_client[0]
    s2 = connected(interceptor(disabled_destinations=("orders.*",)))
    assert s2.from_client(send([("destination", "/queue/other"), ("x-delay", "10")])).close is None


def test_temporary_destinations_cannot_be_delayed() -> None:
    s = connected(interceptor())
    out = s.from_client(send([("destination", "/temp-queue/t1"), ("x-delay", "10")]))
    assert out.close is not None and b"temporary destination" in out.to_client[0]


@pytest.mark.parametrize("command", ["SEND", "SUBSCRIBE"])
def test_clients_may_not_touch_staging_queues(command: str) -> None:
    s = connected(interceptor())
    frame = serialize(command, [("destination", "/amq/queue/jms-bridge.staging.L12"),
                                ("id", "1")], b"")
    out = s.from_client(frame)
    assert out.to_broker == [] and out.close is not None
    assert b"MQRC_NOT_AUTHORIZED" in out.to_client[0] and b"staging queue" in out.to_client[0]


def test_body_mentioning_a_delay_header_is_not_a_delay() -> None:
    s = connected(interceptor())
    raw = send([("destination", "/queue/a")], body=b"\nx-delay:500\n")
    assert s.from_client(raw).to_broker == [raw]


def test_release_restores_the_message_the_application_sent() -> None:
    icpt = interceptor()
    s = connected(icpt)
    out = s.from_client(send([("destination", "/queue/orders"), ("x-delay", "3000"),
                              ("receipt", "r1"), ("app", "v"), ("correlation-id", "C"),
                              ("amqp-message-id", "M1"), ("expiration", "10000"),
                              ("priority", "7")]))
    staged = dict(parse(out.to_broker[0]).headers)
    hopped = envelope.hop_headers(staged, now_ms=NOW + 2048)
    assert hopped[envelope.ENTERED] == str(NOW + 2048) and "receipt" not in hopped
    info = envelope.Staged.of(hopped)
    assert (info.target, info.due_ms, info.expires_ms) == ("/queue/orders", NOW + 3000, NOW + 10000)
    released = envelope.released_headers(hopped, rabbitmq.FORMAT, now_ms=NOW + 3004)
    assert released["amqp-message-id"] == "M1" and released["correlation-id"] == "C"
    assert released["expiration"] == str(10000 - 3004)  # the TTL still counts from the send
    assert released["app"] == "v" and released["priority"] == "7"
    assert released[envelope.DELIVERY_TIME] == str(NOW + 3000)
    # its absolute expiry too: a copy made of it later counts its TTL from the send
    assert released[envelope.EXPIRES] == str(NOW + 10000)
    assert not any(k.startswith("jms-bridge-") and k not in (envelope.MESSAGE_ID,
                   envelope.DELIVERY_TIME, envelope.EXPIRES) for k in released)
    assert "destination" not in released and "receipt" not in released


def test_release_keeps_an_absolute_expiry_as_sent() -> None:
    s = connected(interceptor("activemq"))
    out = s.from_client(send([("destination", "/queue/o"), ("x-delay", "3000"),
                              ("expires", str(NOW + 60000))]))
    staged = dict(parse(out.to_broker[0]).headers)
    assert "expires" not in staged  # ActiveMQ must not expire the staged copy itself
    released = envelope.released_headers(staged, activemq.FORMAT, now_ms=NOW + 3000)
    assert released["expires"] == str(NOW + 60000)
    assert "correlation-id" not in released  # the application set none


@pytest.mark.parametrize(
    ("destination", "owned"),
    [
        ("/amq/queue/jms-bridge.staging.L12", True),
        ("/queue/jms-bridge.staging.ready", True),
        ("/exchange/amq.default/jms-bridge.staging.L20", True),
        ("jms-bridge.staging.undeliverable", True),
        ("/topic/jms-bridge.staging.control", True),  # the operators' orders to the engines
        ("/topic/jms-bridge.staging.control.reply.0f3a", True),
        ("/exchange/amq.topic/jms-bridge.staging.control", True),
        # ActiveMQ composites: each part is a destination of its own.
        ("/queue/orders,jms-bridge.staging.L12", True),
        ("/topic/news,jms-bridge.staging.control", True),
        ("/queue/orders,topic://jms-bridge.staging.control", True),
        ("/queue/orders,audit", False),
        # ActiveMQ queue wildcards that reach staging queues would consume staged messages.
        ("/queue/>", True),
        ("/queue/jms-bridge.>", True),
        ("/queue/*.staging.ready", True),
        ("/queue/jms-bridge.staging.*", True),
        ("/queue/orders.>", False),
        ("/queue/*.orders", False),
        ("/topic/>", False),  # sees the control topic's orders go by, takes nothing
        ("/queue/jms-bridge.staging-copy", False),
        ("/queue/my-jms-bridge.staging.L12", False),
        ("/queue/orders", False),
    ],
)
def test_only_staging_queues_are_closed_to_clients(destination: str, owned: bool) -> None:
    assert Layout().owns(destination) is owned
    s = connected(interceptor())
    subscribe = serialize("SUBSCRIBE", [("destination", destination), ("id", "1")], b"")
    out = s.from_client(subscribe)
    assert (out.close is not None) is owned
    if "*" not in destination and ">" not in destination:
        s = connected(interceptor())
        out = s.from_client(send([("destination", destination), ("x-plain", "1")]))
        assert (out.close is not None) is owned


def test_a_send_to_a_wildcard_is_relayed() -> None:
    """ActiveMQ does not deliver a SEND to a wildcard into the queues it matches."""
    s = connected(interceptor())
    out = s.from_client(send([("destination", "/queue/>"), ("x-plain", "1")]))
    assert out.close is None and len(out.to_broker) == 1


@pytest.mark.parametrize("name", ["amqp-message-id", "correlation-id", "content-type", "type"])
def test_rabbitmq_short_string_headers_longer_than_255_bytes_are_refused(name: str) -> None:
    s = connected(interceptor("rabbitmq"))
    at_limit = "é" * 127 + "x"  # 255 bytes
    assert s.from_client(send([("destination", "/queue/a"), ("x-delay", "10"),
                               (name, at_limit)])).close is None
    out = s.from_client(send([("destination", "/queue/a"), ("x-delay", "10"),
                              (name, at_limit + "x")]))
    assert out.to_broker == [] and out.close is not None
    error = out.to_client[0]
    assert b"MQRC_PROPERTY_VALUE_BAD" in error and b"reason-code:2473" in error
    assert f"{name} is 256 bytes".encode() in out.to_client[0]


def test_activemq_takes_long_property_headers_on_a_delayed_send() -> None:
    s = connected(interceptor("activemq"))
    out = s.from_client(send([("destination", "/queue/a"), ("x-delay", "10"),
                              ("correlation-id", "y" * 300)]))
    assert out.close is None and len(out.to_broker) == 1


def test_message_ids_are_unique_and_a_forked_child_draws_its_own() -> None:
    import os

    ids = {envelope.new_message_id() for _ in range(10_000)}
    assert len(ids) == 10_000 and all(i.startswith("ID:jms-bridge-") for i in ids)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child writes one id and leaves at once
        os.write(write, envelope.new_message_id().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 200).decode()
    os.close(read)
    mine = envelope.new_message_id()
    assert child.rpartition("-")[0] != mine.rpartition("-")[0]
