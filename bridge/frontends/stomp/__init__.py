"""STOMP 1.0/1.1/1.2 codec: bytes -> frames (FrameParser) and frames -> bytes (serialize)."""

from bridge.frontends.stomp.codec import Event, FrameParser, Limits
from bridge.frontends.stomp.errors import StompProtocolError
from bridge.frontends.stomp.frame import (
    CLIENT_COMMANDS,
    HEARTBEAT,
    NEED_DATA,
    SERVER_COMMANDS,
    Frame,
    HeartBeat,
    NeedData,
    error_frame,
    serialize,
)
from bridge.frontends.stomp.header_decoding import decode_headers

__all__ = [
    "CLIENT_COMMANDS",
    "HEARTBEAT",
    "NEED_DATA",
    "SERVER_COMMANDS",
    "Event",
    "Frame",
    "FrameParser",
    "HeartBeat",
    "Limits",
    "NeedData",
    "StompProtocolError",
    "decode_headers",
    "error_frame",
    "serialize",
]
