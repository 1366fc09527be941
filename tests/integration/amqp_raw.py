"""A raw-socket AMQP 0-9-1 client, for tests that need to send or see exact frames."""

from __future__ import annotations

import socket
import struct
from typing import Any

from pamqp import commands, encode
from pamqp import frame as pframe

from bridge.frontends.amqp import PROTOCOL_HEADER


def recv_exactly(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {data[:200]!r}")
        data += chunk
    return data


def read_frame(sock: socket.socket) -> tuple[int, Any]:
    """The next frame: (channel, what pamqp reads it as)."""
    head = recv_exactly(sock, 7)
    size = struct.unpack(">I", head[3:7])[0]
    rest = recv_exactly(sock, size + 1)
    _, channel, value = pframe.unmarshal(head + rest)
    return channel, value


def handshake(port: int, mechanism: str = "PLAIN", *, user: str = "guest",
              password: str = "guest", timeout: float = 5.0) -> socket.socket:
    """A connection through to Connection.Open-Ok (frame_max 131072, no heart-beats)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.sendall(PROTOCOL_HEADER)
    _, start = read_frame(sock)
    assert isinstance(start, commands.Connection.Start)
    if mechanism == "AMQPLAIN":  # a table without its length prefix, as RabbitMQ reads it
        response = encode.field_table({"LOGIN": user, "PASSWORD": password})[4:]
    else:
        response = f"\0{user}\0{password}".encode()
    start_ok = commands.Connection.StartOk(
        client_properties={"product": "raw"}, mechanism=mechanism, response=response.decode()
    )
    sock.sendall(pframe.marshal(start_ok, 0))
    _, tune = read_frame(sock)
    assert isinstance(tune, commands.Connection.Tune), tune
    sock.sendall(pframe.marshal(commands.Connection.TuneOk(tune.channel_max, 131072, 0), 0))
    sock.sendall(pframe.marshal(commands.Connection.Open("/"), 0))
    _, open_ok = read_frame(sock)
    assert isinstance(open_ok, commands.Connection.OpenOk), open_ok
    return sock
