"""JMS selectors compiled to Spark SQL: the same syntax tree (``policies.selector``) and the
same answers as the Python compiler (``policies.selector.compiler``), as one Column over a
``map<string,string>`` column of a message's headers, so that replay filters a dead-letter
archive or a journal on the cluster.

``to_column`` gives the three-valued answer (TRUE, FALSE, NULL for unknown); ``matches`` the
filter (TRUE only). The rules are the Python compiler's, written with Spark's functions:

- Spark's AND, OR and NOT are SQL's three-valued logic, as the Python compiler's are;
- Java's string to number conversions are regular expressions and range checks before a cast
  (Spark's own cast takes ``' 7'`` and ``'7.5'`` as ints, Java does not);
- int and long arithmetic wraps around as Java's does: the session must not be in ANSI mode
  (``bridge.pipeline.session`` sets that); ``/`` is Java's double division (by zero an
  infinity or NaN, not Spark's NULL);
- double comparison is Double.compareTo (-0.0 below 0.0; NaN equal to itself, above all, as in
  Spark); string ordering is by UTF-16 code units (compared as UTF-16BE bytes);
- LIKE is a Java regular expression built as ``policies.selector.like`` builds its Python one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import reduce
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F

from policies.selector import ACTIVEMQ, FieldKind, HeaderMap, parse
from policies.selector.lexer import INT_MAX, INT_MIN, LONG_MAX, LONG_MIN
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

__all__ = ["matches", "to_column"]

_SPARK_TYPES = {Type.INT: "int", Type.LONG: "long", Type.DOUBLE: "double"}
_QUEUE_PREFIXES = ("/queue/", "/amq/queue/", "/temp-queue/", "/remote-temp-queue/")
_TOPIC_PREFIXES = ("/topic/", "/temp-topic/", "/remote-temp-topic/")
_DOUBLE_TEXT = (r"\A[+-]?(?:NaN|Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)"
                r"[fFdD]?\z")


def to_column(selector: str | Node, headers: str | Column = "headers",
              header_map: HeaderMap = ACTIVEMQ) -> Column:
    """The selector's three-valued answer for the message whose headers are ``headers``."""
    tree = parse(selector) if isinstance(selector, str) else selector
    column = headers if isinstance(headers, Column) else F.col(headers)
    return _condition(_Compiler(column, header_map).expr(tree))


def matches(selector: str | Node, headers: str | Column = "headers",
            header_map: HeaderMap = ACTIVEMQ) -> Column:
    """TRUE where the selector selects the message, FALSE elsewhere (unknown is not)."""
    return F.coalesce(to_column(selector, headers, header_map), F.lit(False))


@dataclass(frozen=True, slots=True)
class _V:
    col: Column
    type: Type


def _null(type_: Type = Type.BOOLEAN) -> _V:
    return _V(F.lit(None).cast("boolean" if type_ is Type.BOOLEAN else "string"), type_)


def _condition(v: _V) -> Column:
    if v.type is Type.BOOLEAN:
        return v.col
    if v.type is Type.NULL:
        return F.lit(None).cast("boolean")
    return F.when(v.col.isNull(), F.lit(None).cast("boolean")).otherwise(F.lit(False))


# -- Java's conversions ------------------------------------------------------------------------


def _java_integer(text: Column, low: int, high: int, spark_type: str) -> Column:
    """Integer.valueOf / Long.valueOf: NULL for text that is not one in range."""
    digits = F.regexp_replace(F.regexp_replace(text, r"\A[+-]", ""), r"\A0+", "")
    number = F.concat(F.regexp_extract(text, r"\A([+-]?)", 1),
                      F.when(digits == "", F.lit("0")).otherwise(digits)).cast("decimal(20,0)")
    ok = text.rlike(r"\A[+-]?[0-9]+\z") & (F.length(digits) <= 19) & number.between(low, high)
    return F.when(ok, number.cast(spark_type))


def _java_double(text: Column) -> Column:
    """Double.valueOf: NULL for text that is not one."""
    trimmed = F.regexp_replace(text, r"\A[\x00-\x20]+|[\x00-\x20]+\z", "")
    plain = F.regexp_replace(trimmed, "[fFdD]\\z", "")
    return F.when(trimmed.rlike(_DOUBLE_TEXT), plain.cast("double"))


def _java_bool(text: Column) -> Column:
    return F.lower(text) == "true"


_PARSERS: dict[Type, Callable[[Column], Column]] = {
    Type.INT: lambda t: _java_integer(t, INT_MIN, INT_MAX, "int"),
    Type.LONG: lambda t: _java_integer(t, LONG_MIN, LONG_MAX, "long"),
    Type.DOUBLE: _java_double,
}


