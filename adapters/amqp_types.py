"""The types of an AMQP message's header table, carried through the STOMP-shaped path.

Messages cross the staging interface as STOMP headers (strings), so an AMQP header table's
integers, booleans, floats and decimals would come back as strings and its byte strings,
timestamps and nested tables not at all. A message that entered through the AMQP front-end
therefore carries its typed table (and its delivery mode) in one more header,
``TYPES_HEADER``: an AMQP field table, base64. Whoever turns STOMP headers back into AMQP
properties (``amqp_properties``) lays the typed values back over the strings:

- an entry whose string is the one the STOMP view made of the typed value gets the typed value;
- an entry the STOMP view could not show (it dropped it) comes back typed, unless it was
  removed on the way (its name is not in ``TYPES_HEADER``'s table, or is named in ``removed``);
- an entry whose string changed keeps the new string (the bridge changed it on purpose).

The header stays on a staged copy (it has ``STAGED_MARK``) and is removed from anything else:
the released message, a dead letter, a redelivered copy carry the typed table and no marker.
pika's encoder, which writes the staging engine's properties, cannot write floats: a float
comes back as a ``decimal.Decimal`` of the same value.
"""

from __future__ import annotations

import base64
import binascii
import decimal
import functools
import struct
from collections.abc import Mapping
from typing import Any

from pika import data as pdata  # type: ignore[attr-defined]
from pika import exceptions as pexceptions

from policies.properties import text

TYPES_HEADER = "x-jms-bridge-amqp-types"
# A staged copy's own header (bridge.staging.envelope.TARGET): the types stay on such a copy.
STAGED_MARK = "jms-bridge-target"
_HEADERS = "headers"
_DELIVERY_MODE = "delivery-mode"


def shown(value: Any) -> str | None:
    """What the STOMP view shows of a header-table value
    (``adapters.rabbitmq_stomp.table_headers``): its text (``policies.properties.text``); None
    for what it drops."""
    return text(value)


def _writable(value: Any) -> Any:
    """``value`` as pika can write it: floats (in lists and tables too) as Decimals."""
    if isinstance(value, float):
        return decimal.Decimal(repr(value))
    if isinstance(value, dict):
        return {k: _writable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_writable(v) for v in value]
    if isinstance(value, bytearray):
        return bytes(value)
    return value


def encode(table: Mapping[str, Any] | None, delivery_mode: int | None = None,
           *, drop: frozenset[str] | set[str] = frozenset()) -> str | None:
    """``TYPES_HEADER``'s value for a typed header table (less the entries named in ``drop``)
    and delivery mode; None when there is nothing a STOMP view would lose."""
    # (Loops, not comprehensions: this runs for every screened AMQP publish.)
    kept: dict[str, Any] = {}
    lossy = False  # a value the STOMP view does not show as it is: anything but a string
    if table:
        for name, value in table.items():
            if name not in drop:
                kept[name] = _writable(value)
                if not isinstance(value, str):
                    lossy = True
    mode_lost = delivery_mode is not None and delivery_mode != 2
    if not lossy and not mode_lost:
        return None
    if not kept and delivery_mode in _MODE_ONLY:
        return _MODE_ONLY[delivery_mode]
    outer: dict[str, Any] = {_HEADERS: kept}
    if delivery_mode is not None:
        outer[_DELIVERY_MODE] = delivery_mode
    pieces: list[bytes] = []
    try:
        pdata.encode_table(pieces, outer)
    except (pexceptions.UnsupportedAMQPFieldException, ValueError, OverflowError,
            struct.error):
        return None  # something even pika cannot write: the strings will do
    return base64.b64encode(b"".join(pieces)).decode()


def with_entry(text: str | None, name: str, value: Any) -> str | None:
    """``TYPES_HEADER``'s value ``text`` (None: there was none) with one more typed entry."""
    found = decode(text) if text else None
    table, mode = found if found is not None else ({}, None)
    return encode({**table, name: value}, mode)


@functools.lru_cache(maxsize=256)
def decode(text: str) -> tuple[dict[str, Any], int | None] | None:
    """The typed table and delivery mode ``encode`` wrote; None for anything else. Cached (a
    producer's messages mostly carry the same types): the table returned is not to be
    changed."""
    try:
        raw = base64.b64decode(text.encode(), validate=True)
        outer, _ = pdata.decode_table(raw, 0)
    except (binascii.Error, ValueError, TypeError, IndexError, KeyError, UnicodeError,
            struct.error, pexceptions.InvalidFieldTypeException):
        return None
    table = outer.get(_HEADERS)
    mode = outer.get(_DELIVERY_MODE)
    if not isinstance(table, dict):
        return None
    return table, mode if isinstance(mode, int) else None


def overlaid(found_table: Mapping[str, Any] | None, delivery_mode: int | None,
             headers: Mapping[str, str], removed: frozenset[str] = frozenset(),
             ) -> tuple[Mapping[str, Any] | None, int | None]:
    """``overlay`` on a header table and delivery mode: the ones to write instead."""
    if not found_table or TYPES_HEADER not in found_table:
        return found_table, delivery_mode
    table: dict[str, Any] = dict(found_table)
    text = table[TYPES_HEADER]
    if STAGED_MARK not in headers:
        del table[TYPES_HEADER]
    found = decode(text) if isinstance(text, str) else None
    if found is None:
        return table or None, delivery_mode
    typed, mode = found
    for name, value in typed.items():
        if name in removed:
            continue
        view = shown(value)
        if name in table:
            if view is not None and table[name] == view:
                table[name] = value
        elif view is None:
            table[name] = value
    if mode is not None and delivery_mode is None and headers.get("persistent") == str(mode):
        delivery_mode = mode
    return table or None, delivery_mode


# The types of a message with no table entries to keep and a transient delivery mode (the most
# common case that needs one), written once.
_MODE_ONLY: dict[int | None, str] = {}
_MODE_ONLY[1] = encode({}, 1) or ""
