"""What a message property means, whatever type carried it.

The properties the bridge acts on (``JMS_TIBCO_PRESERVE_UNDELIVERED``, ``JMS_IBM_RETAIN``, the
IBM report options, the delay headers) reach it as STOMP header text, or typed in an AMQP header
table: TIBCO defines its property as a boolean, IBM's as integers, and typed clients (pika, the
JMS clients) send them so. A boolean ``true``, the integer 1 and the text ``"true"`` must give
the same answer, so every reading of such a property goes through here:

- ``flag``: set when it is true, 1, or their text (``"true"`` in any case, ``"1"``);
- ``whole_number``: an integer, a float or decimal with no fraction, or the decimal text of one
  (``"300"``, ``"300.0"``); None for anything else, a boolean included;
- ``text``: how a typed header-table value shows as a header, so that reading the text gives
  what reading the value gives (the AMQP front-end's views and the RabbitMQ adapter show a
  table so).

Pure: values in, values out.
"""

from __future__ import annotations

import decimal
import math
import re
from typing import Final

__all__ = ["flag", "text", "whole_number"]

# A plain ASCII decimal integer, optionally negative, optionally with a zero fraction.
_WHOLE: Final = re.compile(r"(-?)0*([0-9]+)(?:\.0+)?", re.ASCII)
# More digits than this are far beyond any epoch-ms value: clamped rather than fed to int(),
# whose conversion limit would reject them.
_MAX_DIGITS: Final = 20
_HUGE: Final = 10**_MAX_DIGITS


def whole_number(value: object) -> int | None:
    """The whole number ``value`` stands for; None when it is none (a fraction, a boolean,
    text that is not a plain decimal, a type with no number in it). A number of more than 20
    digits is clamped to 10**20 (with its sign)."""
    if isinstance(value, str):
        if len(value) <= _MAX_DIGITS and value.isdigit() and value.isascii():
            return int(value)  # (most values: no sign, no fraction, short)
        found = _WHOLE.fullmatch(value)
        if found is None:
            return None
        sign, digits = found.groups()
        number = _HUGE if len(digits) > _MAX_DIGITS else int(digits)
        return -number if sign else number
    if isinstance(value, bool):
        return None  # a boolean is no number, though Python's bool is an int
    if isinstance(value, int):
        return _clamp(value)
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            return None
        value = decimal.Decimal(repr(value))  # the number it shows as (``text``)
    if isinstance(value, decimal.Decimal):
        if not value.is_finite() or value != value.to_integral_value():
            return None
        return _clamp(int(value))
    return None


def _clamp(number: int) -> int:
    return max(-_HUGE, min(_HUGE, number))


def flag(value: object) -> bool:
    """Whether a property that is set by true or 1 is set: a boolean true, the number 1, the
    text ``true`` in any case or the text of 1 (spaces around it ignored)."""
    if value is True:
        return True
    if isinstance(value, str):
        value = value.strip()
        if value.lower() == "true":
            return True
    return whole_number(value) == 1


def text(value: object) -> str | None:
    """A header-table value as header text, read as the value is read (``flag``,
    ``whole_number``): a string as it is, a boolean as ``true``/``false``, an integer in
    decimal, a float or decimal as its shortest positional decimal text (a float as the decimal
    of its shortest form: pika writes a float as that decimal, so both show alike); None for
    any other type."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        value = decimal.Decimal(repr(value))
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            return str(value)
        if value.is_zero():
            return "0"  # -0.0 too: pika writes it as 0
        # Normalized (pika writes a decimal so: 300.00 and 300.0 come back as 300) and
        # positional ("300", never "3E+2").
        return format(value.normalize(), "f")
    return None
