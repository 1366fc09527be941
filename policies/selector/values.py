"""Java's value rules, as the selector engines written in Java apply them: string -> number
parsing (Integer.valueOf, Long.valueOf, Double.valueOf, Boolean.valueOf), 32- and 64-bit
wrap-around, double division by zero, Double.compareTo and String.compareTo.

A parse that fails gives FAILED; the callers turn that into a FALSE comparison.
"""

from __future__ import annotations

import math
import re
from typing import Final

from policies.selector.lexer import INT_MAX, INT_MIN, LONG_MAX, LONG_MIN

__all__ = [
    "FAILED", "compare_doubles", "divide", "java_bool", "java_double", "java_int", "java_long",
    "utf16_key", "wrap_int", "wrap_long",
]  # fmt: skip


class _Failed:
    __slots__ = ()

    def __repr__(self) -> str:
        return "FAILED"


FAILED: Final = _Failed()

_INTEGER = re.compile(r"[+-]?[0-9]+")
_DOUBLE = re.compile(
    r"[+-]?(?:NaN|Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)[fFdD]?"
)


def _integer(text: str, low: int, high: int) -> int | _Failed:
    # Python refuses to convert more than 4300 digits; no such number fits in 64 bits anyway.
    if not _INTEGER.fullmatch(text):
        return FAILED
    digits = text.lstrip("+-").lstrip("0")
    if len(digits) > 19:
        return FAILED
    value = -int(digits or "0") if text[0] == "-" else int(digits or "0")
    return value if low <= value <= high else FAILED


def java_int(text: str) -> int | _Failed:
    """Integer.valueOf: an optional sign and ASCII digits, in 32 bits."""
    return _integer(text, INT_MIN, INT_MAX)


def java_long(text: str) -> int | _Failed:
    """Long.valueOf: an optional sign and ASCII digits, in 64 bits."""
    return _integer(text, LONG_MIN, LONG_MAX)


def java_double(text: str) -> float | _Failed:
    """Double.valueOf: leading and trailing characters up to U+0020 ignored, an f/d suffix
    allowed, NaN and Infinity spelled as Java spells them (hex floats are not taken)."""
    text = text.strip("".join(map(chr, range(0x21))))
    if not _DOUBLE.fullmatch(text):
        return FAILED
    return float(text.rstrip("fFdD").replace("Infinity", "inf"))


def java_bool(text: str) -> bool:
    """Boolean.valueOf: true for "true" in any case, false for anything else."""
    return text.lower() == "true"


def wrap_int(value: int) -> int:
    return (value - INT_MIN) % 2**32 + INT_MIN


def wrap_long(value: int) -> int:
    return (value - LONG_MIN) % 2**64 + LONG_MIN


def divide(left: float, right: float) -> float:
    """Java's double division: by zero it gives an infinity or NaN instead of raising."""
    try:
        return left / right
    except ZeroDivisionError:
        if left == 0 or math.isnan(left):
            return math.nan
        return math.copysign(math.inf, left) * math.copysign(1.0, right)


def compare_doubles(left: float, right: float) -> int:
    """Double.compareTo: -0.0 below 0.0, NaN equal to itself and above everything."""
    if left < right:
        return -1
    if left > right:
        return 1
    if left == right and (left != 0 or math.copysign(1, left) == math.copysign(1, right)):
        return 0
    left_nan, right_nan = math.isnan(left), math.isnan(right)
    if left_nan or right_nan:
        return int(left_nan) - int(right_nan)
    return -1 if math.copysign(1, left) < 0 else 1  # -0.0 against 0.0


def utf16_key(text: str) -> bytes:
    """String.compareTo orders by UTF-16 code units, which code point order is not."""
    return text.encode("utf-16-be", "surrogatepass")
