"""A content header frame with header-table entries set (a delivery's ``JMSXDeliveryCount``),
on its bytes: the entries are spliced in at the end of its header table (or a table made for
them), and the application's own entries keep their bytes, their order and their integer
widths.
"""

from __future__ import annotations

from typing import Final

from adapters.amqp_tables import table_entries
from bridge.frontends.amqp.fastpath import Found

_HEADERS_FLAG: Final = 0x2000
_VIEW_FROM: Final = 16 * 1024  # bytes between two content headers: past this, not copied


_ENTRIES: dict[tuple[str, str], bytes] = {}


def _entry(name: str, value: str) -> bytes:
    found = _ENTRIES.get((name, value))
    if found is None:
        found = _make_entry(name, value)
        if len(_ENTRIES) < 1024:  # the few delivery counts seen again and again
            _ENTRIES[(name, value)] = found
    return found


def _make_entry(name: str, value: str) -> bytes:
    """A header-table entry: an integer as a signed 32-bit ``I`` (what JMS's int property is),
    anything else as a long string."""
    key = name.encode()
    if value.isascii() and value.isdigit() and int(value) < 2**31:
        return bytes((len(key),)) + key + b"I" + int(value).to_bytes(4, "big", signed=True)
    data = value.encode()
    return bytes((len(key),)) + key + b"S" + len(data).to_bytes(4, "big") + data


def stamp_header(raw: bytes, headers: tuple[tuple[str, str], ...]) -> bytes:
    """``raw`` (a content header frame) with ``headers`` set once (a publish's own stamp,
    unlike a consumer's deliveries' not the same each time: nothing kept)."""
    return Stamper(headers, cached=False)._stamp(raw)


class Stamper:
    """Sets the same ``headers`` in content header frames (a delivery's ``JMSXDeliveryCount``):
    their entries written once, the frame's other bytes kept."""

    __slots__ = ("added", "names", "keys", "_last", "_last_stamped")

    def __init__(self, headers: tuple[tuple[str, str], ...], cached: bool = True) -> None:
        entry = _entry if cached else _make_entry
        self.added = b"".join(entry(n, v) for n, v in headers)
        self.names = {n.encode() for n, _ in headers}
        self.keys = tuple(bytes((len(n),)) + n for n in self.names)
        # The last frame stamped and what it became: a consumer's deliveries mostly carry the
        # same content header, byte for byte (same properties, same body size).
        self._last = b""
        self._last_stamped = b""

    def __call__(self, raw: bytes) -> bytes:
        """``raw`` (a content header frame) with the headers set in its header table: an entry
        of the same name already there is removed."""
        if raw == self._last:
            return self._last_stamped
        stamped = self._stamp(raw)
        self._last, self._last_stamped = raw, stamped
        return stamped

    def run(self, raw: bytes, deliveries: list[Found]) -> bytes:
        """A run of deliveries (``fastpath.delivery_run``) with each content header stamped,
        the rest of its bytes (methods, bodies, the confirms between deliveries) as they
        came."""
        parts: list[bytes | memoryview] = []
        view = memoryview(raw)
        at = 0
        for delivery in deliveries:
            header_at = delivery[1]
            body_at = delivery[2]
            # A large body is not copied but once, into the joined bytes; a small one is
            # cheaper to slice than to view.
            parts.append(view[at:header_at] if header_at - at > _VIEW_FROM else raw[at:header_at])
            parts.append(self(raw[header_at:body_at]))
            at = body_at
        parts.append(view[at:] if len(raw) - at > _VIEW_FROM else raw[at:])
        return b"".join(parts)

    def _stamp(self, raw: bytes) -> bytes:
        flags = (raw[19] << 8) | raw[20]
        pos = 21
        if flags & 0x8000:  # content_type, then content_encoding: before the table
            pos += 1 + raw[pos]
        if flags & 0x4000:
            pos += 1 + raw[pos]
        added = self.added
        if flags & _HEADERS_FLAG:
            size = int.from_bytes(raw[pos:pos + 4], "big")
            table = raw[pos + 4:pos + 4 + size]
            if any(key in table for key in self.keys):  # rare: one is there already
                names = self.names
                table = b"".join(table[start:stop] for key, start, stop in table_entries(table)
                                 if key not in names)
            size_after = len(table) + len(added)
            payload_size = len(raw) - 8 + size_after - size
            return b"".join((raw[:3], payload_size.to_bytes(4, "big"), raw[7:pos],
                             size_after.to_bytes(4, "big"), table, added,
                             raw[pos + 4 + size:]))
        payload_size = len(raw) - 8 + 4 + len(added)
        return b"".join((raw[:3], payload_size.to_bytes(4, "big"), raw[7:19],
                         (flags | _HEADERS_FLAG).to_bytes(2, "big"), raw[21:pos],
                         len(added).to_bytes(4, "big"), added, raw[pos:]))
