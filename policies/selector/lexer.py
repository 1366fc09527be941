"""Selector text -> tokens, by the token rules of ActiveMQ's SelectorParser.jj (5.17).

Keywords are case-insensitive; identifiers are case-sensitive Java identifiers (JMS 2.0 3.8.1.1;
ActiveMQ's own lexer takes ASCII only). Numbers, longest match first as JavaCC does it:

    decimal  [1-9][0-9]*[lL]?        the L suffix makes it a long
    hex      0[xX][0-9a-fA-F]+
    octal    0[0-7]*                 so a lone 0 is octal, and 08 is two tokens
    float    1.5  1.  .5  1e3  1.5E-2  (no f/d suffix, no hex floats)

An integer is an int when it fits in 32 bits and a long otherwise, with or without the L suffix
(ActiveMQ's typing: Java would make 2147483647L + 1 a long); past 64 bits it is an error (the
JMS spec supports the range of long). Strings are quoted with ``'``, and
``''`` inside one stands for a quote. Whitespace is space, tab, CR, LF and form feed. ActiveMQ's
SQL comments (``--`` to end of line, ``/* */``) are not JMS and are not taken.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from enum import Enum

from policies.errors import InvalidSelector

__all__ = ["KEYWORDS", "Kind", "Token", "describe", "is_identifier", "tokenize"]

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1

# JMS 2.0 3.8.1.1: an identifier cannot be one of these (any case).
KEYWORDS = frozenset(
    {"NOT", "AND", "OR", "BETWEEN", "LIKE", "ESCAPE", "IN", "IS", "TRUE", "FALSE", "NULL"}
)


class Kind(Enum):
    IDENTIFIER = "identifier"
    KEYWORD = "keyword"  # text upper-cased
    STRING = "string"  # value decoded
    INTEGER = "integer"  # value an int
    FLOAT = "float"
    SYMBOL = "symbol"  # = <> < <= > >= + - * / ( ) ,
    END = "end"


@dataclass(frozen=True, slots=True)
class Token:
    kind: Kind
    text: str  # as written (keywords upper-cased)
    offset: int  # 0-based, into the selector
    value: str | int | float | None = None


_WHITESPACE = " \t\r\n\f"
_SYMBOLS = ("<>", "<=", ">=", "=", "<", ">", "+", "-", "*", "/", "(", ")", ",")
_NUMBERS = (  # in JavaCC's order, which breaks ties between matches of the same length
    ("decimal", re.compile(r"[1-9][0-9]*[lL]?")),
    ("hex", re.compile(r"0[xX][0-9a-fA-F]+")),
    ("octal", re.compile(r"0[0-7]*")),
    ("float", re.compile(
        r"[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+"
    )),
)  # fmt: skip
_ASCII_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_$")
_ASCII_PART = _ASCII_START | frozenset("0123456789")
_START_CATEGORIES = frozenset({"Lu", "Ll", "Lt", "Lm", "Lo", "Nl", "Sc", "Pc"})
_PART_CATEGORIES = _START_CATEGORIES | {"Nd", "Mn", "Mc", "Cf"}


def _identifier_start(c: str) -> bool:
    """Java's Character.isJavaIdentifierStart."""
    if c < "\x80":
        return c in _ASCII_START
    return unicodedata.category(c) in _START_CATEGORIES


def _identifier_part(c: str) -> bool:
    """Java's Character.isJavaIdentifierPart, less the ISO control characters it ignores."""
    if c < "\x80":
        return c in _ASCII_PART
    return unicodedata.category(c) in _PART_CATEGORIES


def is_identifier(name: str) -> bool:
    """True when ``name`` is a selector identifier: a Java identifier that is not a keyword."""
    return (
        bool(name)
        and _identifier_start(name[0])
        and all(_identifier_part(c) for c in name[1:])
        and name.upper() not in KEYWORDS
    )


def describe(c: str) -> str:
    """A character as an error message shows it."""
    return repr(c) if c.isprintable() else f"U+{ord(c):04X}"


def tokenize(selector: str) -> list[Token]:
    """All tokens of ``selector``, ending with an END token; InvalidSelector at the first bad
    character."""
    tokens: list[Token] = []
    n = len(selector)
    i = 0
    while True:
        while i < n and selector[i] in _WHITESPACE:
            i += 1
        if i >= n:
            tokens.append(Token(Kind.END, "", n))
            return tokens
        c = selector[i]
        if c == "'":
            token = _string(selector, i)
        elif c.isdigit() and c < "\x80" or c == "." and "0" <= selector[i + 1 : i + 2] <= "9":
            token = _number(selector, i)
        elif _identifier_start(c):
            j = i + 1
            while j < n and _identifier_part(selector[j]):
                j += 1
            word = selector[i:j]
            if word.upper() in KEYWORDS:
                token = Token(Kind.KEYWORD, word.upper(), i)
            else:
                token = Token(Kind.IDENTIFIER, word, i, word)
        else:
            for symbol in _SYMBOLS:
                if selector.startswith(symbol, i):
                    token = Token(Kind.SYMBOL, symbol, i)
                    break
            else:
                raise InvalidSelector(selector, i + 1, f"unexpected character {describe(c)}")
        tokens.append(token)
        i += len(token.text)


def _string_length(selector: str, start: int) -> int:
    j = start + 1
    while True:
        k = selector.find("'", j)
        if k < 0:
            raise InvalidSelector(selector, start + 1, "unterminated string literal")
        if selector.startswith("''", k):
            j = k + 2
            continue
        return k + 1 - start


def _string(selector: str, start: int) -> Token:
    length = _string_length(selector, start)
    text = selector[start : start + length]
    return Token(Kind.STRING, text, start, text[1:-1].replace("''", "'"))


def _number(selector: str, start: int) -> Token:
    best, form = "", ""
    for name, pattern in _NUMBERS:
        m = pattern.match(selector, start)
        if m and len(m.group()) > len(best):
            best, form = m.group(), name
    if not best:  # never an empty token: the lexer would not move on
        raise InvalidSelector(selector, start + 1, "malformed number")
    if form == "float":
        return Token(Kind.FLOAT, best, start, float(best))
    digits = best.rstrip("lL")[2 if form == "hex" else 0 :].lstrip("0") or "0"
    if len(digits) > 22:  # past 64 bits in any base, and past what Python converts from text
        raise InvalidSelector(selector, start + 1, f"number out of range of long: {best[:30]}")
    value = int(digits, {"hex": 16, "octal": 8}.get(form, 10))
    if value > LONG_MAX + 1 or value == LONG_MAX + 1 and form != "decimal":
        raise InvalidSelector(selector, start + 1, f"number out of range of long: {best}")
    return Token(Kind.INTEGER, best, start, value)
