"""STOMP header escaping per protocol version.

1.2 escapes CR, LF, ':' and '\\'; 1.1 escapes LF, ':' and '\\'; 1.0 escapes nothing, so a value
holding a newline (or a name holding ':') cannot be written in 1.0 at all. CONNECT, STOMP and
CONNECTED are never escaped in any version (so that a peer can read them before it knows the
version), which callers express by passing ``escaped=False``.
"""

from __future__ import annotations

VERSIONS: tuple[str | None, ...] = (None, "1.0", "1.1", "1.2")
UNESCAPED_COMMANDS: frozenset[str] = frozenset({"CONNECT", "STOMP", "CONNECTED"})

# Decoding tables: the character after a backslash -> what it stands for.
UNESCAPE_11: dict[str, str] = {"n": "\n", "c": ":", "\\": "\\"}
UNESCAPE_12: dict[str, str] = {"r": "\r", "n": "\n", "c": ":", "\\": "\\"}


class EscapeError(ValueError):
    """A backslash sequence the version does not define (the codec turns it into bad-escape)."""


def unescape_table(version: str | None) -> dict[str, str] | None:
    """The decoding table for a version; ``None`` (not negotiated) follows 1.2; 1.0 has none."""
    if version == "1.0":
        return None
    if version == "1.1":
        return UNESCAPE_11
    return UNESCAPE_12


def unescape(text: str, table: dict[str, str]) -> str:
    """Undo escaping; raises EscapeError on an undefined sequence or a trailing lone backslash."""
    i = text.find("\\")
    if i < 0:
        return text
    out = []
    start = 0
    while i >= 0:
        out.append(text[start:i])
        replacement = table.get(text[i + 1 : i + 2])
        if replacement is None:
            raise EscapeError(f"undefined escape sequence {text[i : i + 2]!r}")
        out.append(replacement)
        start = i + 2
        i = text.find("\\", start)
    out.append(text[start:])
    return "".join(out)


def escape(text: str, version: str | None, *, escaped: bool = True, name: bool = False) -> str:
    """Escape a header name or value for the wire; ValueError when the version cannot carry it."""
    if "\0" in text:
        raise ValueError("a STOMP header cannot contain NUL")
    if not escaped or version == "1.0":
        if "\n" in text or (name and ":" in text):
            raise ValueError(f"{text!r} cannot be written unescaped (STOMP {version or '1.2'})")
        if not name and version in (None, "1.2") and text.endswith("\r"):
            raise ValueError(f"{text!r} would lose its trailing CR (STOMP {version or '1.2'})")
        return text
    if version == "1.1":
        if "\\" in text or ":" in text or "\n" in text:
            text = text.replace("\\", "\\\\").replace("\n", "\\n").replace(":", "\\c")
        return text
    if "\\" in text or ":" in text or "\n" in text or "\r" in text:
        text = (
            text.replace("\\", "\\\\").replace("\r", "\\r").replace("\n", "\\n").replace(":", "\\c")
        )
    return text