def _negative_zero(x: Column) -> Column:
    """TRUE for -0.0 (atan2(0, -0.0) is pi, atan2(0, 0.0) is 0)."""
    return (x == 0) & (F.atan2(F.lit(0.0), x) > 0)


def _compare_doubles(a: Column, b: Column) -> Column:
    """Double.compareTo as -1, 0, 1 (NULL when either is)."""
    return (
        F.when(a.isNull() | b.isNull(), F.lit(None).cast("int"))
        .when((a == 0) & (b == 0),
              _negative_zero(b).cast("int") - _negative_zero(a).cast("int"))
        .when(a < b, F.lit(-1)).when(a > b, F.lit(1)).otherwise(F.lit(0))
    )


def _divide(a: Column, b: Column) -> Column:
    """Java's double division: by zero an infinity or NaN."""
    sign_b = F.when(_negative_zero(b), F.lit(-1.0)).otherwise(F.lit(1.0))
    by_zero = (F.when((a == 0) | F.isnan(a), F.lit(float("nan")))
               .otherwise(F.lit(float("inf")) * F.signum(a) * sign_b))
    return F.when(b == 0, by_zero).otherwise(a / b)


def _tibco(text: Column) -> Column:
    """policies.selector.header_map.tibco_destination."""
    out = None
    for prefixes, kind in ((_QUEUE_PREFIXES, "Queue"), (_TOPIC_PREFIXES, "Topic")):
        for prefix in prefixes:
            rest = F.concat(F.lit(f"{kind}["), text.substr(F.lit(len(prefix) + 1),
                                                           F.length(text)), F.lit("]"))
            cond = text.startswith(prefix)
            out = F.when(cond, rest) if out is None else out.when(cond, rest)
    assert out is not None
    return (out.when(~text.startswith("/"), F.concat(F.lit("Queue["), text, F.lit("]")))
            .otherwise(text))


def _like_regex(pattern: str, escape: str | None) -> str:
    """policies.selector.like's pattern as a Java regular expression, anchored."""
    parts: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == escape and i + 1 < len(pattern) and pattern[i + 1] in ("_", "%", escape):
            parts.append(_quote(pattern[i + 1]))
            i += 2
            continue
        parts.append(".*" if c == "%" else "." if c == "_" else _quote(c))
        i += 1
    return "(?s)\\A" + "".join(parts) + "\\z"


def _quote(c: str) -> str:
    return c if c.isascii() and c.isalnum() else f"\\x{{{ord(c):X}}}"


_ORDER: dict[str, Callable[[Any, Any], Column]] = {
    "=": lambda a, b: a == b, "<>": lambda a, b: a != b, "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
}  # fmt: skip


