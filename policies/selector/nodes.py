"""The selector syntax tree: plain frozen values, independent of any header mapping, so that one
tree can be compiled to Python closures (:mod:`policies.selector.compiler`) or, later, to Spark
SQL. Every node keeps the 1-based ``column`` it starts at (not part of equality).

Literal types are the JMS ones: strings, booleans, NULL, exact numerics as int (32 bits) or long
(64 bits) and approximate numerics as double. ``BETWEEN``, ``NOT``-forms and ``<>`` are kept as
written rather than rewritten, so that a target language can use its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum

__all__ = [
    "And", "Arithmetic", "Between", "Comparison", "Identifier", "In", "IsNull", "Like",
    "Literal", "Negate", "Node", "Not", "Or", "Type", "children",
]  # fmt: skip


class Type(Enum):
    """A value's JMS type."""

    STRING = "string"
    BOOLEAN = "boolean"
    INT = "int"
    LONG = "long"
    DOUBLE = "double"
    NULL = "null"


NUMERIC = frozenset({Type.INT, Type.LONG, Type.DOUBLE})


@dataclass(frozen=True, slots=True)
class Literal:
    value: str | bool | int | float | None
    type: Type
    column: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Identifier:
    name: str
    column: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Negate:
    """Unary minus (a unary plus leaves no node)."""

    operand: Node
    column: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Arithmetic:
    op: str  # + - * /
    left: Node
    right: Node
    column: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Comparison:
    op: str  # = <> < <= > >=
    left: Node
    right: Node
    column: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Between:
    operand: Node
    low: Node
    high: Node
    negated: bool = False
    column: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class In:
    operand: Identifier
    values: tuple[str, ...]
    negated: bool = False
    column: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Like:
    operand: Node
    pattern: str
    escape: str | None = None
    negated: bool = False
    column: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class IsNull:
    operand: Node
    negated: bool = False
    column: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Not:
    operand: Node
    column: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class And:
    operands: tuple[Node, ...]  # two or more, flattened
    column: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Or:
    operands: tuple[Node, ...]  # two or more, flattened
    column: int = field(default=0, compare=False)


Node = (
    Literal | Identifier | Negate | Arithmetic | Comparison | Between | In | Like | IsNull | Not
    | And | Or
)


def children(node: Node) -> Iterator[Node]:
    """The direct sub-expressions of ``node``."""
    if isinstance(node, Arithmetic | Comparison):
        yield node.left
        yield node.right
    elif isinstance(node, Between):
        yield node.operand
        yield node.low
        yield node.high
    elif isinstance(node, And | Or):
        yield from node.operands
    elif isinstance(node, Negate | In | Like | IsNull | Not):
        yield node.operand
