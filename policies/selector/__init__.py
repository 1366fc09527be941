"""JMS 2.0 message selectors (the SQL-92 subset), parsed once and compiled to closures that
evaluate a message's STOMP headers. Pure: no I/O, stdlib only.

    >>> s = compile_selector("JMSPriority > 4 AND region IN ('EU', 'US')")
    >>> s.matches({"priority": "7", "region": "EU"})
    True

Modules: ``lexer`` (text -> tokens), ``parser`` (tokens -> ``nodes``, the syntax tree, with the
checks that need no message), ``headers`` (which header an identifier reads, per broker),
``values`` (Java's conversions and arithmetic), ``like`` (LIKE patterns), ``compiler`` (tree ->
closures), ``build`` (helpers for code that writes selectors). A malformed selector raises
:class:`~policies.errors.InvalidSelector` naming the column.
"""

from policies.errors import InvalidSelector
from policies.selector.build import RESERVED_WORDS, equals, quoted
from policies.selector.compiler import Selector, compile_selector
from policies.selector.header_map import (
    ACTIVEMQ,
    RABBITMQ,
    Field,
    FieldKind,
    HeaderMap,
    for_broker,
    tibco_destination,
)  # fmt: skip
from policies.selector.lexer import KEYWORDS, is_identifier
from policies.selector.like import like_matcher
from policies.selector.nodes import Node, Type
from policies.selector.parser import MAX_HEIGHT, MAX_NESTING, parse

__all__ = [
    "ACTIVEMQ", "KEYWORDS", "MAX_HEIGHT", "MAX_NESTING", "RABBITMQ", "RESERVED_WORDS", "Field",
    "FieldKind", "HeaderMap", "InvalidSelector", "Node", "Selector", "Type", "compile_selector",
    "for_broker",
    "equals", "is_identifier", "like_matcher", "parse", "quoted", "tibco_destination",
]  # fmt: skip
