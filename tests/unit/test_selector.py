"""policies.selector: parsing, errors, three-valued evaluation, header maps, helpers."""

from __future__ import annotations

from pathlib import Path

import pytest

from policies.errors import ConfigError
from policies.selector import (
    ACTIVEMQ,
    MAX_HEIGHT,
    RABBITMQ,
    Field,
    FieldKind,
    InvalidSelector,
    compile_selector,
    equals,
    parse,
    quoted,
    tibco_destination,
)  # fmt: skip
from policies.selector.nodes import And, Comparison, Identifier, Literal, Not, Or, Type

CORPUS = Path(__file__).parents[1] / "data" / "selectors.txt"


def ev(selector: str, headers: dict[str, str] | None = None) -> bool | None:
    return compile_selector(selector).evaluate(headers or {})


# -- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("selector", "column", "reason"), [
    ("JMSPriority >> 4", 14, "unexpected '>'"),
    ("", 1, "unexpected end of selector"),
    ("color = ", 9, "unexpected end of selector"),
    ("color = 'red", 9, "unterminated string literal"),
    ("color # 1", 7, "unexpected character '#'"),
    ("color = 'a' AND", 16, "unexpected end of selector"),
    ("a = 1 = 2", 7, "unexpected '='"),
    ("(a = 1", 7, "unexpected end of selector"),
    ("a = 1)", 6, "unexpected ')'"),
    ("color > 'x'", 9, "'>' compares numbers, not a string"),
    ("color = NULL", 9, "cannot compare NULL"),
    ("1 + 1", 1, "expected a condition, not a number"),
    ("'a'", 1, "expected a condition, not a string"),
    ("a AND 3", 7, "expected a condition, not a number"),
    ("'a' + 1 = 2", 1, "'+' needs numbers, not a string"),
    ("TRUE * 2 = 2", 1, "'*' needs numbers, not a condition"),
    ("1 IN ('a')", 1, "IN needs a property name"),
    ("a IN ()", 7, "an IN list item must be a string literal"),
    ("a IN ('x', 1)", 12, "an IN list item must be a string literal"),
    ("a LIKE 'x' ESCAPE 'ab'", 12, "ESCAPE takes exactly one character"),
    ("a LIKE b", 8, "a LIKE pattern must be a string literal"),
    ("5 LIKE '5'", 1, "LIKE matches strings"),
    ("a BETWEEN 'x' AND 'y'", 11, "BETWEEN compares numbers"),
    ("a IS 5", 6, "expected NULL"),
    ("x = 9223372036854775808", 5, "out of range of long"),
    ("x = 0x8000000000000000", 5, "out of range of long"),
    ("x = " + "1" * 5000, 5, "out of range of long"),
    ("x = 0" + "7" * 5000, 5, "out of range of long"),
    ("x = 0x" + "f" * 5000, 5, "out of range of long"),
    ("NULL = x", 1, "cannot compare NULL"),
    ("a = 1 %", 7, "unexpected character '%'"),
    ("a = 08", 6, "unexpected '8'"),
    ("x\x00 = 1", 2, "unexpected character U+0000"),
])  # fmt: skip
def test_a_malformed_selector_names_the_column(selector: str, column: int, reason: str) -> None:
    with pytest.raises(InvalidSelector) as caught:
        parse(selector)
    error = caught.value
    assert isinstance(error, ConfigError)
    assert (error.column, error.selector) == (column, selector)
    assert reason in error.reason
    assert str(error).startswith(f"invalid selector at column {column}: ")


@pytest.mark.parametrize("selector", [
    "(" * 10_000 + "a",
    "(" * 10_000 + "a" + ")" * 10_000,
    "NOT " * 10_000 + "a",
    "- " * 10_000 + "a > 1",
    "a" + " + a" * 10_000 + " > 1",
    "a" + " * a" * 500 + " > 1",
])  # fmt: skip
def test_deep_nesting_is_an_error_not_a_crash(selector: str) -> None:
    with pytest.raises(InvalidSelector, match="levels deep"):
        parse(selector)


def test_long_flat_conditions_are_fine() -> None:
    selector = " OR ".join(f"n = '{i}'" for i in range(5000))
    assert compile_selector(selector).matches({"n": "4999"})
    assert compile_selector(" AND ".join(["a = 'x'"] * 5000)).matches({"a": "x"})
    assert compile_selector("a" + " + a" * (MAX_HEIGHT - 3) + " > 1").matches({}) is False


def test_the_corpus_parses() -> None:
    lines = [s for s in CORPUS.read_text(encoding="utf-8").splitlines()
             if s.strip() and not s.startswith("#")]
    assert len(lines) >= 200
    for line in lines:
        compile_selector(line)


