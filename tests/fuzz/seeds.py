"""Writes the seed corpus of each target into tests/fuzz/corpus/<target>/ (kept in git):

    python -m tests.fuzz.seeds

Each seed is an input as ``tests.fuzz.targets`` reads it: option bytes, then what the peer
sends. Files are named by content, so running this again adds only what is new.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from pamqp import commands

from bridge.frontends.stomp import serialize
from tests.fuzz.targets import method

CORPUS = Path(__file__).parent / "corpus"


def _stomp_seeds() -> list[bytes]:
    send = serialize("SEND", [("destination", "/queue/a"), ("content-length", "3")], b"abc")
    delayed = serialize("SEND", [("destination", "/queue/orders"), ("x-delay", "5000"),
                                 ("receipt", "r1"), ("content-length", "2")], b"hi")
    bad_delay = serialize("SEND", [("destination", "/queue/a"), ("x-delay", "-1")], b"")
    grouped = serialize("SEND", [("destination", "/queue/a"), ("AMQ_SCHEDULED_DELAY", "10"),
                                 ("JMSXGroupID", "g")], b"")
    at_time = serialize("SEND", [("destination", "/topic/t"), ("JMSDeliveryTime", "1800000009000"),
                                 ("expires", "1800000001000")], b"x")
    staging = serialize("SEND", [("destination", "/queue/jms-bridge.staging.L12")], b"")
    subscribe = serialize("SUBSCRIBE", [("destination", "/queue/orders"), ("id", "s1"),
                                        ("ack", "client-individual")], b"")
    wildcard = serialize("SUBSCRIBE", [("destination", "/queue/>"), ("id", "s2")], b"")
    tx = (serialize("BEGIN", [("transaction", "t1")], b"")
          + serialize("SEND", [("destination", "/queue/a"), ("transaction", "t1"),
                               ("x-delay", "100")], b"x")
          + serialize("ABORT", [("transaction", "t1")], b""))
    acks = (serialize("ACK", [("id", "m1")], b"") + serialize("NACK", [("id", "m2")], b"")
            + serialize("ACK", [("message-id", "m3"), ("subscription", "s1")], b""))
    escaped = b"SEND\ndestination:/queue/a\\cb\nx\\n:y\\\\\n\nbody\0"
    crlf = b"SEND\r\ndestination:/queue/a\r\ncontent-length:1\r\n\r\nz\0\r\n"
    message = serialize("MESSAGE", [("destination", "/queue/orders"), ("subscription", "s1"),
                                    ("message-id", "m1"), ("ack", "m1"),
                                    ("redelivered", "true"), ("content-length", "2")], b"hi")
    receipt = serialize("RECEIPT", [("receipt-id", "r1")], b"")
    error = serialize("ERROR", [("message", "nope")], b"oops")
    client_streams = [
        send, delayed, bad_delay, grouped, at_time, staging, subscribe, wildcard, tx,
        subscribe + acks, escaped, crlf, b"\n\n\r\n" + send,
        serialize("DISCONNECT", [("receipt", "bye")], b""),
        serialize("UNSUBSCRIBE", [("id", "s1")], b""),
        serialize("CONNECT", [("accept-version", "1.2")], b""),  # a second CONNECT
        b"SEND\ndestination:/queue/a\ncontent-length:9\n\nabc\0",  # missing NUL
        b"SEND\ndestination:/queue/a\ncontent-length:x\n\n\0",
        b"FOO\n\n\0", b"SEND\nnocolon\n\n\0", b"SEND\n:empty\n\n\0",
        b"SEND\ndestination:/queue/\xff\n\n\0", b"SEND\nx:\\t\n\n\0",
        b"SEND\n" + b"h:v\n" * 5 + b"\n\0", b"SEND\ndestination:/queue/a\n\n" + b"y" * 400 + b"\0",
    ]
    seeds = []
    for i, stream in enumerate(client_streams):
        for options in (3 | 8, i % 4 | (4 if i % 3 == 0 else 0)):
            seeds.append(bytes([options, 0 if i % 2 else 7]) + stream)
    for i, stream in enumerate([message, receipt, error, message + message, b"\n" + receipt,
                                b"MESSAGE\ndestination:/queue/a\n\n\0", b"CONNECTED\n\n\0"]):
        seeds.append(bytes([16 | 3 | (4 if i % 2 else 0), i % 3]) + stream)
    return seeds


def _publish(channel: int, body: bytes, headers: dict[str, Any] | None = None,
             exchange: str = "", routing_key: str = "orders") -> bytes:
    from pamqp import body as pbody
    from pamqp import frame as pframe
    from pamqp import header as pheader

    props = commands.Basic.Properties(headers=headers, message_id="m1", content_type="text/plain")
    return (method(commands.Basic.Publish(exchange=exchange, routing_key=routing_key), channel)
            + bytes(pframe.marshal(pheader.ContentHeader(0, len(body), props), channel))
            + (bytes(pframe.marshal(pbody.ContentBody(body), channel)) if body else b""))


def _amqp_seeds() -> list[bytes]:
    heartbeat = b"\x08\x00\x00\x00\x00\x00\x00\xce"
    handshake_frames = [
        method(commands.Connection.StartOk(client_properties={"product": "x"},
                                           mechanism="PLAIN", response="\0u\0p")),
        method(commands.Connection.StartOk(mechanism="AMQPLAIN",
                                           response="\x05LOGINS\x00\x00\x00\x01u")),
        method(commands.Connection.TuneOk(0, 0, 60)),
        method(commands.Connection.Open(virtual_host="/v")),
    ]
    open_streams = [
        _publish(1, b"abc"),
        _publish(1, b"later", {"x-delay": 5000}),
        _publish(1, b"", {"x-delay": "-5"}),
        _publish(1, b"x", {"AMQ_SCHEDULED_DELAY": 10, "JMSXGroupID": "g"}),
        _publish(1, b"x", {"JMSDeliveryTime": 1800000009000}, exchange="amq.topic"),
        _publish(1, b"x", {"x-delay": 1000}, routing_key="jms-bridge.staging.L12"),
        _publish(1, b"x" * 2000, {"x-delay": 1000}),  # above max_body_size
        method(commands.Channel.Open(), 2) + _publish(2, b"two"),
        method(commands.Basic.Ack(delivery_tag=1), 1),
        method(commands.Tx.Select(), 1) + _publish(1, b"t", {"x-delay": 9}) +
        method(commands.Tx.Rollback(), 1),
        method(commands.Channel.Close(200, "bye", 0, 0), 1)
        + method(commands.Channel.CloseOk(), 1),
        method(commands.Connection.Close(200, "bye", 0, 0))
        + method(commands.Connection.CloseOk()),
        method(commands.Connection.UpdateSecret(new_secret="s", reason="r")),
        method(commands.Queue.Declare(queue="q", arguments={"x-max-length": 10}), 1),
        heartbeat,
        _publish(1, b"abc")[:20],  # cut short
        method(commands.Basic.Publish(), 1) + method(commands.Basic.Publish(), 1),
        b"\x01\x00\x01\x00\x00\x00\x04\x00\x3c\x00\x28\xce",  # a method with no arguments
        b"\x09\x00\x00\x00\x00\x00\x00\xce", b"\x03\x00\x05\x00\x00\x00\x01x\x00",
    ]
    seeds = [bytes([1 | 2, i % 5]) + stream for i, stream in enumerate(open_streams)]
    seeds += [bytes([0, i]) + frame for i, frame in enumerate(handshake_frames)]
    seeds.append(bytes([0, 0]) + b"".join(handshake_frames[::2])
                 + method(commands.Channel.Open(), 1) + _publish(1, b"x", {"x-delay": 3}))
    seeds.append(bytes([2, 0]) + _publish(1, b"early"))  # before Connection.Open
    seeds.append(bytes([0, 0]) + heartbeat)
    return seeds


def _selector_seeds() -> list[bytes]:
    selectors = [
        "JMSPriority > 4 AND region IN ('EU', 'US')", "a = 1", "a <> 'x'", "b IS NULL",
        "b IS NOT NULL", "a BETWEEN 1 AND 10", "a NOT BETWEEN -1.5 AND 2e3", "type LIKE 'a%'",
        "type LIKE 'a!_%' ESCAPE '!'", "NOT (a = 1 OR b = 2)", "a + b * 2 - 3 / 4 > 0",
        "JMSType = 'car' AND color = 'blue' AND weight > 2500", "JMSRedelivered = TRUE",
        "JMSDestination = 'queue://orders'", "JMSTimestamp < 1800000000000",
        "JMSMessageID = 'ID:1'", "JMSCorrelationID IS NULL", "JMSDeliveryMode = 'PERSISTENT'",
        "priority = 0x1F", "a = 017", "a = 5L", "a = .5", "-a = -1", "a = 'it''s'",
        "(((((a = 1)))))", "a IN ('1')", "a NOT IN ('1', '2')", "TRUE", "FALSE OR NULL",
        "a = 9223372036854775807", "a = 2147483648", "a > 1e308 * 10", "x_1 = $y",
        "a / 0 = 1", "'a' < 'b'", "a = ", "(a = 1", "a LIKE 5", "a = NULL",
    ]
    values = ["1", "x", "", "2.5", "true", "queue://orders", "9" * 30]
    seeds = []
    for i, text in enumerate(selectors):
        tail = "\0".join(values[i % 3 : i % 3 + 1 + i % 5])
        seeds.append(f"{text}\0{tail}".encode())
    return seeds


def main() -> None:
    for target, seeds in (("stomp", _stomp_seeds()), ("amqp", _amqp_seeds()),
                          ("selector", _selector_seeds())):
        folder = CORPUS / target
        folder.mkdir(parents=True, exist_ok=True)
        for seed in seeds:
            (folder / f"seed-{hashlib.sha1(seed).hexdigest()[:16]}").write_bytes(seed)
        print(f"{target}: {len(seeds)} seeds in {folder}")


if __name__ == "__main__":
    main()
