"""adapters.activemq_puts.corked: the frames of a settle go out in few writes, in order; and
the listener's forgiveness of the echoes of SENDs refused in a refused transaction."""

from __future__ import annotations

import time

import pytest
from stomp.utils import Frame  # type: ignore[import-untyped]

from adapters import activemq_puts
from adapters.activemq_connection import Listener


class Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def send(self, encoded_frame: bytes) -> None:
        self.writes.append(encoded_frame)


class Conn:
    def __init__(self) -> None:
        self.transport = Transport()


def test_frames_sent_inside_go_out_in_one_write_in_order() -> None:
    conn = Conn()
    frames = [f"SEND\nn:{i}\n\nbody\x00".encode() for i in range(500)]
    with activemq_puts.corked(conn):  # type: ignore[arg-type]
        for frame in frames:
            conn.transport.send(frame)
        assert conn.transport.writes == []
    assert conn.transport.writes == [b"".join(frames)]
    conn.transport.send(b"\n")  # the transport's own send again
    assert conn.transport.writes[-1] == b"\n"


def test_a_large_batch_is_written_as_it_fills() -> None:
    conn = Conn()
    frame = b"x" * 100_000
    with activemq_puts.corked(conn):  # type: ignore[arg-type]
        for _ in range(6):
            conn.transport.send(frame)
    assert b"".join(conn.transport.writes) == frame * 6
    assert all(len(w) <= activemq_puts.CORK_BYTES + len(frame) for w in conn.transport.writes)
    assert len(conn.transport.writes) == 2


def test_a_failed_block_writes_nothing_more_and_gives_send_back() -> None:
    conn = Conn()
    with pytest.raises(RuntimeError), activemq_puts.corked(conn):  # type: ignore[arg-type]
        conn.transport.send(b"SEND\n\n\x00")
        raise RuntimeError("broken")
    assert conn.transport.writes == []
    conn.transport.send(b"ACK\n\n\x00")
    assert conn.transport.writes == [b"ACK\n\n\x00"]


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
