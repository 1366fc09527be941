"""adapters.activemq_puts.corked: the frames of a settle go out in few writes, in order."""

from __future__ import annotations

import pytest

from adapters import activemq_puts


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
