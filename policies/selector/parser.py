"""Tokens -> syntax tree, with JMS 2.0's SQL-92 precedence, and the type checks that need no
message (a string literal in ``<``, arithmetic on a boolean, ``= NULL``...).

    selector   := or END
    or         := and (OR and)*
    and        := not (AND not)*
    not        := NOT not | predicate
    predicate  := sum [ (= | <> | < | <= | > | >=) sum
                      | [NOT] BETWEEN sum AND sum
                      | [NOT] IN ( string (, string)* )
                      | [NOT] LIKE string [ESCAPE string]
                      | IS [NOT] NULL ]
    sum        := product ((+ | -) product)*
    product    := unary ((* | /) unary)*
    unary      := (+ | -) unary | primary
    primary    := literal | identifier | ( or )

Unlike ActiveMQ, ``NOT`` binds more loosely than a comparison (``NOT a = 1`` is ``NOT (a = 1)``,
as SQL-92 and the JMS spec have it; ActiveMQ reads ``(NOT a) = 1``) and comparisons do not chain.
Nesting is bounded (MAX_NESTING, MAX_HEIGHT) so that no input can exhaust the stack.
"""

from __future__ import annotations

from policies.errors import InvalidSelector
from policies.selector.lexer import INT_MAX, INT_MIN, LONG_MAX, Kind, Token, tokenize
from policies.selector.nodes import (
    And,
    Arithmetic,
    Between,
    Comparison,
    Identifier,
    In,
    IsNull,
    Like,
    Literal,
    Negate,
    Node,
    Not,
    Or,
    Type,
    children,
)  # fmt: skip

__all__ = ["MAX_HEIGHT", "MAX_NESTING", "parse"]

MAX_NESTING = 40  # parentheses, NOT and signs inside one another
MAX_HEIGHT = 100  # levels of the tree (a + b + c + ... is as deep as it is long)

_ORDERING = ("<", "<=", ">", ">=")
_COMPARISONS = ("=", "<>", *_ORDERING)


def parse(selector: str) -> Node:
    """The tree of ``selector``; InvalidSelector naming the column where it goes wrong."""
    if not isinstance(selector, str):
        raise TypeError("a selector is a str")
    tree = _Parser(selector).parse()
    _check_height(selector, tree)
    return tree


def _shape(node: Node) -> str:
    """What the parser can know of a node's type: num, str, bool, null, or ident (unknown)."""
    if isinstance(node, Literal):
        return _LITERAL_SHAPES.get(node.type, "num")
    if isinstance(node, Identifier):
        return "ident"
    if isinstance(node, Negate | Arithmetic):
        return "num"
    return "bool"


_LITERAL_SHAPES = {Type.STRING: "str", Type.BOOLEAN: "bool", Type.NULL: "null"}
_SHAPE_WORDS = {"num": "a number", "str": "a string", "bool": "a condition", "null": "NULL"}


