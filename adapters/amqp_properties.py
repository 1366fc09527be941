"""Basic's content header properties on the wire, written and read here rather than by pamqp:
a delayed publish has its properties read and its staged copy's written, and pamqp's reader and
writer were a third of that work. The values are pamqp's (``commands.Basic.Properties``, its
types: a timestamp as a UTC datetime, a table as pamqp decodes it), so the rest of the front-end
sees no difference; ``tests/unit/test_amqp_header_writer.py`` holds both to pamqp's.
"""

from __future__ import annotations

import calendar
import datetime
import struct
import time
from collections.abc import Sequence
from typing import Any, Final

from pamqp import commands
from pamqp import header as pheader

from adapters.amqp_octets import u16, u64
from adapters.amqp_tables import decode_table, encode_table

# Basic's properties in their wire order: flag bit and type (s: shortstr, o: octet, t: field
# table, T: timestamp), as pamqp's Basic.Properties states them.
_LAYOUT: Final = tuple(
    (commands.Basic.Properties.flags[name],
     {"shortstr": "s", "octet": "o", "table": "t", "timestamp": "T"}[
         getattr(commands.Basic.Properties, "_" + name)])
    for name in commands.Basic.Properties.__slots__
)
_HEAD: Final = struct.Struct(">HHQH")  # class id, weight, body size, property flags
_BASIC_CLASS: Final = commands.Basic.frame_id.to_bytes(2, "big") + bytes(2)  # and weight 0


def header_frame(channel: int, body_size: int, values: Sequence[Any]) -> bytes:
    """A content header frame (pamqp's writer took two thirds of a staged copy's writing, and
    pamqp 3.3 gets negative integers and floats in a table wrong). ``values``: the 14
    properties in wire order, None for unset; an empty string is left out, as pamqp leaves it
    out. ValueError for a value that does not fit its type."""
    if len(values) != len(_LAYOUT):
        raise ValueError(f"{len(values)} property values; Basic has {len(_LAYOUT)}")
    flags = 0
    parts: list[bytes] = []
    for i, value in enumerate(values):
        if value is None or value == "":
            continue
        flag, kind = _LAYOUT[i]
        flags |= flag
        if kind == "s":
            raw = value.encode()
            if len(raw) > 255:
                raise ValueError(f"a property longer than 255 bytes ({value[:40]!r}...)")
            parts += (_LENGTHS[len(raw)], raw)
        elif kind == "t":
            parts.append(encode_table(value))
        elif kind == "o":
            parts.append(bytes((value,)))  # ValueError outside 0-255
        else:
            if not 0 <= value <= 0xFFFFFFFFFFFFFFFF:
                raise ValueError(f"a timestamp outside 0 to 2**64-1 ({value})")
            parts.append(value.to_bytes(8, "big"))
    properties = b"".join(parts)
    return b"".join((b"\x02", channel.to_bytes(2, "big"),
                     (len(properties) + _HEAD.size).to_bytes(4, "big"), _BASIC_CLASS,
                     body_size.to_bytes(8, "big"), flags.to_bytes(2, "big"), properties,
                     b"\xce"))


_LENGTHS: Final = tuple(bytes((n,)) for n in range(256))


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



_NAMES: Final = tuple(commands.Basic.Properties.__slots__)
# The same properties by pika's attribute names (what ``adapters.rabbitmq_stomp`` maps).
PIKA_NAMES: Final = tuple("type" if n == "message_type" else n for n in _NAMES)


def read_values(payload: bytes, at: int = 12) -> list[Any]:
    """A content header frame's payload as its 14 property values in wire order (None: unset;
    a timestamp as the integer on the wire, a table as pamqp decodes it); ``at``: where its
    property flags are (0: the properties alone). The caller has checked its bounds
    (``amqp_tables.check_properties``) or trusts them; a short string that is not UTF-8 raises
    UnicodeDecodeError, as in pamqp's reader."""
    flags = u16(payload, at)
    values: list[Any] = [None] * len(_LAYOUT)
    if not flags:
        return values
    pos = at + 2
    for i, (flag, kind) in enumerate(_LAYOUT):
        if not flags & flag:
            continue
        if kind == "s":
            end = pos + 1 + payload[pos]
            values[i] = payload[pos + 1:end].decode("utf-8")
            pos = end
        elif kind == "o":
            values[i] = payload[pos]
            pos += 1
        elif kind == "T":
            values[i] = u64(payload, pos)
            pos += 8
        else:
            pos, values[i] = decode_table(payload, pos)
    return values


def _pamqp_stamp(stamp: int) -> datetime.datetime:
    """A timestamp as pamqp reads it: past the year 2106, as milliseconds."""
    seconds: float = stamp / 1000.0 if stamp > 0xFFFFFFFF else stamp
    return datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)


def read_content_header(payload: bytes) -> pheader.ContentHeader:
    """A content header frame's payload as pamqp reads it (``read_values``)."""
    class_id, weight, body_size, _ = _HEAD.unpack_from(payload, 0)
    props = commands.Basic.Properties()
    for name, value in zip(_NAMES, read_values(payload), strict=True):
        if value is not None:
            setattr(props, name, _pamqp_stamp(value) if name == "timestamp" else value)
    header = pheader.ContentHeader(weight, body_size, props)
    header.class_id = class_id
    return header


def plugin_stamp(stamp: int) -> int:
    """A timestamp on the wire in epoch seconds, as pamqp's reading of it gives them (past the
    year 2106 it takes it for milliseconds)."""
    if stamp > 0xFFFFFFFF:
        return int(_pamqp_stamp(stamp).timestamp())
    return stamp