# -- the tree -------------------------------------------------------------------------------


def test_precedence_is_sql_92() -> None:
    assert parse("NOT a = 1 AND b = 2 OR c = 3") == Or((
        And((Not(Comparison("=", Identifier("a"), Literal(1, Type.INT))),
             Comparison("=", Identifier("b"), Literal(2, Type.INT)))),
        Comparison("=", Identifier("c"), Literal(3, Type.INT)),
    ))  # fmt: skip
    assert parse("a = 1 + 2 * 3") == parse("a = (1 + (2 * 3))")
    assert parse("a = 1 - 2 - 3") == parse("a = (1 - 2) - 3")


@pytest.mark.parametrize(("text", "value", "type_"), [
    ("123", 123, Type.INT), ("2147483648", 2147483648, Type.LONG), ("5L", 5, Type.INT),
    ("-2147483648", -(2**31), Type.INT), ("-9223372036854775808", -(2**63), Type.LONG),
    ("0x1F", 31, Type.INT), ("0X1f", 31, Type.INT), ("017", 15, Type.INT), ("0", 0, Type.INT),
    ("1.5", 1.5, Type.DOUBLE), ("1e3", 1000.0, Type.DOUBLE), ("5.", 5.0, Type.DOUBLE),
    (".5", 0.5, Type.DOUBLE), ("1.5E-1", 0.15, Type.DOUBLE), ("'it''s'", "it's", Type.STRING),
    ("TRUE", True, Type.BOOLEAN), ("false", False, Type.BOOLEAN),
])  # fmt: skip
def test_literals(text: str, value: object, type_: Type) -> None:
    tree = parse(f"x = {text}")
    assert isinstance(tree, Comparison)
    assert tree.right == Literal(value, type_)


def test_keywords_any_case_identifiers_case_sensitive() -> None:
    assert parse("a iS nOt NuLl aNd b = TrUe") == parse("a IS NOT NULL AND b = TRUE")
    assert ev("Color = 'x'", {"color": "x"}) is None
    assert ev("ünïcödé_1$ = 'x'", {"ünïcödé_1$": "x"}) is True


# -- three-valued logic ---------------------------------------------------------------------

T, F, U = "a = 'x'", "a = 'y'", "missing = 'x'"
A = {"a": "x"}


@pytest.mark.parametrize(("selector", "expected"), [
    (f"{T} AND {U}", None), (f"{F} AND {U}", False), (f"{U} AND {F}", False),
    (f"{T} OR {U}", True), (f"{U} OR {T}", True), (f"{F} OR {U}", None),
    (f"NOT ({U})", None), (f"NOT ({F})", True), (f"NOT ({T})", False),
    (f"{U} AND {U}", None), (f"{U} OR {U}", None),
    ("missing IS NULL", True), ("a IS NULL", False), ("missing IS NOT NULL", False),
    ("missing = missing", None), ("a <> missing", None), ("'a' = missing", None),
    ("missing IN ('x')", None), ("missing NOT IN ('x')", None),
    ("missing LIKE '%'", None), ("missing NOT LIKE '%'", None),
    ("missing BETWEEN 1 AND 2", None), ("missing NOT BETWEEN 1 AND 2", None),
    ("missing + 1 > 0", None), ("missing", None), ("NOT missing", None),
])  # fmt: skip
def test_unknown_propagates_as_sql_says(selector: str, expected: bool | None) -> None:
    assert ev(selector, A) is expected
    assert compile_selector(selector).matches(A) is (expected is True)


# -- types ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("selector", "value", "expected"), [
    ("p > 5", "7", True), ("p > 5", "7.5", False), ("p > 5.0", "7.5", True),
    ("p = 7", "+7", True), ("p = 7", "007", True), ("p = 7", " 7", False),
    ("p = 7.0", " 7 ", True), ("p = 1.5", "1.5f", True), ("p > 1e300", "Infinity", True),
    ("p > 1.0", "NaN", True), ("p = 7", "abc", False), ("p <> 7", "abc", True),
    ("NOT (p > 5)", "abc", True), ("p > 2147483647", "2147483648", False),
    ("p > 2147483648", "2147483649", True), ("p = 7", "", False),
    ("p = TRUE", "TRUE", True), ("p = FALSE", "yes", True), ("TRUE = p", "true", True),
    ("p = '7'", "7", True), ("p LIKE '7'", "7", True), ("p IN ('7')", "7", True),
    ("p", "true", False), ("p + 1 = 8", "7", None), ("-p = -7", "7", None),
    ("p > 5", "1" * 5000, False), ("p > 5", "0" * 5000 + "7", True), ("p > 5.0", "1" * 5000, True),
])  # fmt: skip
def test_string_headers_against_numbers_and_booleans(
    selector: str, value: str, expected: bool | None
) -> None:
    assert ev(selector, {"p": value}) is expected


