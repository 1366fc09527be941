"""STOMP frames as values, and the writing side: serialize() and error_frame().

A parsed Frame keeps the exact wire bytes in ``raw`` because a proxy forwards what the peer sent
unless it changes the message; ``headers`` is decoded for reading only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from bridge.frontends.stomp.escaping import UNESCAPED_COMMANDS, escape

CLIENT_COMMANDS: frozenset[str] = frozenset(
    {
        "CONNECT", "STOMP", "SEND", "SUBSCRIBE", "UNSUBSCRIBE", "ACK", "NACK",
        "BEGIN", "COMMIT", "ABORT", "DISCONNECT",
    }
)  # fmt: skip
SERVER_COMMANDS: frozenset[str] = frozenset({"CONNECTED", "MESSAGE", "RECEIPT", "ERROR"})

Headers = list[tuple[str, str]]
LazyHeaders = tuple[Callable[..., Headers], tuple[Any, ...]]  # a decoder and its arguments
_NO_HEADERS: Mapping[str, str] = MappingProxyType({})


class HeartBeat:
    """One EOL received between frames; use the HEARTBEAT singleton."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "HEARTBEAT"


class NeedData:
    """Returned by next_event() when more bytes are needed; use the NEED_DATA singleton."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


HEARTBEAT = HeartBeat()
NEED_DATA = NeedData()


class Frame:
    """One STOMP frame: ``raw`` is the exact wire bytes (command through NUL); the body is the
    part of it from ``body_at`` to the NUL, copied out only when someone reads ``body``."""

    __slots__ = ("command", "raw", "body_at", "_headers", "_lazy")

    command: str
    raw: bytes
    body_at: int  # where the body starts in ``raw``: the command and headers are raw[:body_at]
    _headers: Headers | None
    _lazy: LazyHeaders | None

    def __init__(
        self,
        command: str,
        headers: Iterable[tuple[str, str]] | Mapping[str, str] = (),
        body: bytes = b"",
        *,
        version: str | None = "1.2",
    ) -> None:
        """Build a frame to send; ``raw`` is serialized now, escaped per ``version``."""
        items = headers.items() if isinstance(headers, Mapping) else headers
        self.command = command
        self._headers = [(str(k), str(v)) for k, v in items]
        self._lazy = None
        self.raw = serialize(command, self._headers, body, version=version)
        self.body_at = len(self.raw) - len(body) - 1

    @property
    def body(self) -> bytes:
        return self.raw[self.body_at : -1]

    @property
    def body_length(self) -> int:
        return len(self.raw) - self.body_at - 1

    @property
    def headers(self) -> Headers:
        """Decoded headers in wire order, repeats kept; unchecked frames decode on first use."""
        headers = self._headers
        if headers is None:
            assert self._lazy is not None
            decode, args = self._lazy
            headers = self._headers = decode(*args)
            self._lazy = None
        return headers

    def get(self, name: str, default: str | None = None) -> str | None:
        """The value of the first header called ``name`` (STOMP: the first occurrence wins)."""
        for key, value in self.headers:
            if key == name:
                return value
        return default

    def __contains__(self, name: object) -> bool:
        return any(key == name for key, _ in self.headers)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Frame):
            return NotImplemented
        return (self.command, self.headers, self.body, self.raw) == (
            other.command,
            other.headers,
            other.body,
            other.raw,
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        body = self.body if len(self.body) <= 40 else self.body[:40] + b"..."
        headers = self.headers if self._lazy is None else "<undecoded>"
        return f"Frame({self.command!r}, {headers!r}, {body!r})"


def serialize(
    command: str,
    headers: Iterable[tuple[str, str]] | Mapping[str, str],
    body: bytes = b"",
    *,
    version: str | None = "1.2",
) -> bytes:
    """Encode a frame, escaping per ``version`` (None follows 1.2; CONNECT/STOMP/CONNECTED never).

    Adds nothing: a body holding NUL needs a content-length header from the caller, and a value
    the version cannot carry raises ValueError rather than producing a frame peers misread.
    """
    if not command or any(c in command for c in "\n\r\0"):
        raise ValueError(f"bad STOMP command {command!r}")
    items = headers.items() if isinstance(headers, Mapping) else headers
    escaped = command not in UNESCAPED_COMMANDS
    if escaped and version != "1.0":
        head, has_length = _escaped_head(command, list(items), version)
        if not has_length and b"\0" in body:
            raise ValueError("a body containing NUL needs a content-length header")
        return b"".join((head.encode(), body, b"\0"))
    parts = [command, "\n"]
    has_length = False
    for name, value in items:
        if not name:
            raise ValueError("a STOMP header name cannot be empty")
        if name == "content-length":
            has_length = True
        parts += (
            escape(name, version, escaped=escaped, name=True),
            ":",
            escape(value, version, escaped=escaped),
            "\n",
        )
    parts.append("\n")
    if not has_length and b"\0" in body:
        raise ValueError("a body containing NUL needs a content-length header")
    return b"".join(("".join(parts).encode(), body, b"\0"))


def _escaped_head(
    command: str, items: list[tuple[str, str]], version: str | None
) -> tuple[str, bool]:
    """The head of a frame whose headers are escaped (STOMP 1.1 and 1.2), and whether it has a
    content-length: every name and value escaped in a few passes over one string (joined with
    NUL, which no header may hold) instead of a call each; the same text ``escape`` gives."""
    texts = [text for item in items for text in item]
    blob = "\0".join(texts)
    if blob.count("\0") != max(len(texts) - 1, 0):
        raise ValueError("a STOMP header cannot contain NUL")
    names = texts[::2]
    if not all(names):
        raise ValueError("a STOMP header name cannot be empty")
    blob = blob.replace("\\", "\\\\")
    if version != "1.1":
        blob = blob.replace("\r", "\\r")
    blob = blob.replace("\n", "\\n").replace(":", "\\c")
    escaped = blob.split("\0") if texts else []
    lines = "\n".join(map(":".join, zip(escaped[::2], escaped[1::2], strict=True)))
    return f"{command}\n{lines}\n\n" if items else f"{command}\n\n", "content-length" in names


def error_frame(
    message: str,
    *,
    detail: str = "",
    version: str | None = "1.2",
    receipt_id: str | None = None,
    headers: Iterable[tuple[str, str]] = (),
) -> bytes:
    """An ERROR frame: one-line ``message`` header, text/plain ``detail`` body, content-length."""
    line = " ".join(message.splitlines()).replace("\0", " ").strip() or "error"
    body = detail.encode()
    out: Headers = [("message", line)]
    if receipt_id is not None:
        out.append(("receipt-id", receipt_id))
    out.extend(headers)
    out += [("content-type", "text/plain"), ("content-length", str(len(body)))]
    return serialize("ERROR", out, body, version=version)