class _Compiler:
    def __init__(self, headers: Column, header_map: HeaderMap) -> None:
        self.headers = headers
        self.map = header_map

    def expr(self, node: Node) -> _V:
        method: Callable[[Any], _V] = getattr(self, "_" + type(node).__name__.lower())
        return method(node)

    def _literal(self, node: Literal) -> _V:
        if node.type is Type.NULL:
            return _null(Type.NULL)
        if node.type in _SPARK_TYPES:
            return _V(F.lit(node.value).cast(_SPARK_TYPES[node.type]), node.type)
        return _V(F.lit(node.value), node.type)

    def _identifier(self, node: Identifier) -> _V:
        name = node.name
        spec = self.map.fields.get(name)
        if spec is None:
            if name in self.map.not_properties:
                return _null(Type.NULL)
            return _V(self.headers.getItem(name), Type.STRING)
        reads = [self.headers.getItem(h) for h in spec.headers]
        if spec.default is not None:
            reads.append(F.lit(spec.default))
        text = F.coalesce(*reads) if len(reads) > 1 else reads[0]
        kind = spec.kind
        if kind is FieldKind.STRING:
            return _V(text, Type.STRING)
        if kind is FieldKind.INT:
            return _V(_PARSERS[Type.INT](text), Type.INT)
        if kind is FieldKind.LONG:
            return _V(_PARSERS[Type.LONG](text), Type.LONG)
        if kind is FieldKind.BOOLEAN:
            return _V(_java_bool(text), Type.BOOLEAN)
        if kind is FieldKind.DELIVERY_MODE:
            return _V(F.when(text.isNull(), F.lit(None).cast("string"))
                      .when(F.lower(text) == "true", F.lit("PERSISTENT"))
                      .otherwise(F.lit("NON_PERSISTENT")), Type.STRING)
        return _V(_tibco(text), Type.STRING)

    def _negate(self, node: Negate) -> _V:
        v = self.expr(node.operand)
        if v.type not in NUMERIC:
            return _null(Type.NULL)
        return _V(-v.col, v.type)

    def _arithmetic(self, node: Arithmetic) -> _V:
        left, right = self.expr(node.left), self.expr(node.right)
        types = {left.type, right.type}
        if not types <= NUMERIC:
            return _null(Type.NULL)
        if node.op == "/":
            return _V(_divide(left.col.cast("double"), right.col.cast("double")), Type.DOUBLE)
        result = (Type.DOUBLE if Type.DOUBLE in types else
                  Type.LONG if Type.LONG in types else Type.INT)
        a, b = (v.col.cast(_SPARK_TYPES[result]) for v in (left, right))
        col = a + b if node.op == "+" else a - b if node.op == "-" else a * b
        return _V(col, result)

    def _comparison(self, node: Comparison) -> _V:
        return self.compare(node.op, self.expr(node.left), self.expr(node.right))

    def compare(self, op: str, left: _V, right: _V) -> _V:
        lt, rt = left.type, right.type
        if Type.NULL in (lt, rt):
            return _null()
        unlike = F.lit(op == "<>")
        a, b = left.col, right.col
        either_null = a.isNull() | b.isNull()
        failed: Column | None = None  # a string that does not parse as the other side's type
        if lt is Type.STRING and rt in NUMERIC:
            a, lt = _PARSERS[rt](left.col), rt
            failed = a.isNull()
        elif rt is Type.STRING and lt in NUMERIC:
            b, rt = _PARSERS[lt](right.col), lt
            failed = b.isNull()
        elif lt is Type.STRING and rt is Type.BOOLEAN:
            a, lt = _java_bool(left.col), Type.BOOLEAN
        elif rt is Type.STRING and lt is Type.BOOLEAN:
            b, rt = _java_bool(right.col), Type.BOOLEAN
        test = _ORDER[op]
        if lt in NUMERIC and rt in NUMERIC:
            if Type.DOUBLE in (lt, rt):
                result = test(_compare_doubles(a.cast("double"), b.cast("double")), F.lit(0))
            else:
                result = test(a, b)
        elif lt is Type.STRING and rt is Type.STRING:
            result = test(a, b) if op in ("=", "<>") else test(
                F.encode(a, "UTF-16BE"), F.encode(b, "UTF-16BE"))
        elif lt is Type.BOOLEAN and rt is Type.BOOLEAN:
            result = test(a, b)
        else:
            return _V(F.when(either_null, F.lit(None).cast("boolean")).otherwise(unlike),
                      Type.BOOLEAN)
        answer = F.when(either_null, F.lit(None).cast("boolean"))
        if failed is not None:
            answer = answer.when(failed, unlike)
        return _V(answer.otherwise(result), Type.BOOLEAN)

    def _between(self, node: Between) -> _V:
        value, low, high = self.expr(node.operand), self.expr(node.low), self.expr(node.high)
        if node.negated:
            return self.logic(False, [self.compare("<", value, low),
                                      self.compare(">", value, high)])
        return self.logic(True, [self.compare(">=", value, low), self.compare("<=", value, high)])

    def _in(self, node: In) -> _V:
        v = self.expr(node.operand)
        if v.type is not Type.STRING:
            return _null()
        found = v.col.isin(*node.values)
        return _V(~found if node.negated else found, Type.BOOLEAN)

    def _like(self, node: Like) -> _V:
        v = self.expr(node.operand)
        if v.type is Type.NULL:
            return _null()
        if v.type is not Type.STRING:
            return _V(F.when(v.col.isNull(), F.lit(None).cast("boolean"))
                      .otherwise(F.lit(node.negated)), Type.BOOLEAN)
        found = v.col.rlike(_like_regex(node.pattern, node.escape))
        return _V(~found if node.negated else found, Type.BOOLEAN)

    def _isnull(self, node: IsNull) -> _V:
        v = self.expr(node.operand)
        return _V(v.col.isNotNull() if node.negated else v.col.isNull(), Type.BOOLEAN)

    def _not(self, node: Not) -> _V:
        return _V(~_condition(self.expr(node.operand)), Type.BOOLEAN)

    def _and(self, node: And) -> _V:
        return self.logic(True, [self.expr(o) for o in node.operands])

    def _or(self, node: Or) -> _V:
        return self.logic(False, [self.expr(o) for o in node.operands])

    def logic(self, conjunction: bool, operands: list[_V]) -> _V:
        conditions = [_condition(v) for v in operands]
        join: Callable[[Column, Column], Column] = (
            (lambda x, y: x & y) if conjunction else (lambda x, y: x | y))
        return _V(reduce(join, conditions), Type.BOOLEAN)