@pytest.mark.parametrize(("selector", "expected"), [
    ("2147483647 + 1 = -2147483648", True), ("9223372036854775807 + 1 < 0", True),
    ("2147483648 + 1 = 2147483649", True), ("-(-2147483648) = -2147483648", True),
    ("7 / 2 = 3.5", True), ("1 / 0 > 1e308", True), ("-1 / 0 < -1e308", True),
    ("0 / 0 = 0 / 0", True), ("0.0 = -0.0", False), ("3 = 3.0", True), ("1 = 1L", True),
    ("9007199254740993 = 9007199254740992.0", True), ("0.1 + 0.2 = 0.3", False),
])  # fmt: skip
def test_java_arithmetic(selector: str, expected: bool) -> None:
    assert ev(selector) is expected


def test_unlike_types_compare_false() -> None:
    h = {"priority": "4", "redelivered": "true"}
    assert ev("JMSPriority = TRUE", h) is False
    assert ev("JMSRedelivered = 1", h) is False
    assert ev("NOT (JMSRedelivered = 1)", h) is True
    assert ev("JMSPriority LIKE '4'", h) is False
    assert ev("JMSPriority NOT LIKE '4'", h) is True
    assert ev("JMSPriority IN ('4')", h) is None  # ActiveMQ: IN on a non-string is unknown
    assert ev("JMSPriority = '4'", h) is True


def test_like_patterns_and_escapes() -> None:
    cases = [
        ("a_c", None, "abc", True), ("a_c", None, "ac", False), ("a%", None, "a", True),
        ("%", None, "", True), ("_", None, "", False), ("a\\_c", "\\", "a_c", True),
        ("a\\_c", "\\", "abc", False), ("a!%", "!", "a%", True), ("a!%", "!", "ab", False),
        ("a!!", "!", "a!", True), ("a!b", "!", "a!b", True), ("x!", "!", "x!", True),
        ("a.c", None, "abc", False), ("a.c", None, "a.c", True), ("[a]*", None, "[a]*", True),
        ("%\n%", None, "x\ny", True), ("_", None, "\n", True), ("%b%", None, "abc", True),
        ("ab%", None, "abc", True), ("%bc", None, "abc", True), ("abc", None, "abc", True),
    ]  # fmt: skip
    for pattern, escape, value, expected in cases:
        tail = f" ESCAPE {quoted(escape)}" if escape else ""
        selector = f"v LIKE {quoted(pattern)}{tail}"
        assert ev(selector, {"v": value}) is expected, (pattern, escape, value)
        assert ev(selector.replace("LIKE", "NOT LIKE"), {"v": value}) is (not expected)


def test_in_and_between() -> None:
    assert ev("c IN ('a', 'b')", {"c": "b"}) is True
    assert ev("c NOT IN ('a', 'b')", {"c": "b"}) is False
    assert ev("c NOT IN ('a', 'b')", {"c": "z"}) is True
    assert ev("s BETWEEN 5 AND 10", {"s": "10"}) is True
    assert ev("s NOT BETWEEN 5 AND 10", {"s": "11"}) is True
    assert ev("s BETWEEN 10 AND 5", {"s": "7"}) is False
    assert ev("s BETWEEN missing AND 10", {"s": "20"}) is False  # unknown AND FALSE
    assert ev("s NOT BETWEEN missing AND 10", {"s": "20"}) is True  # unknown OR TRUE


# -- header maps ----------------------------------------------------------------------------


def test_activemq_header_fields() -> None:
    h = {"message-id": "ID:x-1", "correlation-id": "c-1", "type": "order", "priority": "7",
         "timestamp": "1700000000000", "expires": "0", "persistent": "true", "redelivered": "true",
         "JMSXDeliveryCount": "3", "destination": "/queue/orders", "color": "red"}
    assert ev("JMSMessageID = 'ID:x-1' AND JMSCorrelationID = 'c-1' AND JMSType = 'order'", h)
    assert ev("JMSPriority = 7 AND JMSTimestamp > 1600000000000 AND JMSExpiration = 0", h)
    assert ev("JMSDeliveryMode = 'PERSISTENT' AND JMSRedelivered AND JMSXDeliveryCount = 3", h)
    assert ev("JMSDestination = 'Queue[orders]'", h)
    # STOMP headers that set JMS fields are not properties, as in ActiveMQ
    for name in ("priority", "type", "timestamp", "persistent", "destination", "redelivered"):
        assert ev(f"{name} IS NULL", h) is True, name
    # JMS defaults for what a message may lack
    assert ev("JMSPriority = 4 AND JMSDeliveryMode = 'NON_PERSISTENT' AND NOT JMSRedelivered")
    assert ev("JMSExpiration = 0") is True
    assert ev("JMSTimestamp IS NULL AND JMSType IS NULL AND JMSXDeliveryCount IS NULL") is True
    assert ev("JMSPriority IS NULL", {"priority": "high"}) is True  # not an int: NULL


