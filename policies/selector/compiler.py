"""Syntax tree -> nested Python closures over a message's header map.

Every identifier's type is known once the header map is (:mod:`policies.selector.header_map`): a
JMS field has its own, any other property is a string. So each comparison is specialised when it
is compiled, and a message only pays for header look-ups and the comparisons themselves.

Values: None is NULL (SQL's unknown); conditions give True, False or None; a message is selected
only when the whole selector gives True. The rules, with where they come from:

- a comparison with NULL is unknown, on either side (JMS 2.0 3.8.1.2; ActiveMQ gives FALSE for
  ``'a' = missing`` and TRUE for ``missing = other_missing``);
- a string compared with a number is parsed as that number's Java type (Integer.valueOf,
  Long.valueOf, Double.valueOf), and with a boolean by Boolean.valueOf: what ActiveMQ does for
  every STOMP subscription (it adds ``convert_string_expressions:`` to the selector), since STOMP
  carries every property as a string. Text that does not parse makes the comparison FALSE;
- other unlike types (a boolean with a number) compare FALSE, as the spec says, so ``<>`` is
  TRUE; ``LIKE`` on a non-string is FALSE and ``IN`` on one unknown (ActiveMQ's; the spec only
  says both take strings);
- comparing two strings with ``<`` is ordering by UTF-16 code units (String.compareTo);
- arithmetic follows Java's promotion: int, long (both wrap around) or double, with ``/`` always
  a double division (ActiveMQ's; Java would truncate two ints). Arithmetic on a string or a
  boolean is NULL: a string cannot be used in arithmetic (JMS 2.0 3.8.1.2), and ActiveMQ selects
  nothing there either (it gives NULL for a negated string and throws for - * /; only its
  ``+`` concatenates strings);
- a string or number used as a condition is FALSE (ActiveMQ's boolean cast).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any

from policies.selector.header_map import ACTIVEMQ, HeaderMap, conversion
from policies.selector.like import like_matcher
from policies.selector.nodes import (
    NUMERIC,
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
)  # fmt: skip
from policies.selector.parser import parse
from policies.selector.values import (
    FAILED,
    compare_doubles,
    divide,
    java_bool,
    java_double,
    java_int,
    java_long,
    utf16_key,
    wrap_int,
    wrap_long,
)  # fmt: skip

__all__ = ["Selector", "compile_selector"]

Headers = Mapping[str, str]
Fn = Callable[[Headers], Any]


class Selector:
    """A compiled selector. ``matches(headers)`` says whether a message is selected;
    ``evaluate(headers)`` gives the three-valued result (True, False, None for unknown)."""

    __slots__ = ("evaluate", "headers", "matches", "source", "tree")

    def __init__(self, source: str, tree: Node, headers: HeaderMap, evaluate: Fn) -> None:
        self.source = source
        self.tree = tree
        self.headers = headers
        self.evaluate: Callable[[Headers], bool | None] = evaluate
        self.matches: Callable[[Headers], bool] = lambda h: evaluate(h) is True

    def __repr__(self) -> str:
        return f"Selector({self.source!r})"


def compile_selector(source: str | Node, headers: HeaderMap = ACTIVEMQ) -> Selector:
    """Parse (InvalidSelector if it does not) and compile a selector for ``headers``."""
    tree = parse(source) if isinstance(source, str) else source
    evaluate = _Compiler(headers).condition(tree)
    return Selector(source if isinstance(source, str) else repr(tree), tree, headers, evaluate)


class _Value:
    """A compiled expression: its closure, static type, and, when it needs no message, its
    value. ``header`` is set when it is a plain read of one string header."""

    __slots__ = ("fn", "header", "type", "value")

    def __init__(
        self, fn: Fn, type_: Type, value: object = FAILED, header: str | None = None
    ) -> None:
        self.fn = fn
        self.type = type_
        self.value = value
        self.header = header

    @property
    def constant(self) -> bool:
        return self.value is not FAILED


def _constant(value: object, type_: Type) -> _Value:
    return _Value(lambda h: value, type_, value)


def _folded(fn: Fn, type_: Type, *parts: _Value) -> _Value:
    """``fn`` evaluated now when every part is a constant."""
    if all(p.constant for p in parts):
        return _constant(fn({}), type_)
    return _Value(fn, type_)


_ORDER_TESTS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq, "<>": operator.ne, "<": operator.lt, "<=": operator.le,
    ">": operator.gt, ">=": operator.ge,
}  # fmt: skip
_ARITHMETIC: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul,
}  # fmt: skip
_NUMBER_PARSERS: dict[Type, Callable[[str], Any]] = {
    Type.INT: java_int, Type.LONG: java_long, Type.DOUBLE: java_double,
}  # fmt: skip


class _Compiler:
    def __init__(self, headers: HeaderMap) -> None:
        self.headers = headers

    def condition(self, node: Node) -> Fn:
        return _as_condition(self.expr(node))

    def expr(self, node: Node) -> _Value:
        method: Callable[[Any], _Value] = getattr(self, "_" + type(node).__name__.lower())
        return method(node)

    # -- values ----------------------------------------------------------------------------

    def _literal(self, node: Literal) -> _Value:
        return _constant(node.value, node.type)

    def _identifier(self, node: Identifier) -> _Value:
        name = node.name
        spec = self.headers.fields.get(name)
        if spec is None:
            if name in self.headers.not_properties:
                return _constant(None, Type.NULL)
            return _Value(lambda h: h.get(name), Type.STRING, header=name)
        type_, convert = conversion(spec.kind)
        names, default = spec.headers, spec.default

        def read(h: Headers) -> Any:
            for header in names:
                text = h.get(header)
                if text is not None:
                    break
            else:
                if default is None:
                    return None
                text = default
            value = convert(text)
            return None if value is FAILED else value

        return _Value(read, type_)

    def _negate(self, node: Negate) -> _Value:
        operand = self.expr(node.operand)
        fn, type_ = operand.fn, operand.type
        if type_ not in NUMERIC:
            return _constant(None, Type.NULL)
        wraps: dict[Type, Callable[[Any], Any]] = {
            Type.INT: wrap_int, Type.LONG: wrap_long, Type.DOUBLE: operator.neg
        }
        wrap = wraps[type_]
        sign = -1 if type_ is not Type.DOUBLE else 1

        def negate(h: Headers) -> Any:
            value = fn(h)
            return None if value is None else wrap(sign * value)

        return _folded(negate, type_, operand)

    def _arithmetic(self, node: Arithmetic) -> _Value:
        left, right = self.expr(node.left), self.expr(node.right)
        lf, rf = left.fn, right.fn
        types = {left.type, right.type}
        if not types <= NUMERIC:  # NULL, or a string or boolean in arithmetic
            return _constant(None, Type.NULL)
        op = node.op
        combine: Callable[[Any, Any], Any]
        if op == "/":
            result, combine = Type.DOUBLE, lambda a, b: divide(float(a), float(b))
        else:
            plain: Callable[[Any, Any], Any] = _ARITHMETIC[op]
            if Type.DOUBLE in types:
                result, combine = Type.DOUBLE, lambda a, b: plain(float(a), float(b))
            elif Type.LONG in types:
                result, combine = Type.LONG, lambda a, b: wrap_long(plain(a, b))
            else:
                result, combine = Type.INT, lambda a, b: wrap_int(plain(a, b))

        def arithmetic(h: Headers) -> Any:
            a = lf(h)
            if a is None:
                return None
            b = rf(h)
            if b is None:
                return None
            return combine(a, b)

        return _folded(arithmetic, result, left, right)

    # -- conditions ------------------------------------------------------------------------

    def _comparison(self, node: Comparison) -> _Value:
        return self.compare(node.op, self.expr(node.left), self.expr(node.right))

    def compare(self, op: str, left: _Value, right: _Value) -> _Value:
        lt, rt = left.type, right.type
        lf, rf = left.fn, right.fn
        if Type.NULL in (lt, rt):
            return _constant(None, Type.BOOLEAN)
        unlike = op == "<>"  # the answer when the types are unlike or a string does not parse
        lconv: Callable[[Any], Any] | None = None
        rconv: Callable[[Any], Any] | None = None
        test = _ORDER_TESTS[op]
        if lt is Type.STRING and rt in NUMERIC:
            lconv, lt = _NUMBER_PARSERS[rt], rt
        elif rt is Type.STRING and lt in NUMERIC:
            rconv, rt = _NUMBER_PARSERS[lt], lt
        elif lt is Type.STRING and rt is Type.BOOLEAN:
            lconv, lt = java_bool, Type.BOOLEAN
        elif rt is Type.STRING and lt is Type.BOOLEAN:
            rconv, rt = java_bool, Type.BOOLEAN
        if lt in NUMERIC and rt in NUMERIC:
            if Type.DOUBLE in (lt, rt):
                order = _ORDER_TESTS[op]
                test = lambda a, b: order(compare_doubles(float(a), float(b)), 0)  # noqa: E731
        elif lt is Type.STRING and rt is Type.STRING:
            if op not in ("=", "<>"):
                order = _ORDER_TESTS[op]
                test = lambda a, b: order(utf16_key(a), utf16_key(b))  # noqa: E731
        elif not (lt is Type.BOOLEAN and rt is Type.BOOLEAN):
            def unlike_types(h: Headers) -> Any:
                return None if lf(h) is None or rf(h) is None else unlike
            return _folded(unlike_types, Type.BOOLEAN, left, right)

        if right.constant and right.value is not None and lconv is None and left.header:
            header, b = left.header, right.value

            def header_test(h: Headers) -> Any:
                a = h.get(header)
                return None if a is None else test(a, b)

            return _Value(header_test, Type.BOOLEAN)
        if right.constant and right.value is not None and rconv is None:
            b = right.value

            def constant_test(h: Headers) -> Any:
                a = lf(h)
                if a is None:
                    return None
                if lconv is not None:
                    a = lconv(a)
                    if a is FAILED:
                        return unlike
                return test(a, b)

            return _folded(constant_test, Type.BOOLEAN, left)

        def general(h: Headers) -> Any:
            a = lf(h)
            if a is None:
                return None
            b = rf(h)
            if b is None:
                return None
            if lconv is not None:
                a = lconv(a)
                if a is FAILED:
                    return unlike
            if rconv is not None:
                b = rconv(b)
                if b is FAILED:
                    return unlike
            return test(a, b)

        return _folded(general, Type.BOOLEAN, left, right)

    def _between(self, node: Between) -> _Value:
        value, low, high = self.expr(node.operand), self.expr(node.low), self.expr(node.high)
        if node.negated:  # a < low OR a > high
            return self.logic(False, [
                self.compare("<", value, low), self.compare(">", value, high)
            ])
        return self.logic(True, [self.compare(">=", value, low), self.compare("<=", value, high)])

    def _in(self, node: In) -> _Value:
        operand = self.expr(node.operand)
        if operand.type is not Type.STRING:
            return _constant(None, Type.BOOLEAN)
        fn, values, negated = operand.fn, frozenset(node.values), node.negated

        def in_(h: Headers) -> Any:
            value = fn(h)
            return None if value is None else (value in values) is not negated

        return _folded(in_, Type.BOOLEAN, operand)

    def _like(self, node: Like) -> _Value:
        operand = self.expr(node.operand)
        fn, negated = operand.fn, node.negated
        if operand.type is Type.NULL:
            return _constant(None, Type.BOOLEAN)
        if operand.type is not Type.STRING:  # LIKE is FALSE, so NOT LIKE is TRUE
            return _folded(lambda h: None if fn(h) is None else negated, Type.BOOLEAN, operand)
        match = like_matcher(node.pattern, node.escape)

        def like(h: Headers) -> Any:
            value = fn(h)
            return None if value is None else match(value) is not negated

        return _folded(like, Type.BOOLEAN, operand)

    def _isnull(self, node: IsNull) -> _Value:
        operand = self.expr(node.operand)
        fn, negated = operand.fn, node.negated
        return _folded(lambda h: (fn(h) is None) is not negated, Type.BOOLEAN, operand)

    def _not(self, node: Not) -> _Value:
        operand = self.expr(node.operand)
        fn = _as_condition(operand)

        def not_(h: Headers) -> Any:
            value = fn(h)
            return None if value is None else not value

        return _folded(not_, Type.BOOLEAN, operand)

    def _and(self, node: And) -> _Value:
        return self.logic(True, [self.expr(operand) for operand in node.operands])

    def _or(self, node: Or) -> _Value:
        return self.logic(False, [self.expr(operand) for operand in node.operands])

    def logic(self, conjunction: bool, operands: list[_Value]) -> _Value:
        """AND (``conjunction``) or OR in three-valued logic: the first operand equal to the
        short-circuit value (FALSE for AND, TRUE for OR) decides; else unknown if any is."""
        fns = tuple(_as_condition(v) for v in operands)
        stop, otherwise = not conjunction, conjunction

        def logic(h: Headers) -> Any:
            unknown = False
            for fn in fns:
                value = fn(h)
                if value is stop:
                    return stop
                if value is None:
                    unknown = True
            return None if unknown else otherwise

        return _folded(logic, Type.BOOLEAN, *operands)


def _as_condition(value: _Value) -> Fn:
    if value.type is Type.BOOLEAN:
        return value.fn
    if value.type is Type.NULL:
        return lambda h: None
    fn = value.fn
    return lambda h: None if fn(h) is None else False
