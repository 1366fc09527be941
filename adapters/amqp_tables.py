"""A bounds check of a method's arguments and a content header's properties, walked over the
bytes before pamqp (or ``decode_table``, for a publish's header table) decodes them; and field
tables written and read.

pamqp trusts lengths: a field array that announces more bytes than the frame holds makes its
decoder loop forever (an empty rest decodes as a zero-byte void), and every table entry is
decoded from a fresh copy of the rest of the buffer. So a frame is walked here first, without
decoding anything: every length within the frame, every field type known, and at most
``max_fields`` table and array entries, which bounds what pamqp's copying can cost.
"""

from __future__ import annotations

import datetime
import decimal
import struct
from collections.abc import Iterable
from typing import Any, Final

from pamqp import commands
from pamqp import decode as pdecode

from adapters.amqp_octets import u16, u32, u64

MAX_FIELDS: Final = 1000  # table and array entries per frame, all levels together
MAX_DEPTH: Final = 32

_FIXED: Final = {"octet": 1, "short": 2, "long": 4, "longlong": 8, "timestamp": 8}
# Field value types (RabbitMQ's errata, as pamqp reads them) of a fixed size.
_FIELD_FIXED: Final = {
    ord("t"): 1, ord("b"): 1, ord("B"): 1, ord("s"): 2, ord("u"): 2, ord("I"): 4, ord("i"): 4,
    ord("l"): 8, ord("L"): 8, ord("f"): 4, ord("d"): 8, ord("D"): 5, ord("T"): 8,
    ord("V"): 0, 0: 0,
}  # fmt: skip
_LONG: Final = struct.Struct(">I")


class _Walk:
    __slots__ = ("data", "fields")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.fields = 0

    def need(self, pos: int, count: int, what: str) -> int:
        end = pos + count
        if end > len(self.data):
            raise ValueError(f"{what} runs past the end of the frame")
        return end

    def value(self, pos: int, kind: str) -> int:
        if kind in _FIXED:
            return self.need(pos, _FIXED[kind], kind)
        if kind == "shortstr":
            self.need(pos, 1, kind)
            return self.need(pos + 1, self.data[pos], kind)
        self.need(pos, 4, kind)
        length = u32(self.data, pos)
        end = self.need(pos + 4, length, kind)
        if kind == "table":
            self.table(pos + 4, end, 0)
        elif kind != "longstr":
            raise ValueError(f"unknown argument type {kind}")
        return end

    def table(self, pos: int, end: int, depth: int) -> None:
        while pos < end:
            self.need(pos, 1, "table key")
            pos = self.need(pos + 1, self.data[pos], "table key")
            pos = self.field(pos, end, depth)

    def array(self, pos: int, end: int, depth: int) -> None:
        while pos < end:
            pos = self.field(pos, end, depth)

    def field(self, pos: int, end: int, depth: int) -> int:
        self.fields += 1
        if self.fields > MAX_FIELDS:
            raise ValueError(f"more than {MAX_FIELDS} table entries")
        if pos >= end:
            raise ValueError("table entry without a value")
        kind = self.data[pos]
        pos += 1
        size = _FIELD_FIXED.get(kind)
        if size is not None:
            stop = pos + size
        else:
            if kind not in b"SxAF":
                raise ValueError(f"unknown field type {bytes([kind])!r}")
            if pos + 4 > end:
                raise ValueError("field length runs past its table")
            stop = pos + 4 + u32(self.data, pos)
            if stop <= end and kind in b"AF":
                if depth >= MAX_DEPTH:
                    raise ValueError(f"tables nested deeper than {MAX_DEPTH}")
                (self.array if kind == ord("A") else self.table)(pos + 4, stop, depth + 1)
        if stop > end:
            raise ValueError("field value runs past its table")
        return stop


def check_method(method_class: type, args: bytes) -> None:
    """Raise ValueError unless ``args`` hold every argument of ``method_class`` in bounds."""
    walk = _Walk(args)
    pos = 0
    bits = 0
    for name in method_class.__slots__:  # type: ignore[attr-defined]
        kind = getattr(method_class, "_" + name)
        if kind == "bit":
            if bits % 8 == 0:
                pos = walk.need(pos, 1, "bit")
            bits += 1
            continue
        bits = 0
        pos = walk.value(pos, kind)


def check_properties(payload: bytes) -> None:
    """Raise ValueError unless a content header payload's properties are all in bounds."""
    walk = _Walk(payload)
    pos = walk.need(0, 12, "content header")
    walk.need(pos, 2, "property flags")
    flags = u16(payload, pos)
    pos += 2
    if flags & 1:
        # Basic's 14 properties fit one flag word; pamqp reads a continued one again and
        # again without moving on, for ever.
        raise ValueError("property flags continue past the first word; Basic has one")
    for flag, kind in _PROPERTIES:
        if flags & flag:
            pos = walk.value(pos, kind)


# Basic's properties in their wire order: flag bit and pamqp's type name.
_PROPERTIES: Final = tuple(
    (commands.Basic.Properties.flags[name], getattr(commands.Basic.Properties, "_" + name))
    for name in commands.Basic.Properties.__slots__
)


def table_entries(table: bytes) -> list[tuple[bytes, int, int]]:
    """(key, start, stop) of each top-level entry of a field table's contents (the bytes after
    its length), bounds-checked as above; ValueError for a table that is not well formed."""
    walk = _Walk(table)
    out: list[tuple[bytes, int, int]] = []
    pos, end = 0, len(table)
    while pos < end:
        start = pos
        key_end = walk.need(pos + 1, table[pos], "table key")
        pos = walk.field(key_end, end, 0)
        out.append((table[start + 1:key_end], start, pos))
    return out


