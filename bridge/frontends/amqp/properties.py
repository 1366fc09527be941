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

from pamqp import commands, decode
from pamqp import header as pheader

from bridge.frontends.amqp.tables import encode_table

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
    """A content header frame (pamqp's writer took two thirds of a staged copy's writing, and
    pamqp 3.3 gets negative integers and floats in a table wrong). ``values``: the 14
    properties in wire order, None for unset; an empty string is left out, as pamqp leaves it
    out. ValueError for a value that does not fit its type."""
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



_NAMES: Final = tuple(commands.Basic.Properties.__slots__)


def read_content_header(payload: bytes) -> pheader.ContentHeader:
    """A content header frame's payload as pamqp reads it. The caller has checked its bounds
    (``tables.check_properties``); a value pamqp could not read either (a short string that
    is not UTF-8) raises as pamqp's reader does."""
    class_id, weight, body_size, flags = _HEAD.unpack_from(payload, 0)
    props = commands.Basic.Properties()
    pos = _HEAD.size
    for (flag, kind), name in zip(_LAYOUT, _NAMES, strict=True):
        if not flags & flag:
            continue
        value: Any
        if kind == "s":
            end = pos + 1 + payload[pos]
            value = payload[pos + 1:end].decode("utf-8")
            pos = end
        elif kind == "o":
            value = payload[pos]
            pos += 1
        elif kind == "T":
            stamp: float = _STAMP.unpack_from(payload, pos)[0]
            if stamp > 0xFFFFFFFF:  # pamqp's reading: past the year 2106, milliseconds
                stamp /= 1000.0
            value = datetime.datetime.fromtimestamp(stamp, tz=datetime.UTC)
            pos += 8
        else:
            used, value = decode.field_table(payload[pos:])
            pos += used
        setattr(props, name, value)
    header = pheader.ContentHeader(weight, body_size, props)
    header.class_id = class_id
    return header