def test_rabbitmq_header_fields() -> None:
    h = {"message-id": "T_sub@@1", "amqp-message-id": "ID:app-9", "priority": "2",
         "user-id": "guest", "content-type": "text/plain", "x-app": "a"}
    s = compile_selector("JMSMessageID = 'ID:app-9' AND JMSPriority = 2 AND x-app = 'a'", RABBITMQ)
    assert s.matches({**h, "x": "1"}) is False  # x - app: arithmetic on strings is NULL
    s = compile_selector("JMSMessageID = 'ID:app-9' AND JMSPriority = 2", RABBITMQ)
    assert s.matches(h)
    assert compile_selector("JMSXUserID = 'guest'", RABBITMQ).matches(h)
    assert compile_selector("content_type IS NULL", RABBITMQ).matches(h)
    assert compile_selector("JMSMessageID = 'T_sub@@1'", ACTIVEMQ).matches(h)


def test_typed_custom_fields() -> None:
    headers = ACTIVEMQ.with_fields(amount=Field(("amount",), FieldKind.LONG))
    s = compile_selector("amount > 5 AND amount * 2 = 14", headers)
    assert s.matches({"amount": "7"})
    assert not s.matches({"amount": "7.5"})  # not a long: NULL


# -- TIBCO's JMSDestination on the undelivered queue (seeds/004) ----------------------------


@pytest.mark.parametrize(("selector", "selected"), [
    ("JMSDestination='Queue[A]'", {"/queue/A"}),
    ("JMSDestination='Topic[B7]'", {"/topic/B7"}),
    ("JMSDestination NOT LIKE 'Queue[A]'", {"/queue/B", "/queue/H", "/topic/B7", "/topic/H"}),
    ("JMSDestination LIKE 'Queue[A]'", {"/queue/A"}),
    ("JMSDestination LIKE 'Q%'", {"/queue/A", "/queue/B", "/queue/H"}),
    ("JMSDestination IS NOT NULL", {"/queue/A", "/queue/B", "/queue/H", "/topic/B7", "/topic/H"}),
    ("JMSDestination IN ('Queue[H]','Queue[J]')", {"/queue/H"}),
    ("JMSDestination NOT IN ('Topic[H]','Topic[J]')",
     {"/queue/A", "/queue/B", "/queue/H", "/topic/B7"}),
    ("JMSDestination='Queue[A]' OR JMSDestination='Queue[B]'", {"/queue/A", "/queue/B"}),
])  # fmt: skip
def test_tibco_undelivered_queue_examples(selector: str, selected: set[str]) -> None:
    dead_letters = ["/queue/A", "/queue/B", "/queue/H", "/topic/B7", "/topic/H", None]
    headers = ACTIVEMQ.with_destination("original-destination")
    s = compile_selector(selector, headers)
    messages = {d: {"destination": "/queue/DLQ", **({"original-destination": d} if d else {})}
                for d in dead_letters}
    got = {d for d, message in messages.items() if s.matches(message)}
    assert got == selected


def test_tibco_destination_forms() -> None:
    assert tibco_destination("/queue/a.b") == "Queue[a.b]"
    assert tibco_destination("/amq/queue/x") == "Queue[x]"
    assert tibco_destination("/temp-topic/t") == "Topic[t]"
    assert tibco_destination("plain") == "Queue[plain]"
    assert tibco_destination("/exchange/amq.fanout") == "/exchange/amq.fanout"


# -- helpers for code that writes selectors -------------------------------------------------


def test_quoted_and_equals() -> None:
    assert quoted("it's") == "'it''s'"
    assert equals("color", "it's") == "color = 'it''s'"
    assert equals("$a_1", "") == "$a_1 = ''"
    for bad in ("", "1a", "a-b", "a b", "NULL", "and", "Between", "XPATH", "xquery", "über"):
        assert equals(bad, "x") is None, bad
    selector = equals("JMSCorrelationID", "a'b")
    assert selector is not None
    assert compile_selector(selector).matches({"correlation-id": "a'b"})


def test_selector_repr_and_tree_compile() -> None:
    s = compile_selector("a = 'x'")
    assert repr(s) == "Selector(\"a = 'x'\")"
    assert compile_selector(s.tree).matches({"a": "x"})