def decode_table(data: bytes, pos: int) -> tuple[int, dict[str, Any]]:
    """(end, table): the field table at ``pos`` (its length first), bounds-checked before
    (``check_properties``), decoded to the values pamqp's ``decode.field_table`` gives. The
    scalar types and nested tables are read here; the rest (arrays, floats, decimals,
    timestamps, byte arrays) by pamqp's own reader. pamqp decodes every entry from a fresh
    copy of the rest of the table; this reads the bytes where they are."""
    end = pos + 4 + u32(data, pos)
    pos += 4
    table: dict[str, Any] = {}
    while pos < end:
        key_end = pos + 1 + data[pos]
        key = data[pos + 1:key_end].decode("utf-8")
        pos, table[key] = _decode_value(data, key_end, end)
    return end, table


def _decode_value(data: bytes, pos: int, end: int) -> tuple[int, Any]:
    """(after, value): the field value whose type octet is at ``pos``, as pamqp reads it."""
    kind = data[pos]
    pos += 1
    if kind == 0x53:  # S: a long string; bytes when it is not UTF-8, as pamqp gives it
        stop = pos + 4 + u32(data, pos)
        raw = data[pos + 4:stop]
        try:
            return stop, raw.decode("utf-8")
        except UnicodeDecodeError:
            return stop, raw
    if kind == 0x49:  # I: signed 32 bits
        value: int = u32(data, pos)  # (int: the same name holds 64-bit values below)
        return pos + 4, value - 0x100000000 if value & 0x80000000 else value
    if kind == 0x6C or kind == 0x4C:  # l, L: signed 64 bits (pamqp reads both signed)
        value = u64(data, pos)
        return pos + 8, value - (1 << 64) if value >> 63 else value
    if kind == 0x74:  # t
        return pos + 1, data[pos] != 0
    if kind == 0x46:  # F: a nested table
        return decode_table(data, pos)
    if kind == 0x69:  # i: unsigned 32 bits
        return pos + 4, u32(data, pos)
    if kind == 0x73:  # s: signed 16 bits
        value = u16(data, pos)
        return pos + 2, value - 0x10000 if value & 0x8000 else value
    if kind == 0x75:  # u
        return pos + 2, u16(data, pos)
    if kind == 0x62:  # b: signed 8 bits
        value = data[pos]
        return pos + 1, value - 0x100 if value & 0x80 else value
    if kind == 0x42:  # B
        return pos + 1, data[pos]
    if kind == 0x56 or kind == 0:  # V (and the undocumented 0 pamqp takes for it): void
        return pos, None
    used, found = pdecode.embedded_value(data[pos - 1:end])
    return pos - 1 + used, found


def encode_table(table: dict[str, Any]) -> bytes:
    """A field table's bytes (its length first), in RabbitMQ's types: integers as signed 32 or
    64 bits, floats as doubles. pamqp 3.3 cannot write an integer from -128 to -1 (it packs a
    signed octet unsigned) and writes floats in single precision."""
    parts: list[bytes] = []
    keys = _KEYS
    for name, value in table.items():
        key = keys.get(name)
        if key is None:
            key = _key(name)
            if len(keys) < 4096:  # the names a bridge writes again and again
                keys[name] = key
        if type(value) is str:  # most entries (every STOMP header): written here
            raw = value.encode()
            parts += (key, b"S", len(raw).to_bytes(4, "big"), raw)
        else:
            parts += (key, _field_value(value))
    body = b"".join(parts)
    return len(body).to_bytes(4, "big") + body


_KEYS: dict[str, bytes] = {}


def wire_keys(names: Iterable[str]) -> tuple[bytes, ...]:
    """Header-table keys as they are on the wire (their length octet, then the name), of those
    of ``names`` that can be one (under 256 bytes), sorted: what a search of a frame's bytes
    looks for."""
    return tuple(_key(n) for n in sorted(names) if len(n.encode()) < 256)


def _key(name: str) -> bytes:
    raw = name.encode()
    if len(raw) > 255:
        raise ValueError(f"table key longer than 255 bytes: {name[:40]}...")
    return bytes((len(raw),)) + raw


def _field_value(value: Any) -> bytes:
    if isinstance(value, bool):
        return b"t" + bytes((int(value),))
    if isinstance(value, int):
        if -(2**31) <= value < 2**31:
            return b"I" + struct.pack(">i", value)
        return b"l" + struct.pack(">q", value)
    if isinstance(value, float):
        return b"d" + struct.pack(">d", value)
    if isinstance(value, decimal.Decimal):
        places = max(-int(value.normalize().as_tuple().exponent), 0)
        unscaled = int(value.scaleb(places))
        return b"D" + struct.pack(">Bi", places, unscaled)
    if isinstance(value, str):
        raw = value.encode()
        return b"S" + _LONG.pack(len(raw)) + raw
    if isinstance(value, bytes | bytearray):
        return b"x" + _LONG.pack(len(value)) + bytes(value)
    if isinstance(value, datetime.datetime):
        stamp = value if value.tzinfo else value.replace(tzinfo=datetime.UTC)
        return b"T" + struct.pack(">Q", int(stamp.timestamp()))
    if isinstance(value, dict):
        return b"F" + encode_table(value)
    if isinstance(value, list):
        body = b"".join(_field_value(v) for v in value)
        return b"A" + _LONG.pack(len(body)) + body
    if value is None:
        return b"V"
    raise ValueError(f"cannot write {type(value).__name__} {value!r} in a field table")
