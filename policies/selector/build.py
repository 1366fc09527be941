"""Helpers for code that writes selectors, such as an adapter that browses for one message.

They write only what every selector engine the bridge meets reads the same way: identifiers in
ASCII (ActiveMQ's lexer takes no other, though JMS allows any Java identifier) and none of
ActiveMQ's reserved words, which add XPATH and XQUERY to the JMS ones.
"""

from __future__ import annotations

import re

from policies.selector.lexer import KEYWORDS

__all__ = ["RESERVED_WORDS", "equals", "quoted"]

RESERVED_WORDS = KEYWORDS | {"XPATH", "XQUERY"}
_PORTABLE_IDENTIFIER = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")


def quoted(value: str) -> str:
    """``value`` as a selector string literal: in single quotes, each quote doubled."""
    return "'" + value.replace("'", "''") + "'"


def equals(identifier: str, value: str) -> str | None:
    """The selector ``identifier = 'value'``; None when ``identifier`` cannot be written as a
    selector identifier (not an ASCII Java identifier, or a reserved word in any case)."""
    if not _PORTABLE_IDENTIFIER.fullmatch(identifier) or identifier.upper() in RESERVED_WORDS:
        return None
    return f"{identifier} = {quoted(value)}"
