"""Frames the bridge writes itself: closes (pamqp), and a rewritten publish (its content
header written here).

Everything else the relay sends is the peers' original bytes; these are for the replies the
bridge owes (a protocol error, a refused publish) and for a publish the interception layer
changes (a staged copy), split into body frames by the negotiated frame_max.
"""

from __future__ import annotations

import calendar
import datetime
import struct
import time
from collections.abc import Sequence
from typing import Any, Final

from pamqp import commands
from pamqp import frame as pframe

from bridge.frontends.amqp.tables import encode_table

# What AMQP 0-9-1 peers open with, and what RabbitMQ answers a client that sent anything else.
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
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
    parts: list[bytes | memoryview] = [header_frame(channel, len(body), values)]
    head = b"\x03" + channel.to_bytes(2, "big")
    view = memoryview(body)
    for start in range(0, len(body), limit):
        chunk = view[start : start + limit]
        parts += (head, len(chunk).to_bytes(4, "big"), chunk, b"\xce")
    return b"".join(parts)


# Basic's properties in their wire order: flag bit and type (s: shortstr, o: octet, t: field
# table, T: timestamp), as pamqp's Basic.Properties states them.
_LAYOUT: Final = tuple(
    (commands.Basic.Properties.flags[name],
     {"shortstr": "s", "octet": "o", "table": "t", "timestamp": "T"}[
         getattr(commands.Basic.Properties, "_" + name)])
    for name in commands.Basic.Properties.__slots__
)
_HEAD: Final = struct.Struct(">HHQH")  # class id, weight, body size, property flags
_STAMP: Final = struct.Struct(">Q")


def header_frame(channel: int, body_size: int, values: Sequence[Any]) -> bytes:
    """A content header frame, written here (it is one per rewritten publish; pamqp's writer
    took two thirds of a staged copy's writing, and pamqp 3.3 gets negative integers and
    floats in a table wrong). ``values``: the 14 properties in wire order, None for unset; an
    empty string is left out, as pamqp leaves it out. ValueError for a value that does not
    fit its type."""
    flags = 0
    parts: list[bytes] = []
    for (flag, kind), value in zip(_LAYOUT, values, strict=True):
        if value is None or value == "":
            continue
        flags |= flag
        if kind == "s":
            raw = value.encode()
            if len(raw) > 255:
                raise ValueError(f"a property longer than 255 bytes ({value[:40]!r}...)")
            parts += (bytes((len(raw),)), raw)
        elif kind == "o":
            parts.append(bytes((value,)))  # ValueError outside 0-255
        elif kind == "t":
            parts.append(encode_table(value))
        else:
            parts.append(_STAMP.pack(value))
    payload = _HEAD.pack(commands.Basic.frame_id, 0, body_size, flags) + b"".join(parts)
    return (b"\x02" + channel.to_bytes(2, "big") + len(payload).to_bytes(4, "big") + payload
            + b"\xce")


def pamqp_values(properties: commands.Basic.Properties) -> list[Any]:
    """pamqp's properties as ``header_frame`` takes them (a timestamp as epoch seconds)."""
    values = [getattr(properties, name) for name in properties.__slots__]
    stamp = values[9]
    if isinstance(stamp, datetime.datetime):
        stamp = stamp if stamp.tzinfo else stamp.replace(tzinfo=datetime.UTC)
        values[9] = int(stamp.timestamp())
    elif isinstance(stamp, time.struct_time):
        values[9] = calendar.timegm(stamp)
    return values


def publish_method(channel: int, exchange: str, routing_key: str, mandatory: bool) -> bytes:
    """A Basic.Publish method frame, written directly (it is one per rewritten publish)."""
    ex, key = exchange.encode(), routing_key.encode()
    if len(ex) > 255 or len(key) > 255:
        raise ValueError("an exchange name or routing key longer than 255 bytes")
    payload = (b"\x00\x3c\x00\x28\x00\x00" + bytes((len(ex),)) + ex + bytes((len(key),)) + key
               + (b"\x01" if mandatory else b"\x00"))
    size = len(payload).to_bytes(4, "big")
    return b"\x01" + channel.to_bytes(2, "big") + size + payload + b"\xce"


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
