"""A property's meaning, whatever type carried it (``policies.properties``): a boolean, an integer,
a float, a decimal or text give the same answer, and the text an AMQP header table's value shows
as reads as the value does; the typed table still comes back whole where a message goes out."""

from __future__ import annotations

import decimal
from typing import Any

import pika
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from adapters import amqp_types
from adapters.rabbitmq_stomp import amqp_properties, stomp_headers
from policies.delay import DelayConfig, delay_of
from policies.errors import Refused
from policies.properties import flag, text, whole_number
from policies.redelivery.model import PRESERVE_UNDELIVERED_HEADER, preserves_undelivered
from policies.reports import MQRO_EXCEPTION_WITH_DATA, REPORT_EXCEPTION, Data, report_options

D = decimal.Decimal


@pytest.mark.parametrize("value", [True, 1, 1.0, D("1"), D("1.00"), "true", "TRUE", "True",
                                   " true ", "1", "01", "1.0", " 1 "], ids=repr)
def test_set_flags(value: object) -> None:
    assert flag(value)


@pytest.mark.parametrize("value", [False, 0, 2, -1, 0.5, 1.5, D("0.1"), float("nan"), None,
                                   "false", "FALSE", "0", "", "yes", "on", "t", "1.5", "2",
                                   b"true", [True], {"v": True}], ids=repr)
def test_unset_flags(value: object) -> None:
    assert not flag(value)


@pytest.mark.parametrize(("value", "number"), [
    (300, 300), (2**40, 2**40), (-5, -5), (300.0, 300), (-3.0, -3), (D("300"), 300),
    (D("300.00"), 300), (D("3E+2"), 300), ("300", 300), ("300.0", 300), ("0300", 300),
    ("-5", -5), ("-0", 0), ("9" * 30, 10**20), ("-" + "9" * 30, -(10**20)), (10**30, 10**20),
    (1e30, 10**20),
], ids=repr)
def test_whole_numbers(value: object, number: int) -> None:
    assert whole_number(value) == number


@pytest.mark.parametrize("value", [
    True, False, 300.5, D("0.5"), float("inf"), float("nan"), D("NaN"), None, b"300", [300],
    "300.5", "3e2", "+5", " 5", "5 ", "0x10", "1_000", "٣", "５", "", "-", "--5", "5.", ".5",
    "true",
], ids=repr)
def test_not_whole_numbers(value: object) -> None:
    assert whole_number(value) is None


def test_text_of_each_type() -> None:
    assert [text(v) for v in (True, False, 7, -3, 300.0, 1.25, D("300.00"), D("1.250"),
                              1e20, "s")] == [
        "true", "false", "7", "-3", "300", "1.25", "300", "1.25", "100000000000000000000", "s"]
    assert [text(v) for v in (None, b"x", [1], {"k": 1})] == [None] * 4


VALUES = st.one_of(
    st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=True),
    st.decimals(allow_nan=False, places=4, min_value=-(10**9), max_value=10**9),
    st.text(max_size=12), st.sampled_from(["true", "1", "1.0", "300.00", "-0"]),
)


@given(VALUES)
def test_the_text_of_a_value_reads_as_the_value(value: Any) -> None:
    shown = text(value)
    assert shown is not None
    assert flag(shown) == flag(value)
    assert whole_number(shown) == whole_number(value)


@given(st.one_of(st.booleans(), st.integers(-(2**31), 2**31 - 1),
                 st.floats(allow_nan=False, allow_infinity=False),
                 st.decimals(allow_nan=False, allow_infinity=False, places=3,
                             min_value=-(10**6), max_value=10**6)))
def test_a_typed_value_shown_as_text_comes_back_typed(value: Any) -> None:
    """The STOMP-shaped path shows the value as its text and carries the table's types beside
    it: where the message goes out again, the value comes back as pika writes it."""
    types = amqp_types.encode({"p": value, "s": "x"})
    assume(types is not None)  # (pika writes a decimal in 32 bits; beyond, strings are kept)
    assert types is not None
    headers = {"p": text(value) or "", "s": "x", amqp_types.TYPES_HEADER: types}
    props = amqp_properties(headers)
    written = amqp_types.decode(types)
    assert written is not None
    assert props.headers == {"p": written[0]["p"], "s": "x"}
    assert type(props.headers["p"]) is type(written[0]["p"])


def test_the_adapter_shows_booleans_floats_and_decimals() -> None:
    props = pika.BasicProperties(headers={
        PRESERVE_UNDELIVERED_HEADER: True, "x-delay": 300.0, "d": D("1.50"), "n": 1,
        "bytes": b"dropped", "table": {"dropped": 1}})
    assert stomp_headers(props) == {
        PRESERVE_UNDELIVERED_HEADER: "true", "x-delay": "300", "d": "1.5", "n": "1"}


# -- the readers that use it ---------------------------------------------------------------

NOW = 1_700_000_000_000


@pytest.mark.parametrize("value", [True, 1, "true", "1", 1.0])
def test_each_reader_reads_the_meaning(value: object) -> None:
    shown = text(value)
    assert shown is not None
    assert preserves_undelivered({PRESERVE_UNDELIVERED_HEADER: shown})
    with pytest.raises(Refused) as refused:
        delay_of({"x-delay": "300", "JMS_IBM_RETAIN": shown}, "/topic/t", NOW, DelayConfig())
    assert refused.value.reason.code == 2046 and "JMS_IBM_RETAIN" in refused.value.detail


@pytest.mark.parametrize("value", [300, 300.0, D("300.00"), "300", "300.0"])
@pytest.mark.parametrize("name", ["x-delay", "AMQ_SCHEDULED_DELAY"])
def test_a_delay_of_any_type(name: str, value: object) -> None:
    sent = delay_of({name: text(value) or ""}, "/queue/q", NOW, DelayConfig())
    assert sent is not None and sent.delay_ms == 300


@pytest.mark.parametrize("value", [NOW + 300, float(NOW + 300), D(NOW + 300)])
def test_a_delivery_time_of_any_type(value: object) -> None:
    sent = delay_of({"JMSDeliveryTime": text(value) or ""}, "/queue/q", NOW, DelayConfig())
    assert sent is not None and sent.delay_ms == 300


@pytest.mark.parametrize("value", [300.5, True, D("0.5"), "3e2", "soon"])
def test_a_malformed_delay_is_refused_naming_it(value: object) -> None:
    with pytest.raises(Refused) as refused:
        delay_of({"x-delay": text(value) or ""}, "/queue/q", NOW, DelayConfig())
    assert refused.value.reason.name == "MQRC_OPTIONS_ERROR"
    assert refused.value.detail.startswith(f"x-delay={text(value)!r} is not a whole number")


@pytest.mark.parametrize("value", [MQRO_EXCEPTION_WITH_DATA, float(MQRO_EXCEPTION_WITH_DATA),
                                   D(MQRO_EXCEPTION_WITH_DATA), str(MQRO_EXCEPTION_WITH_DATA),
                                   hex(MQRO_EXCEPTION_WITH_DATA)])
def test_report_options_of_any_type(value: object) -> None:
    options = report_options({REPORT_EXCEPTION: text(value) or ""})
    assert options.exception is Data.FIRST_100


@pytest.mark.parametrize("value", [True, 1.5, "many"])
def test_report_options_that_are_no_number_ask_for_nothing(value: object) -> None:
    assert report_options({REPORT_EXCEPTION: text(value) or ""}).exception is None
