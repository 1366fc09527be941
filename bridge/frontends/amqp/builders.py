"""Frames the bridge writes itself: closes (pamqp), and a rewritten publish (its content
header written here).

Everything else the relay sends is the peers' original bytes; these are for the replies the
bridge owes (a protocol error, a refused publish) and for a publish the interception layer
changes (a staged copy), split into body frames by the negotiated frame_max.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pamqp import commands
from pamqp import frame as pframe

# The protocol header AMQP 0-9-1 peers open with (what RabbitMQ answers a client that sent
# anything else), and a Basic.Publish method frame: the adapters' client writes them the same way.
from adapters.amqp_client import PROTOCOL_HEADER, publish_method
from adapters.amqp_properties import header_frame, pamqp_values

# Frame overhead: type (1), channel (2), size (4) and the frame-end octet.
FRAME_OVERHEAD = 8
# RabbitMQ's ceiling for frame_max, used to split bodies when frame_max is 0 ("no limit").
DEFAULT_FRAME_MAX = 131072


def connection_close(
    reply_code: int, reply_text: str, class_id: int = 0, method_id: int = 0
) -> bytes:
    """A ``Connection.Close`` frame on channel 0 (the reply text is cut to a shortstr)."""
    method = commands.Connection.Close(reply_code, _shortstr(reply_text), class_id, method_id)
    return pframe.marshal(method, 0)


def channel_close(
    channel: int, reply_code: int, reply_text: str, class_id: int = 0, method_id: int = 0
) -> bytes:
    """A ``Channel.Close`` frame, e.g. 406 PRECONDITION_FAILED for a refused publish."""
    method = commands.Channel.Close(reply_code, _shortstr(reply_text), class_id, method_id)
    return pframe.marshal(method, channel)


def channel_close_ok(channel: int) -> bytes:
    return pframe.marshal(commands.Channel.CloseOk(), channel)


def content_frames(
    channel: int, properties: commands.Basic.Properties, body: bytes, frame_max: int
) -> bytes:
    """A content header frame and the body frames, each within ``frame_max``.

    ``frame_max`` is the negotiated value (0: none agreed; RabbitMQ's 128 KiB is used). On its
    own, this follows a Basic.Publish method frame that is kept as the client sent it.
    """
    return content_frames_of(channel, pamqp_values(properties), body, frame_max)


def content_frames_of(
    channel: int, values: Sequence[Any], body: bytes, frame_max: int
) -> bytes:
    """``content_frames`` for Basic's 14 property values in their wire order (None: unset)."""
    if channel <= 0:
        raise ValueError("content goes on a channel above 0")
    limit = (frame_max or DEFAULT_FRAME_MAX) - FRAME_OVERHEAD
    if limit <= 0:
        raise ValueError(f"frame_max {frame_max} leaves no room for a body")
    head = b"\x03" + channel.to_bytes(2, "big")
    if len(body) <= limit:  # one body frame (or none), most messages: no view to cut
        header = header_frame(channel, len(body), values)
        if not body:
            return header
        return b"".join((header, head, len(body).to_bytes(4, "big"), body, b"\xce"))
    parts: list[bytes | memoryview] = [header_frame(channel, len(body), values)]
    view = memoryview(body)
    for start in range(0, len(body), limit):
        chunk = view[start : start + limit]
        parts += (head, len(chunk).to_bytes(4, "big"), chunk, b"\xce")
    return b"".join(parts)


def publish_frames(
    channel: int,
    method: commands.Basic.Publish,
    properties: commands.Basic.Properties,
    body: bytes,
    frame_max: int,
) -> bytes:
    """Method, content header and body frames of one publish; bodies split by ``frame_max``."""
    content = content_frames(channel, properties, body, frame_max)
    return pframe.marshal(method, channel) + content


def _shortstr(text: str) -> str:
    """``text`` cut so that its UTF-8 form fits a shortstr (255 bytes)."""
    raw = text.encode()
    if len(raw) <= 255:
        return text
    return raw[:255].decode(errors="ignore")


__all__ = [
    "DEFAULT_FRAME_MAX", "FRAME_OVERHEAD", "PROTOCOL_HEADER", "channel_close", "channel_close_ok",
    "connection_close", "content_frames", "content_frames_of", "publish_frames", "publish_method",
]
