"""The STOMP front-end turns deliveries and settlements into views for the chain."""

from __future__ import annotations

import pytest

from bridge.frontends.stomp import FrameParser, serialize
from bridge.frontends.stomp.errors import StompProtocolError
from bridge.frontends.stomp.session import Session, State
from bridge.frontends.stomp.translate import delivery_view
from bridge.intercept.chain import Chain, Interceptor, Interest
from bridge.intercept.decisions import RELAY, Decision, Rewrite
from bridge.intercept.views import Delivery, Settle, Settlement


class Watcher(Interceptor):
    interest = Interest(deliveries=True, settlements=True)

    def __init__(self, stamp: bool = False) -> None:
        self.stamp = stamp
        self.settled: list[Settle] = []

    def on_delivery(self, delivery: Delivery) -> Decision:
        if not self.stamp:
            return RELAY
        headers = [*delivery.headers.items(), ("JMSXDeliveryCount", "1")]
        return Rewrite(delivery.destination, headers)

    def on_settle(self, settle: Settle) -> Decision:
        self.settled.append(settle)
        return RELAY


def session(watcher: Watcher, version: str = "1.2") -> Session:
    s = Session(chain=Chain([watcher]))
    s.from_client(f"CONNECT\naccept-version:{version}\nhost:/\nlogin:u\npasscode:p\n\n\x00"
                  .encode())
    s.from_broker(f"CONNECTED\nversion:{version}\n\n\x00".encode())
    assert s.state is State.CONNECTED
    return s


def message(n: int, sub: str = "s1") -> bytes:
    return serialize("MESSAGE", [("destination", "/queue/q"), ("subscription", sub),
                                 ("message-id", f"m{n}"), ("ack", f"a{n}")], b"x")


def subscribe(s: Session, ack: str, sub: str = "s1") -> None:
    s.from_client(serialize("SUBSCRIBE", [("destination", "/queue/q"), ("id", sub),
                                          ("ack", ack)], b""))


def frame(command: str, **headers: str) -> bytes:
    return serialize(command, list(headers.items()), b"")


def ids(settle: Settle) -> list[str]:
    return [d.ack_id for d in settle.deliveries]


def test_a_nack_settles_the_one_delivery_it_names() -> None:
    w = Watcher()
    s = session(w)
    subscribe(s, "client-individual")
    s.from_broker(message(1) + message(2))
    out = s.from_client(frame("NACK", id="a2"))
    assert out.to_broker  # relayed: the chain said RELAY
    (settle,) = w.settled
    assert settle.outcome is Settlement.NACK and ids(settle) == ["a2"]
    assert settle.principal.login == "u"
    s.client_lost()
    assert w.settled[-1].outcome is Settlement.LOST and ids(w.settled[-1]) == ["a1"]


def test_client_mode_acks_are_cumulative() -> None:
    w = Watcher()
    s = session(w)
    subscribe(s, "client")
    s.from_broker(message(1) + message(2) + message(3))
    s.from_client(frame("ACK", id="a2"))
    assert ids(w.settled[0]) == ["a1", "a2"] and w.settled[0].outcome is Settlement.ACK
    s.client_lost()
    assert ids(w.settled[1]) == ["a3"]


def test_an_abort_rolls_back_what_its_transaction_settled() -> None:
    w = Watcher()
    s = session(w)
    subscribe(s, "client-individual")
    s.from_broker(message(1) + message(2))
    s.from_client(frame("BEGIN", transaction="t1") + frame("ACK", id="a1", transaction="t1")
                  + frame("NACK", id="a2", transaction="t1"))
    assert w.settled == []  # nothing is settled before the transaction ends
    s.from_client(frame("ABORT", transaction="t1"))
    (rollback,) = w.settled
    assert rollback.outcome is Settlement.ROLLBACK and rollback.transaction == "t1"
    assert ids(rollback) == ["a1", "a2"]


def test_a_commit_settles_and_a_lost_connection_then_has_nothing_left() -> None:
    w = Watcher()
    s = session(w)
    subscribe(s, "client-individual")
    s.from_broker(message(1))
    s.from_client(frame("BEGIN", transaction="t") + frame("ACK", id="a1", transaction="t")
                  + frame("COMMIT", transaction="t"))
    s.client_lost()
    assert w.settled == []


def test_auto_ack_deliveries_are_never_owed() -> None:
    w = Watcher()
    s = session(w)
    subscribe(s, "auto")
    s.from_broker(message(1))
    s.client_lost()
    assert w.settled == []


def test_stomp_1_1_names_deliveries_by_message_id() -> None:
    w = Watcher()
    s = session(w, "1.1")
    subscribe(s, "client-individual")
    s.from_broker(message(7))
    s.from_client(frame("NACK", subscription="s1", **{"message-id": "m7"}))
    assert ids(w.settled[0]) == ["m7"]


def test_a_delivery_can_be_rewritten_on_its_way_to_the_client() -> None:
    s = session(Watcher(stamp=True))
    subscribe(s, "auto")
    out = s.from_broker(message(1))
    (delivered,) = FrameParser(role="client", version="1.2").feed(b"".join(out.to_client))
    assert delivered.get("JMSXDeliveryCount") == "1"  # type: ignore[union-attr]
    assert delivered.body == b"x"  # type: ignore[union-attr]


def test_without_interest_a_message_is_relayed_as_its_bytes() -> None:
    s = Session()
    s.from_client(b"CONNECT\naccept-version:1.2\n\n\x00")
    s.from_broker(b"CONNECTED\nversion:1.2\n\n\x00")
    raw = message(1)
    assert s.from_broker(raw).to_client == [raw]


def _view_of(raw: bytes, version: str) -> Delivery:
    events = FrameParser(version=version, validate=False).feed(raw)
    return delivery_view(events[0], version)  # type: ignore[arg-type]


def test_escaped_ids_are_read_one_value_at_a_time() -> None:
    """ActiveMQ escapes the colons of every message id: the view reads them unescaped without
    decoding the whole head; STOMP 1.0 takes a backslash as it stands."""
    raw = (b"MESSAGE\ndestination:/queue/q\nsubscription:s1\nmessage-id:ID\\cvm-1\\c7\n"
           b"ack:ID\\cvm-1\\c7\nx-other:a\\\\b\n\nbody\x00")
    view = _view_of(raw, "1.2")
    assert (view.ack_id, view.destination, view.subscription) == ("ID:vm-1:7", "/queue/q", "s1")
    assert view.headers.get("message-id") == "ID:vm-1:7"
    assert view.headers._all is None  # type: ignore[attr-defined]  # nothing decoded whole
    assert dict(view.headers)["x-other"] == "a\\b"
    assert _view_of(raw.replace(b"\\c", b"!"), "1.0").headers.get("x-other") == "a\\\\b"


def test_a_bad_escape_in_a_header_nobody_reads_is_still_found_at_once() -> None:
    raw = (b"MESSAGE\ndestination:/queue/q\nsubscription:s1\nmessage-id:ID\\cvm\n"
           b"ack:ID\\cvm\nx-other:a\\tb\n\nbody\x00")
    with pytest.raises(StompProtocolError) as info:
        _view_of(raw, "1.2")
    assert info.value.kind == "bad-escape"
