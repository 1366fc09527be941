"""SQL LIKE patterns as ActiveMQ reads them, matched with a regular expression or, when the
pattern has no wildcard, a plain comparison."""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = ["like_matcher"]


def like_matcher(pattern: str, escape: str | None) -> Callable[[str], bool]:
    """A test for LIKE ``pattern``: ``_`` one character, ``%`` any run of them. The escape
    character quotes a following ``_``, ``%`` or itself and is itself otherwise (ActiveMQ's
    reading; SQL would refuse the pattern)."""
    parts: list[str] = []  # regular expression pieces
    literal = True  # no wildcard at all
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == escape and i + 1 < len(pattern) and pattern[i + 1] in ("_", "%", escape):
            parts.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        if c == "%":
            parts.append(".*")
            literal = False
        elif c == "_":
            parts.append(".")
            literal = False
        else:
            parts.append(re.escape(c))
        i += 1
    if literal:
        text = "".join(re.sub(r"\\(.)", r"\1", p, flags=re.DOTALL) for p in parts)
        return lambda value: value == text
    regex = re.compile("".join(parts), re.DOTALL)
    return lambda value: regex.fullmatch(value) is not None
