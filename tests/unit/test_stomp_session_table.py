"""What the session leaves to the broker once connected, without a network: unknown commands
and stray NULs; and what the session does after the broker's ERROR when the broker goes on."""

from __future__ import annotations

from bridge.frontends.stomp.session import OTHER, Session, State

CONNECT = b"CONNECT\naccept-version:1.2\nhost:/\nlogin:u\npasscode:p\n\n\0"
CONNECTED = b"CONNECTED\nversion:1.2\n\n\0"
SEND = b"SEND\ndestination:/queue/a\nreceipt:r1\n\nhi\0"


def connected() -> Session:
    session = Session()
    session.from_client(CONNECT)
    session.from_broker(CONNECTED)
    assert session.state is State.CONNECTED
    return session


def test_an_unknown_command_after_connect_goes_to_the_broker_as_sent() -> None:
    session = connected()
    out = session.from_client(b"FOO\nreceipt:f\n\n\0")
    assert out.to_broker == [b"FOO\nreceipt:f\n\n\0"] and out.to_client == [] and not out.close
    assert session.stats.frames_up[OTHER] == 1 and "FOO" not in session.stats.frames_up


def test_an_unknown_command_pipelined_behind_connect_goes_to_the_broker() -> None:
    session = Session()
    out = session.from_client(CONNECT + b"FOO\n\n\0")
    assert out.to_broker == [CONNECT, b"FOO\n\n\0"] and out.close is None


def test_an_unknown_command_before_connect_is_refused_here() -> None:
    out = Session().from_client(b"FOO\nreceipt:f\n\n\0")
    assert out.to_broker == [] and out.close
    assert b"expected CONNECT or STOMP" in out.to_client[0] and b"receipt-id:f" in out.to_client[0]


def test_stray_nuls_between_frames_are_skipped() -> None:
    session = connected()
    out = session.from_client(b"\0\0")
    assert out.to_broker == [] and out.close is None
    out = session.from_client(SEND + b"\0\0" + SEND)
    assert out.to_broker == [SEND, SEND]


def test_the_broker_going_on_after_its_error_is_followed() -> None:
    session = connected()
    session.from_client(b"FOO\n\n\0")
    out = session.from_broker(b"ERROR\nmessage:Bad command\n\n\0")
    assert session.state is State.ERRORED and out.close is None
    assert session.from_client(SEND).to_broker == [SEND]  # RabbitMQ takes it
    session.from_broker(b"RECEIPT\nreceipt-id:r1\n\n\0")
    assert session.state is State.CONNECTED


def test_a_broker_closing_after_its_error_adds_no_second_error() -> None:
    session = connected()
    session.from_client(b"FOO\n\n\0")
    session.from_broker(b"ERROR\nmessage:Unknown STOMP action: FOO\n\n\0")
    out = session.broker_lost("end of stream")
    assert out.to_client == [] and out.close
