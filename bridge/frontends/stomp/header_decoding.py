"""A STOMP frame's header section, decoded: the exact decoder and the fast path's patterns.

``decode_headers`` reads any header section the version allows, and says what is wrong with one
it does not. The common form (ASCII, LF line ends, only the escapes the version defines) is
validated by one compiled pattern instead, and its decoding waits until someone reads the
headers (``FrameParser`` in ``bridge.frontends.stomp.codec`` uses both).
"""

from __future__ import annotations

import functools
import re

from bridge.frontends.stomp.errors import StompProtocolError
from bridge.frontends.stomp.escaping import EscapeError, unescape
from bridge.frontends.stomp.frame import Headers


def decode_headers(
    block: bytes, table: dict[str, str] | None, crlf: bool, version: str | None, max_headers: int
) -> Headers:
    """Decode a header section (without its final EOL) into (name, value) pairs in wire order."""
    if not block:
        return []
    try:
        text = block.decode()
    except UnicodeDecodeError as exc:
        raise error(version, "bad-encoding", "header is not UTF-8", str(exc)) from None
    lines = text.split("\n")
    if len(lines) > max_headers:
        raise error(
            version,
            "too-many-headers",
            "too many headers",
            f"{len(lines)} headers; at most {max_headers} are accepted",
        )
    if crlf and "\r" in text:
        lines = [line[:-1] if line[-1:] == "\r" else line for line in lines]
    headers: Headers = []
    append = headers.append
    for line in lines:
        name, sep, value = line.partition(":")
        if not name or not sep:
            raise error(
                version,
                "bad-header",
                "malformed header line",
                f"header line {line[:200]!r} is not name:value with a non-empty name",
            )
        append((name, value))
    if table is not None and "\\" in text:
        try:
            headers = [(unescape(n, table), unescape(v, table)) for n, v in headers]
        except EscapeError as exc:
            raise error(
                version, "bad-escape", "bad escape in header", f"{exc} (STOMP {version or '1.2'})"
            ) from None
    return headers


# A header section in the common form: ASCII "name:value" lines ending LF, no CR or NUL, and
# backslashes only in the escapes the version defines. One C-level match validates it, and its
# decoding can then wait until someone reads the headers. Each line is an "unrolled loop" (runs of
# plain characters between escapes), so a line that does not match fails without backtracking.
_NAME_CH = rb"[^:\n\r\\\x00\x80-\xff]"
_VALUE_CH = rb"[^\n\r\\\x00\x80-\xff]"
# Per version: the escapes the fast path accepts (1.0 has none: a backslash is left to _parse).
ESCAPES: dict[str | None, bytes | None] = {
    None: rb"\\[\\cnr]", "1.2": rb"\\[\\cnr]", "1.1": rb"\\[\\cn]", "1.0": None,
}


def _line_pattern(escape: bytes | None) -> bytes:
    if escape is None:
        return rb"%s+:%s*" % (_NAME_CH, _VALUE_CH)
    return rb"(?:%s|%s)%s*(?:%s%s*)*:%s*(?:%s%s*)*" % (
        _NAME_CH, escape, _NAME_CH, escape, _NAME_CH, _VALUE_CH, escape, _VALUE_CH,
    )


@functools.cache
def head_pattern(commands: frozenset[str], escape: bytes | None) -> re.Pattern[bytes]:
    """Command line, header lines (each ending LF) and the blank line, as one match."""
    longest_first = sorted(commands, key=len, reverse=True)
    names = b"|".join(re.escape(c.encode()) for c in longest_first)
    return re.compile(rb"(%s)\n((?:%s\n)*)\n" % (names, _line_pattern(escape)))


def decode_plain(block: bytes) -> Headers:
    """Decode header lines (each ending LF) that ``head_pattern`` accepted, taking backslashes
    as they stand (no escapes in them, or a command that is never escaped): nothing can fail."""
    return [tuple(line.split(":", 1)) for line in block.decode("ascii").split("\n")[:-1]]  # type: ignore[misc]


def decode_escaped(block: bytes, table: dict[str, str]) -> Headers:
    """``decode_plain`` for lines with escapes the pattern already checked against ``table``."""
    headers: Headers = []
    for line in block.decode("ascii").split("\n")[:-1]:
        name, _, value = line.partition(":")
        headers.append((unescape(name, table), unescape(value, table)))
    return headers


def error(version: str | None, kind: str, message: str, detail: str) -> StompProtocolError:
    return StompProtocolError(message, kind=kind, detail=detail, version=version)


def content_length(value: str | bytes | None, version: str | None) -> int | None:
    """A content-length value as an int; anything but ASCII decimal digits is an error."""
    if value is None:
        return None
    if value.isdigit() and value.isascii():
        return int(value)
    shown = value if isinstance(value, str) else value.decode("utf-8", "replace")
    raise error(
        version,
        "bad-content-length",
        "bad content-length",
        f"content-length {shown[:100]!r} is not a non-negative decimal integer",
    )


def raw_content_length(block: bytes, crlf: bool) -> bytes | None:
    """The first content-length value of an undecoded header section (no escape can spell it)."""
    start = block.find(b"content-length:")
    while start > 0 and block[start - 1] != 10:  # only at the start of a line
        start = block.find(b"content-length:", start + 15)
    if start < 0:
        return None
    end = block.find(b"\n", start + 15)
    value = block[start + 15 :] if end < 0 else block[start + 15 : end]
    if crlf and value[-1:] == b"\r":
        value = value[:-1]
    return value
