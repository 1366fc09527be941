"""Staged messages picked by a JMS selector over their own headers and properties (a business
key: ``orderId = 42 AND region = 'EU'``), with the dead-letter tools' grammar
(``policies.selector``).

A selector reads a staged message as the application sent it (``envelope.own_headers``): every
property is the text its header carries, and a comparison with a number reads that text as the
number's Java type, so ``orderId = 42`` selects "42" sent over STOMP and an int sent over AMQP
alike (the broker hands both to the staging queues as the header text "42").

The staged catalogue keeps each message's own headers as a JSON object; ``narrowing`` gives
the SQL condition SQLite checks first (an equality or IN on a property, or its presence), so
that the exact selector runs in Python only on the rows that can match.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from bridge.staging.envelope import own_headers
from policies.selector import HeaderMap, Selector, compile_selector, for_broker
from policies.selector.nodes import (
    And,
    Between,
    Comparison,
    Identifier,
    In,
    IsNull,
    Like,
    Literal,
    Node,
    Or,
    Type,
)  # fmt: skip


def compile_for(text: str, broker: str) -> Selector:
    """The compiled selector (InvalidSelector naming the column when it does not parse)."""
    return compile_selector(text, for_broker(broker))


def picks(selector: Selector, headers: Mapping[str, str]) -> bool:
    """Whether ``selector`` selects the staged copy whose headers are ``headers``."""
    return selector.matches(own_headers(headers))


def props_json(headers: Mapping[str, str]) -> str:
    """A staged copy's own headers as the catalogue keeps them."""
    return json.dumps(own_headers(headers), separators=(",", ":"), ensure_ascii=False)


def picks_json(selector: Selector, props: str | None) -> bool:
    """Whether ``selector`` selects the catalogued message whose own headers are ``props``
    (None: catalogued without them; never selected, ``--scan`` finds it)."""
    if props is None:
        return False
    try:
        headers = json.loads(props)
    except ValueError:
        return False
    return isinstance(headers, dict) and selector.matches(headers)


def narrowing(selector: Selector, column: str = "props") -> tuple[str, list[object]] | None:
    """An SQL condition over the JSON ``column`` that every message ``selector`` selects
    meets (it may let through more), with its arguments; None when no part of the selector
    gives one."""
    return _narrow(selector.tree, selector.headers, column)


def _property(node: Node, headers: HeaderMap) -> str | None:
    """The header a plain property identifier reads (NULL when absent); None for anything
    else (a JMS field has its own header and a default)."""
    if not isinstance(node, Identifier):
        return None
    name = node.name
    if name in headers.fields or name in headers.not_properties:
        return None
    return name


def _path(name: str) -> str:
    return '$."' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _narrow(node: Node, headers: HeaderMap, column: str) -> tuple[str, list[object]] | None:
    if isinstance(node, And):
        parts = [p for p in (_narrow(o, headers, column) for o in node.operands) if p]
        if not parts:
            return None
        return " AND ".join(f"({sql})" for sql, _ in parts), [a for _, args in parts for a in args]
    if isinstance(node, Or):
        ors = [_narrow(o, headers, column) for o in node.operands]
        if not all(ors):
            return None
        found = [p for p in ors if p is not None]
        return " OR ".join(f"({sql})" for sql, _ in found), [a for _, args in found for a in args]
    # A comparison, IN, LIKE or BETWEEN with a missing property is unknown, never TRUE.
    if isinstance(node, Comparison):
        name, literal = _property(node.left, headers), node.right
        if name is None:
            name, literal = _property(node.right, headers), node.left
        if name is None:
            return None
        value = f"json_extract({column}, ?)"
        if node.op == "=" and isinstance(literal, Literal):
            if literal.type is Type.STRING:
                return f"{value} = ?", [_path(name), literal.value]
            if literal.type in (Type.INT, Type.LONG):
                # Text Integer.valueOf/Long.valueOf reads as N (a sign, leading zeros) is
                # text SQLite's CAST reads as N too.
                return f"CAST({value} AS INTEGER) = ?", [_path(name), literal.value]
        return f"{value} IS NOT NULL", [_path(name)]
    if isinstance(node, In):
        name = _property(node.operand, headers)
        if name is None:
            return None
        if node.negated or not node.values:
            return f"json_extract({column}, ?) IS NOT NULL", [_path(name)]
        marks = ", ".join("?" for _ in node.values)
        return f"json_extract({column}, ?) IN ({marks})", [_path(name), *node.values]
    if isinstance(node, Like | Between) or (isinstance(node, IsNull) and node.negated):
        name = _property(node.operand, headers)
        if name is None:
            return None
        return f"json_extract({column}, ?) IS NOT NULL", [_path(name)]
    return None
