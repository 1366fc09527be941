"""Turning an AMQP 0-9-1 client away with words: the bridge answers its protocol header with a
Connection.Start of its own, reads the Start-Ok, and closes with a Connection.Close whose reply
text says why (the broker is away, a connection limit). Clients (pika, the Java client) show that
text; a bare closed socket would leave them guessing.
"""

from __future__ import annotations

import asyncio
import contextlib

from pamqp import commands
from pamqp import frame as pframe

from bridge.frontends.amqp.builders import PROTOCOL_HEADER, connection_close

# AMQP 0-9-1 reply codes: the server is closing the connection for a reason of its own.
CONNECTION_FORCED = 320
FRAME_END = 0xCE
READ_TIMEOUT_S = 5.0


def start_frame() -> bytes:
    """A Connection.Start offering what RabbitMQ offers: PLAIN and AMQPLAIN."""
    method = commands.Connection.Start(
        server_properties={"product": "jms-bridge"}, mechanisms="PLAIN AMQPLAIN",
        locales="en_US")
    return pframe.marshal(method, 0)


async def _read_frame(reader: asyncio.StreamReader) -> None:
    """One whole frame (type, channel, size, payload, frame end), whatever it holds."""
    head = await reader.readexactly(7)
    size = int.from_bytes(head[3:7], "big")
    if size > 1 << 20:
        raise ValueError("frame too large for a handshake")
    await reader.readexactly(size + 1)


async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, text: str,
                 code: int = CONNECTION_FORCED, timeout: float = READ_TIMEOUT_S, *,
                 header_read: bool = False) -> None:
    """Answer the client's handshake far enough to close it with ``code`` and ``text``
    (``header_read``: its protocol header was read and checked already)."""
    try:
        if not header_read:
            header = await asyncio.wait_for(reader.readexactly(8), timeout)
            if header != PROTOCOL_HEADER:
                writer.write(PROTOCOL_HEADER)  # what RabbitMQ answers a wrong header with
                return
        writer.write(start_frame())
        await asyncio.wait_for(_read_frame(reader), timeout)  # Start-Ok
        writer.write(connection_close(code, text))
        await writer.drain()
        with contextlib.suppress(TimeoutError, asyncio.IncompleteReadError, ValueError):
            await asyncio.wait_for(_read_frame(reader), 1.0)  # Close-Ok
    except (TimeoutError, asyncio.IncompleteReadError, ValueError, OSError):
        pass
    finally:
        writer.close()