class _Parser:
    def __init__(self, selector: str) -> None:
        self.selector = selector
        self.tokens = tokenize(selector)
        self.at = 0
        self.nesting = 0

    # -- tokens ----------------------------------------------------------------------------

    @property
    def token(self) -> Token:
        return self.tokens[self.at]

    def take(self) -> Token:
        token = self.tokens[self.at]
        if token.kind is not Kind.END:
            self.at += 1
        return token

    def is_symbol(self, *symbols: str) -> bool:
        return self.token.kind is Kind.SYMBOL and self.token.text in symbols

    def is_keyword(self, *words: str, ahead: int = 0) -> bool:
        token = self.tokens[min(self.at + ahead, len(self.tokens) - 1)]
        return token.kind is Kind.KEYWORD and token.text in words

    def fail(self, token: Token, reason: str | None = None) -> InvalidSelector:
        if reason is None:
            if token.kind is Kind.END:
                reason = "unexpected end of selector"
            else:
                reason = f"unexpected {token.text!r}"
        return InvalidSelector(self.selector, token.offset + 1, reason)

    def expect_symbol(self, symbol: str) -> Token:
        if not self.is_symbol(symbol):
            raise self.fail(self.token, None if self.token.kind is Kind.END else
                            f"expected {symbol!r}, found {self.token.text!r}")
        return self.take()

    def expect_keyword(self, word: str) -> Token:
        if not self.is_keyword(word):
            raise self.fail(self.token, None if self.token.kind is Kind.END else
                            f"expected {word}, found {self.token.text!r}")
        return self.take()

    def string(self, what: str) -> str:
        token = self.token
        if token.kind is not Kind.STRING:
            raise self.fail(token, None if token.kind is Kind.END else
                            f"{what} must be a string literal, found {token.text!r}")
        self.take()
        assert isinstance(token.value, str)
        return token.value

    def nest(self, token: Token) -> None:
        self.nesting += 1
        if self.nesting > MAX_NESTING:
            raise self.fail(token, f"nested more than {MAX_NESTING} levels deep")

    # -- type checks that need no message ----------------------------------------------------

    def need(self, node: Node, allowed: tuple[str, ...], role: str) -> None:
        shape = _shape(node)
        if shape not in allowed:  # the column of the operand at fault, not of the operator
            raise InvalidSelector(self.selector, node.column, f"{role}, not {_SHAPE_WORDS[shape]}")

    def condition(self, node: Node) -> Node:
        self.need(node, ("bool", "ident", "null"), "expected a condition")
        return node

    # -- grammar ---------------------------------------------------------------------------

    def parse(self) -> Node:
        node = self.or_()
        if self.token.kind is not Kind.END:
            raise self.fail(self.token)
        return self.condition(node)

    def or_(self) -> Node:
        first = self.token
        operands = [self.and_()]
        while self.is_keyword("OR"):
            self.condition(operands[0])
            self.take()
            operands.append(self.condition(self.and_()))
        if len(operands) == 1:
            return operands[0]
        return Or(tuple(operands), first.offset + 1)

    def and_(self) -> Node:
        first = self.token
        operands = [self.not_()]
        while self.is_keyword("AND"):
            self.condition(operands[0])
            self.take()
            operands.append(self.condition(self.not_()))
        if len(operands) == 1:
            return operands[0]
        return And(tuple(operands), first.offset + 1)

    def not_(self) -> Node:
        if not self.is_keyword("NOT"):
            return self.predicate()
        token = self.take()
        self.nest(token)
        operand = self.condition(self.not_())
        self.nesting -= 1
        return Not(operand, token.offset + 1)

    def predicate(self) -> Node:
        first = self.token
        left = self.sum()
        column = first.offset + 1
        token = self.token
        if self.is_symbol(*_COMPARISONS):
            self.take()
            right = self.sum()
            if token.text in _ORDERING:
                role = f"{token.text!r} compares numbers"
                self.need(left, ("num", "ident"), role)
                self.need(right, ("num", "ident"), role)
            else:
                role = f"{token.text!r} cannot compare NULL (use IS NULL)"
                self.need(left, ("num", "ident", "str", "bool"), role)
                self.need(right, ("num", "ident", "str", "bool"), role)
            node: Node = Comparison(token.text, left, right, column)
        elif self.is_keyword("IS"):
            self.take()
            negated = self.is_keyword("NOT")
            if negated:
                self.take()
            self.expect_keyword("NULL")
            node = IsNull(left, negated, column)
        else:
            negated = self.is_keyword("NOT") and self.is_keyword("BETWEEN", "IN", "LIKE", ahead=1)
            if negated:
                self.take()
                token = self.token
            if self.is_keyword("BETWEEN"):
                self.take()
                low = self.sum()
                self.expect_keyword("AND")
                high = self.sum()
                for operand in (left, low, high):
                    self.need(operand, ("num", "ident"), "BETWEEN compares numbers")
                node = Between(left, low, high, negated, column)
            elif self.is_keyword("IN"):
                self.take()
                if not isinstance(left, Identifier):
                    raise self.fail(first, "IN needs a property name on its left")
                self.expect_symbol("(")
                values = [self.string("an IN list item")]
                while self.is_symbol(","):
                    self.take()
                    values.append(self.string("an IN list item"))
                self.expect_symbol(")")
                node = In(left, tuple(values), negated, column)
            elif self.is_keyword("LIKE"):
                self.take()
                self.need(left, ("str", "ident"), "LIKE matches strings")
                pattern = self.string("a LIKE pattern")
                escape = None
                if self.is_keyword("ESCAPE"):
                    escape_token = self.take()
                    escape = self.string("an ESCAPE character")
                    if len(escape) != 1:
                        raise self.fail(escape_token, "ESCAPE takes exactly one character")
                node = Like(left, pattern, escape, negated, column)
            else:
                return left
        if self.is_symbol(*_COMPARISONS) or self.is_keyword("IS", "BETWEEN", "IN", "LIKE"):
            raise self.fail(self.token)  # comparisons do not chain
        return node

    def sum(self) -> Node:
        left = self.product()
        while self.is_symbol("+", "-"):
            token = self.take()
            right = self.product()
            left = self.arithmetic(token, left, right)
        return left

    def product(self) -> Node:
        left = self.unary()
        while self.is_symbol("*", "/"):
            token = self.take()
            right = self.unary()
            left = self.arithmetic(token, left, right)
        return left

    def arithmetic(self, token: Token, left: Node, right: Node) -> Node:
        role = f"{token.text!r} needs numbers"
        self.need(left, ("num", "ident", "null"), role)
        self.need(right, ("num", "ident", "null"), role)
        return Arithmetic(token.text, left, right, left.column)

    def unary(self) -> Node:
        if not self.is_symbol("+", "-"):
            return self.primary()
        token = self.take()
        number = self.token
        if number.kind is Kind.INTEGER or number.kind is Kind.FLOAT:
            self.take()  # a signed literal is one literal, so -2147483648 is an int
            return self.number(number, negative=token.text == "-", column=token.offset + 1)
        self.nest(token)
        operand = self.unary()
        self.nesting -= 1
        self.need(operand, ("num", "ident", "null"), f"unary {token.text!r} needs a number")
        if token.text == "+":
            return operand
        return Negate(operand, token.offset + 1)

    def primary(self) -> Node:
        token = self.token
        kind = token.kind
        if kind is Kind.INTEGER or kind is Kind.FLOAT:
            self.take()
            return self.number(token, negative=False, column=token.offset + 1)
        if kind is Kind.STRING:
            self.take()
            return Literal(token.value, Type.STRING, token.offset + 1)
        if kind is Kind.IDENTIFIER:
            self.take()
            return Identifier(token.text, token.offset + 1)
        if kind is Kind.KEYWORD and token.text in ("TRUE", "FALSE"):
            self.take()
            return Literal(token.text == "TRUE", Type.BOOLEAN, token.offset + 1)
        if kind is Kind.KEYWORD and token.text == "NULL":
            self.take()
            return Literal(None, Type.NULL, token.offset + 1)
        if self.is_symbol("("):
            self.take()
            self.nest(token)
            node = self.or_()
            self.nesting -= 1
            self.expect_symbol(")")
            return node
        raise self.fail(token)

    def number(self, token: Token, *, negative: bool, column: int) -> Literal:
        value = token.value
        assert isinstance(value, int | float)
        if negative:
            value = -value
        if isinstance(value, float):
            return Literal(value, Type.DOUBLE, column)
        if value > LONG_MAX:
            raise self.fail(token, f"number out of range of long: {token.text}")
        return Literal(value, Type.INT if INT_MIN <= value <= INT_MAX else Type.LONG, column)


def _check_height(selector: str, tree: Node) -> None:
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_HEIGHT:
            raise InvalidSelector(
                selector, node.column, f"expression more than {MAX_HEIGHT} levels deep"
            )
        stack.extend((child, depth + 1) for child in children(node))
