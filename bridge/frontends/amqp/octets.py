"""Big-endian unsigned integers read off bytes, octet by octet.

Compiled (``bridge.compiled``), this costs a tenth of ``struct``'s ``unpack_from``, which
makes a tuple of objects each time: the fast paths and the property reader and writer read
several for every message. The octets are added up as mypyc's native 64-bit integers (``i64``:
plain C arithmetic, no tagged integers' overflow checks); run from its source, ``i64`` is only
an annotation (mypy_extensions, which mypyc brings, is not needed then).
"""

from __future__ import annotations

try:
    from mypy_extensions import i64
except ImportError:  # (run from its source where mypyc is not installed: an annotation only)
    i64 = int  # type: ignore[misc]


def u16(data: bytes, at: i64) -> i64:
    high: i64 = data[at]
    low: i64 = data[at + 1]
    return high << 8 | low


def u32(data: bytes, at: i64) -> i64:
    a: i64 = data[at]
    b: i64 = data[at + 1]
    c: i64 = data[at + 2]
    d: i64 = data[at + 3]
    return a << 24 | b << 16 | c << 8 | d


def u64(data: bytes, at: int) -> int:
    high: int = u32(data, at)  # (as an arbitrary-size integer: shifted, it passes 63 bits)
    low: int = u32(data, at + 4)
    return high << 32 | low
