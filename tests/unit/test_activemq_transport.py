"""adapters.activemq_transport.Transport.corked: the frames of a settle go out in few writes, in
order."""

from __future__ import annotations

import pytest

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
