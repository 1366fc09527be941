"""adapters.speedups (pika-writes): queued frames go out in fewer writes, byte for byte the same."""

from __future__ import annotations

import collections

import pytest

from adapters import speedups


class Socket:
    """Takes at most ``per_send`` bytes a call, or raises BlockingIOError once ``room`` is used."""

    def __init__(self, per_send: int = 1 << 30, room: int = 1 << 30) -> None:
        self.per_send, self.room = per_send, room
        self.calls = 0
        self.wire = bytearray()

    def send(self, data: bytes) -> int:
        if not self.room:
            raise BlockingIOError
        n = min(len(data), self.per_send, self.room)
        self.calls += 1
        self.room -= n
        self.wire += data[:n]
        return n


class Transport:
    """The attributes of pika's _AsyncTransportBase that _produce uses."""

    def __init__(self, sock: Socket, frames: list[bytes]) -> None:
        self._sock = sock
        self._tx_buffers = collections.deque(frames)
        self._tx_buffered_byte_count = sum(map(len, frames))

    @staticmethod
    def _sigint_safe_send(sock: Socket, data: bytes) -> int:
        return sock.send(data)


FRAMES = [bytes([i % 251]) * (7 + i % 300) for i in range(1500)]


def test_frames_go_out_joined_in_order() -> None:
    sock = Socket()
    transport = Transport(sock, FRAMES)
    speedups._produce(transport)
    assert bytes(sock.wire) == b"".join(FRAMES)
    total = sum(map(len, FRAMES))
    assert sock.calls <= -(-total // speedups.JOIN_LIMIT) < 5
    assert transport._tx_buffered_byte_count == 0 and not transport._tx_buffers


def test_partial_sends_keep_the_rest_queued_in_order() -> None:
    sock = Socket(per_send=1000)
    transport = Transport(sock, FRAMES)
    speedups._produce(transport)
    assert bytes(sock.wire) == b"".join(FRAMES)
    assert transport._tx_buffered_byte_count == 0


def test_a_full_socket_raises_as_pika_expects_and_loses_nothing() -> None:
    total = sum(map(len, FRAMES))
    sock = Socket(room=total // 3)
    transport = Transport(sock, FRAMES)
    with pytest.raises(BlockingIOError):
        speedups._produce(transport)
    assert transport._tx_buffered_byte_count == total - len(sock.wire)
    sock.room = total
    speedups._produce(transport)
    assert bytes(sock.wire) == b"".join(FRAMES)


def test_one_large_frame_is_sent_as_it_is() -> None:
    big = b"x" * (speedups.JOIN_LIMIT * 2)
    sock = Socket()
    transport = Transport(sock, [big, b"tail"])
    speedups._produce(transport)
    assert bytes(sock.wire) == big + b"tail" and sock.calls == 2
