"""Big-endian unsigned integers read off bytes, octet by octet (no tuple per read, as
``struct.unpack_from`` makes)."""

from __future__ import annotations


def u16(data: bytes, at: int) -> int:
    return data[at] << 8 | data[at + 1]


def u32(data: bytes, at: int) -> int:
    return data[at] << 24 | data[at + 1] << 16 | data[at + 2] << 8 | data[at + 3]


def u64(data: bytes, at: int) -> int:
    return u32(data, at) << 32 | u32(data, at + 4)
