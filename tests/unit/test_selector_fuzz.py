"""Property tests: any text either parses or raises InvalidSelector (never another exception,
never a hang), and whatever parses evaluates to True, False or None on any headers."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.selector import (
    ACTIVEMQ,
    RABBITMQ,
    InvalidSelector,
    compile_selector,
    equals,
    parse,
    quoted,
)

# Pieces that make random text look like a selector often enough to reach the deeper branches.
TOKENS = st.sampled_from([
    " ", "a", "b", "JMSPriority", "JMSType", "JMSDestination", "JMSRedelivered", "x_1", "$y",
    "=", "<>", "<", ">", "<=", ">=", "+", "-", "*", "/", "(", ")", ",", "'", "''", "'a'",
    "'%'", "'_'", "'\\'", "NOT", "AND", "OR", "BETWEEN", "LIKE", "ESCAPE", "IN", "IS", "NULL",
    "TRUE", "false", "0", "1", "5L", "0x1F", "017", "08", "1.5", "1e3", ".5", "5.", "1e",
    "2147483648", "9223372036854775808", "9" * 5000, "0x" + "f" * 5000, "\n", "\t", "\x00",
    "é", "%", "#", "!", "[", "]",
])  # fmt: skip
SELECTORISH = st.lists(st.one_of(TOKENS, st.text(max_size=3)), max_size=30).map(" ".join)
IDENTIFIERS = st.sampled_from(["a", "b", "x_1", "$y", "JMSPriority", "JMSTimestamp",
                               "JMSRedelivered", "JMSType", "JMSDestination", "priority"])
NUMBERS = st.sampled_from(["0", "1", "-1", "2147483647", "9223372036854775807", "1.5", "1e3",
                           "0x1F", "017", "5L", "-0.0"])
STRINGS = st.sampled_from(["'a'", "''", "'1'", "'true'", "'Queue[A]'", "'it''s'"])
ATOMS = st.one_of(IDENTIFIERS, NUMBERS, STRINGS, st.sampled_from(["TRUE", "FALSE", "NULL"]))


def _grow(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    two = st.tuples(inner, inner)
    return st.one_of(
        two.map(lambda p: f"{p[0]} {{}} {p[1]}").flatmap(
            lambda f: st.sampled_from(["=", "<>", "<", ">=", "+", "-", "*", "/", "AND", "OR"])
            .map(f.format)),
        inner.map(lambda e: f"({e})"),
        inner.map(lambda e: f"NOT {e}"),
        inner.map(lambda e: f"-{e}"),
        inner.map(lambda e: f"{e} IS NOT NULL"),
        st.tuples(inner, inner, inner).map(lambda t: f"{t[0]} NOT BETWEEN {t[1]} AND {t[2]}"),
        IDENTIFIERS.map(lambda i: f"{i} IN ('a', '1', 'Queue[A]')"),
        inner.map(lambda e: f"{e} LIKE 'a!%%' ESCAPE '!'"),
    )


GRAMMATICAL = st.recursive(ATOMS, _grow, max_leaves=12)
HEADERS = st.dictionaries(
    st.sampled_from(["a", "b", "x_1", "$y", "priority", "type", "redelivered", "destination",
                     "amqp-message-id", "timestamp"]),
    st.one_of(st.sampled_from(["", "1", "-5", "1.5", "true", "NaN", "abc", "/queue/A", "2147483648",
                               "9999999999999999999", "1" * 5000, "0" * 5000 + "1"]),
              st.text(max_size=5)),
)  # fmt: skip


def _check(text: str, headers: dict[str, str]) -> None:
    try:
        tree = parse(text)
    except InvalidSelector as error:
        assert 1 <= error.column <= len(text) + 1
        assert str(error).startswith(f"invalid selector at column {error.column}: ")
        return
    for mapping in (ACTIVEMQ, RABBITMQ):
        selector = compile_selector(tree, mapping)
        assert selector.evaluate(headers) in (True, False, None)
        assert selector.matches(headers) is (selector.evaluate(headers) is True)


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SELECTORISH, HEADERS)
def test_selectorish_text_parses_or_raises_invalid_selector(text: str, headers: dict) -> None:
    _check(text, headers)


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(GRAMMATICAL, HEADERS)
def test_grammatical_selectors_parse_or_raise_and_evaluate(text: str, headers: dict) -> None:
    _check(text, headers)


@settings(max_examples=1000, deadline=None)
@given(st.text(max_size=60), HEADERS)
def test_any_text_parses_or_raises_invalid_selector(text: str, headers: dict) -> None:
    _check(text, headers)


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=30), st.text(max_size=30))
def test_equals_writes_a_selector_that_selects_exactly_that_value(name: str, value: str) -> None:
    selector = equals(name, value)
    if selector is None:
        return
    compiled = compile_selector(selector, ACTIVEMQ.with_fields())
    if name in ACTIVEMQ.fields or name in ACTIVEMQ.not_properties:
        return
    assert compiled.matches({name: value})
    assert not compiled.matches({name: value + "x"})
    assert compile_selector(f"v = {quoted(value)}").matches({"v": value})
