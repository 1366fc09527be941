"""adapters.activemq_transport.Transport.corked: the frames of a settle go out in few writes, in
order; and the listener's forgiveness of the echoes of SENDs refused in a refused transaction."""

from __future__ import annotations

import time

import pytest
from stomp.utils import Frame  # type: ignore[import-untyped]

from adapters.activemq_connection import Listener
from adapters.activemq_transport import CORK_BYTES, Transport


class Socket:
    """What the transport writes to, in place of a connected socket."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.writes.append(data)


def _transport() -> tuple[Transport, Socket]:
    transport = Transport([("127.0.0.1", 1)])
    sock = Socket()
    transport.socket = sock  # never connected: stomp.py writes to whatever socket it holds
    return transport, sock


def test_frames_sent_inside_go_out_in_one_write_in_order() -> None:
    transport, sock = _transport()
    frames = [f"SEND\nn:{i}\n\nbody\x00".encode() for i in range(500)]
    with transport.corked():
        for frame in frames:
            transport.send(frame)
        assert sock.writes == []
    assert sock.writes == [b"".join(frames)]
    transport.send(b"\n")  # written at once again
    assert sock.writes[-1] == b"\n"


def test_a_large_batch_is_written_as_it_fills() -> None:
    transport, sock = _transport()
    frame = b"x" * 100_000
    with transport.corked():
        for _ in range(6):
            transport.send(frame)
    assert b"".join(sock.writes) == frame * 6
    assert all(len(w) <= CORK_BYTES + len(frame) for w in sock.writes)
    assert len(sock.writes) == 2


def test_a_failed_block_writes_nothing_more_and_sends_at_once_after() -> None:
    transport, sock = _transport()
    with pytest.raises(RuntimeError), transport.corked():
        transport.send(b"SEND\n\n\x00")
        raise RuntimeError("broken")
    assert sock.writes == []
    transport.send(b"ACK\n\n\x00")
    assert sock.writes == [b"ACK\n\n\x00"]


# -- the echoes of SENDs refused in a refused transaction ---------------------------------------
GONE = ("temp-queue://ID:gone-1:1:1: org.apache.activemq.DestinationDoesNotExistException: "
        "The destination temp-queue://ID:gone-1:1:1 does not exist.")


def _error(listener: Listener, text: str, receipt: str | None = None) -> None:
    message, _, detail = text.partition(": ")
    headers = {"message": message, **({"receipt-id": receipt} if receipt else {})}
    listener.on_error(Frame("ERROR", headers, detail.encode()))


def test_a_refused_sends_error_is_forgiven_once_whether_it_came_before_or_after() -> None:
    """ActiveMQ answers a transaction's frames asynchronously: the ERROR (naming no receipt)
    of a SEND refused in it came before the COMMIT's refusal in one try and after it in
    another (CI). Either way one ERROR of the text the same SEND got again, with a receipt, is
    not a broker failure; a second one, or another text, is."""
    before = Listener()
    _error(before, GONE)
    assert before.errors == [GONE]
    assert before.forgive(0, [GONE], time.monotonic() + 60) == []
    _error(before, GONE)  # a second one: counted
    assert before.errors == [GONE, GONE]

    after = Listener()
    assert after.forgive(0, [GONE], time.monotonic() + 60) == []
    _error(after, GONE)  # the echo, late: not counted
    assert after.errors == []
    _error(after, GONE)
    _error(after, "Unexpected ACK: ack-1")
    assert after.forgive(0, [], time.monotonic() + 60) == [GONE, "Unexpected ACK: ack-1"]

    expired = Listener()
    assert expired.forgive(0, [GONE], time.monotonic() - 1) == []
    _error(expired, GONE)  # past its wait: counted
    assert expired.errors == [GONE]

    receipted = Listener()
    receipted.forgive(0, [GONE], time.monotonic() + 60)
    _error(receipted, GONE, receipt="r-1")  # answers its SEND, not the echo
    assert receipted.failed == {"r-1": GONE} and receipted.errors == []
    _error(receipted, GONE)
    assert receipted.errors == []
