"""AMQP 0-9-1 front-end: a sans-I/O core on pamqp (framer, assembler, connection state,
frame builders, the one error) and a transparent asyncio relay (server)."""

from bridge.frontends.amqp.assembler import Assembler, Message
from bridge.frontends.amqp.builders import (
    PROTOCOL_HEADER,
    channel_close,
    connection_close,
    content_frames,
    publish_frames,
)
from bridge.frontends.amqp.connection import Answer, Forward, ProxyConnection, State
from bridge.frontends.amqp.errors import AmqpProtocolError, ReplyCode
from bridge.frontends.amqp.framer import NEED_DATA, Frame, Framer, NeedData, ProtocolHeader

__all__ = [
    "NEED_DATA",
    "PROTOCOL_HEADER",
    "AmqpProtocolError",
    "Answer",
    "Assembler",
    "Forward",
    "Frame",
    "Framer",
    "Message",
    "NeedData",
    "ProtocolHeader",
    "ProxyConnection",
    "ReplyCode",
    "State",
    "channel_close",
    "connection_close",
    "content_frames",
    "publish_frames",
]
