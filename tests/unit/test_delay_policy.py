"""Delivery delay policy: IBM MQ's rules over plain headers, no broker, no clock."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.delay import DelayConfig, DelayedSend, delay_of, matches
from policies.errors import ConfigError, Refused
from policies.reasons import MQRC_EXPIRY_ERROR, MQRC_OPTIONS_ERROR, Reason

NOW = 1_700_000_000_000
DAY = 24 * 3600 * 1000
CONFIG = DelayConfig()
DEST = "/queue/orders.eu"


def refused(
    headers: dict[str, str], destination: str = DEST, config: DelayConfig = CONFIG
) -> Refused:
    """The Refused that ``delay_of`` raises for these headers."""
    with pytest.raises(Refused) as info:
        delay_of(headers, destination, NOW, config)
    return info.value


def assert_refused(error: Refused, reason: Reason, *fragments: str) -> None:
    """Reason, code, one-line message and the detail fragments that name the culprit."""
    assert error.reason == reason
    assert error.reason.code == reason.code
    assert str(error).startswith(f"{reason.name} ({reason.code}): ")
    for fragment in fragments:
        assert fragment in error.detail, (fragment, error.detail)


# --- accepted delays -------------------------------------------------------------------------


@pytest.mark.parametrize("header", ["x-delay", "AMQ_SCHEDULED_DELAY"])
def test_relative_delay(header: str) -> None:
    assert delay_of({header: "5000"}, DEST, NOW, CONFIG) == DelayedSend(
        delay_ms=5000, due_ms=NOW + 5000, sent_ms=NOW, expires_ms=None, header=header
    )


def test_absolute_delivery_time() -> None:
    sent = delay_of({"JMSDeliveryTime": str(NOW + 7000)}, DEST, NOW, CONFIG)
    assert sent == DelayedSend(7000, NOW + 7000, NOW, None, "JMSDeliveryTime")


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"destination": DEST, "content-type": "text/plain"},
        {"x-delay": "0"},
        {"x-delay": "000"},
        {"AMQ_SCHEDULED_DELAY": "0"},
        {"JMSDeliveryTime": str(NOW)},
        {"JMSDeliveryTime": str(NOW - 1)},
        {"JMSDeliveryTime": "0"},
        {
            "x-delay": "0",
            "JMSDeliveryTime": str(NOW - 50),
        },  # both mean "now": no conflict
    ],
)
def test_no_delay_relays_unchanged(headers: dict[str, str]) -> None:
    assert delay_of(headers, DEST, NOW, CONFIG) is None


@pytest.mark.parametrize(
    "headers",
    [
        {"x-delay": "0", "JMSXGroupID": "g1"},
        {"x-delay": "0", "JMS_IBM_RETAIN": "1"},
        {"x-delay": "0", "expiration": "nonsense"},
        {"x-delay": "0", "expires": "1"},
        {"JMSDeliveryTime": str(NOW - 1), "JMSXGroupID": "g1", "expiration": "1"},
    ],
)
def test_no_other_rule_applies_without_a_delay(headers: dict[str, str]) -> None:
    config = DelayConfig(disabled_destinations=(">",))
    assert delay_of(headers, DEST, NOW, config) is None


def test_header_names_are_case_sensitive() -> None:
    assert delay_of({"X-Delay": "5000", "x-DELAY": "5"}, DEST, NOW, CONFIG) is None
    sent = delay_of({"x-delay": "5000", "jmsxgroupid": "g", "EXPIRATION": "1"}, DEST, NOW, CONFIG)
    assert sent is not None and sent.expires_ms is None


def test_delay_header_names_for_stripping() -> None:
    assert CONFIG.delay_header_names() == (
        "x-delay",
        "AMQ_SCHEDULED_DELAY",
        "JMSDeliveryTime",
        "_AMQ_SCHED_DELIVERY",
    )
    config = DelayConfig(relative_headers=("delay",), absolute_headers=("deliver-at",))
    assert config.delay_header_names() == ("delay", "deliver-at")
    assert delay_of({"x-delay": "5000"}, DEST, NOW, config) is None
    sent = delay_of({"deliver-at": str(NOW + 10)}, DEST, NOW, config)
    assert sent is not None and sent.header == "deliver-at"


# --- malformed, negative and too long delays -------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "abc",
        "1.5",
        "",
        " 5",
        "5 ",
        "5\n",
        "1e3",
        "+5",
        "0x10",
        "1_000",
        "٣",
        "--5",
        "-",
    ],
)
@pytest.mark.parametrize("header", ["x-delay", "AMQ_SCHEDULED_DELAY", "JMSDeliveryTime"])
def test_malformed_delay(header: str, value: str) -> None:
    error = refused({header: value})
    assert_refused(error, MQRC_OPTIONS_ERROR, f"{header}={value!r}",
                   "not a whole number of milliseconds")


@pytest.mark.parametrize("header", ["x-delay", "AMQ_SCHEDULED_DELAY", "JMSDeliveryTime"])
def test_negative_delay(header: str) -> None:
    error = refused({header: "-5"})
    assert_refused(error, MQRC_OPTIONS_ERROR, f"{header}='-5' is negative")


def test_malformed_delay_refused_before_anything_else() -> None:
    error = refused({"x-delay": "soon", "JMSXGroupID": "g", "expiration": "1"})
    assert_refused(error, MQRC_OPTIONS_ERROR, "x-delay='soon'")


def test_max_delay_boundary() -> None:
    config = DelayConfig(max_delay_ms=40 * DAY)
    sent = delay_of({"x-delay": str(40 * DAY)}, DEST, NOW, config)
    assert sent is not None and sent.delay_ms == 40 * DAY
    error = refused({"x-delay": str(40 * DAY + 1)}, config=config)
    assert_refused(error, MQRC_OPTIONS_ERROR, f"x-delay='{40 * DAY + 1}'", "maximum")


def test_absolute_max_delay_boundary() -> None:
    config = DelayConfig(max_delay_ms=40 * DAY)
    sent = delay_of({"JMSDeliveryTime": str(NOW + 40 * DAY)}, DEST, NOW, config)
    assert sent is not None and sent.due_ms == NOW + 40 * DAY
    error = refused({"JMSDeliveryTime": str(NOW + 40 * DAY + 1)}, config=config)
    assert_refused(error, MQRC_OPTIONS_ERROR, f"JMSDeliveryTime='{NOW + 40 * DAY + 1}'", "maximum")


def test_thirty_days_allowed_by_default() -> None:
    sent = delay_of({"x-delay": str(30 * DAY)}, DEST, NOW, CONFIG)
    assert sent is not None and sent.due_ms == NOW + 30 * DAY
    sent = delay_of({"x-delay": str(400 * DAY)}, DEST, NOW, CONFIG)
    assert sent is not None
    assert_refused(refused({"x-delay": str(400 * DAY + 1)}), MQRC_OPTIONS_ERROR, "maximum")


def test_huge_digit_strings_are_refused_and_shortened() -> None:
    value = "9" * 10_000  # beyond Python's int-conversion limit
    error = refused({"x-delay": value})
    assert_refused(error, MQRC_OPTIONS_ERROR, "x-delay=", "maximum")
    assert len(str(error)) < 300
    assert_refused(refused({"JMSDeliveryTime": value}), MQRC_OPTIONS_ERROR, "maximum")
    assert_refused(refused({"x-delay": "-" + value}), MQRC_OPTIONS_ERROR, "is negative")


# --- several delay headers -------------------------------------------------------------------


def test_conflicting_delay_headers() -> None:
    error = refused({"x-delay": "5000", "AMQ_SCHEDULED_DELAY": "6000"})
    assert_refused(error, MQRC_OPTIONS_ERROR, "x-delay='5000'", "AMQ_SCHEDULED_DELAY='6000'")


def test_conflicting_relative_and_absolute() -> None:
    when = str(NOW + 9000)
    error = refused({"AMQ_SCHEDULED_DELAY": "5000", "JMSDeliveryTime": when})
    assert_refused(
        error,
        MQRC_OPTIONS_ERROR,
        "AMQ_SCHEDULED_DELAY='5000'",
        f"JMSDeliveryTime={when!r}",
    )


def test_zero_conflicts_with_a_delay() -> None:
    error = refused({"x-delay": "0", "AMQ_SCHEDULED_DELAY": "5000"})
    assert_refused(error, MQRC_OPTIONS_ERROR, "x-delay='0'", "AMQ_SCHEDULED_DELAY='5000'")


def test_agreeing_delay_headers() -> None:
    headers = {
        "x-delay": "5000",
        "AMQ_SCHEDULED_DELAY": "05000",
        "JMSDeliveryTime": str(NOW + 5000),
    }
    sent = delay_of(headers, DEST, NOW, CONFIG)
    assert sent == DelayedSend(5000, NOW + 5000, NOW, None, "x-delay")


def test_a_malformed_second_header_is_refused() -> None:
    error = refused({"x-delay": "5000", "AMQ_SCHEDULED_DELAY": "later"})
    assert_refused(error, MQRC_OPTIONS_ERROR, "AMQ_SCHEDULED_DELAY='later'")


# --- group, retained publication, disabled destination ---------------------------------------


def test_group_refused() -> None:
    error = refused({"x-delay": "5000", "JMSXGroupID": "orders-42"})
    assert_refused(
        error,
        MQRC_OPTIONS_ERROR,
        "delivery delay is not supported for messages in a group",
        "JMSXGroupID='orders-42'",
        "x-delay='5000'",
    )


def test_empty_group_is_no_group() -> None:
    assert delay_of({"x-delay": "5000", "JMSXGroupID": ""}, DEST, NOW, CONFIG) is not None


def test_retained_publication_refused() -> None:
    error = refused({"x-delay": "5000", "JMS_IBM_RETAIN": "1"}, "/topic/prices")
    assert_refused(
        error,
        MQRC_OPTIONS_ERROR,
        "delivery delay is not supported for retained publications",
        "JMS_IBM_RETAIN='1'",
    )


@pytest.mark.parametrize("value", ["true", "TRUE", " 1 ", "01", "1.0"])
def test_retain_read_by_its_meaning(value: str) -> None:
    """1 in any form, or true (an AMQP boolean shows as "true"), is a retained publication."""
    error = refused({"x-delay": "5000", "JMS_IBM_RETAIN": value}, "/topic/prices")
    assert_refused(error, MQRC_OPTIONS_ERROR, f"JMS_IBM_RETAIN={value!r}")


@pytest.mark.parametrize("value", ["0", "", "false", "2", "1.5", "yes"])
def test_retain_other_than_one_is_not_retained(value: str) -> None:
    headers = {"x-delay": "5000", "JMS_IBM_RETAIN": value}
    assert delay_of(headers, "/topic/prices", NOW, CONFIG) is not None


def test_disabled_destination_refused() -> None:
    config = DelayConfig(disabled_destinations=("/topic/prices.>", "orders.*"))
    error = refused({"x-delay": "5000"}, DEST, config)
    assert_refused(
        error,
        MQRC_OPTIONS_ERROR,
        "delivery delay is disabled for destination '/queue/orders.eu'",
        "'orders.*'",
        "x-delay='5000'",
    )
    assert delay_of({"x-delay": "5000"}, "/queue/orders.eu.x", NOW, config) is not None
    assert_refused(refused({"x-delay": "1"}, "/topic/prices.a.b", config), MQRC_OPTIONS_ERROR)


def test_order_of_checks() -> None:
    config = DelayConfig(disabled_destinations=(">",))
    everything = {
        "x-delay": "5000",
        "JMSXGroupID": "g",
        "JMS_IBM_RETAIN": "1",
        "expiration": "1",
    }
    assert "group" in refused(everything, config=config).detail
    del everything["JMSXGroupID"]
    assert "retained" in refused(everything, config=config).detail
    del everything["JMS_IBM_RETAIN"]
    assert "disabled" in refused(everything, config=config).detail
    assert refused(everything).reason == MQRC_EXPIRY_ERROR


# --- time to live ----------------------------------------------------------------------------


def test_relative_ttl_equal_to_delay_refused() -> None:
    # It would expire at its due time, never delivered.
    error = refused({"x-delay": "5000", "expiration": "5000"})
    assert_refused(
        error,
        MQRC_EXPIRY_ERROR,
        "expiration='5000'",
        "time to live 5000 ms is not longer than the delivery delay 5000 ms",
    )


def test_relative_ttl_one_ms_longer_allowed() -> None:
    sent = delay_of({"x-delay": "5000", "expiration": "5001"}, DEST, NOW, CONFIG)
    assert sent == DelayedSend(5000, NOW + 5000, NOW, NOW + 5001, "x-delay")


def test_relative_ttl_one_ms_shorter_refused() -> None:
    error = refused({"x-delay": "5000", "expiration": "4999"})
    assert_refused(
        error,
        MQRC_EXPIRY_ERROR,
        "expiration='4999'",
        "time to live 4999 ms is not longer than the delivery delay 5000 ms",
    )


def test_absolute_expiry_boundary() -> None:
    sent = delay_of({"x-delay": "5000", "expires": str(NOW + 5001)}, DEST, NOW, CONFIG)
    assert sent is not None and sent.expires_ms == NOW + 5001
    error = refused({"x-delay": "5000", "expires": str(NOW + 5000)})
    assert_refused(error, MQRC_EXPIRY_ERROR, f"expires='{NOW + 5000}'", "time to live 5000 ms")
    error = refused({"x-delay": "5000", "expires": str(NOW + 4999)})
    assert_refused(error, MQRC_EXPIRY_ERROR, f"expires='{NOW + 4999}'", "time to live 4999 ms")


def test_already_expired() -> None:
    error = refused({"x-delay": "5000", "expires": str(NOW - 1)})
    assert_refused(error, MQRC_EXPIRY_ERROR, f"expires='{NOW - 1}'", "already expired")


def test_ttl_against_absolute_delivery_time() -> None:
    when = str(NOW + 5000)
    sent = delay_of({"JMSDeliveryTime": when, "expiration": "5001"}, DEST, NOW, CONFIG)
    assert sent is not None and sent.expires_ms == NOW + 5001
    error = refused({"JMSDeliveryTime": when, "expiration": "1000"})
    assert_refused(
        error,
        MQRC_EXPIRY_ERROR,
        "time to live 1000 ms is not longer than the delivery delay 5000 ms",
    )


@pytest.mark.parametrize("header", ["expires", "expiration"])
def test_zero_ttl_means_never(header: str) -> None:
    sent = delay_of({"x-delay": "5000", header: "0"}, DEST, NOW, CONFIG)
    assert sent is not None and sent.expires_ms is None


@pytest.mark.parametrize("value", ["abc", "", " 1", "1.5", "-1", "1e3", "+9"])
@pytest.mark.parametrize("header", ["expires", "expiration"])
def test_malformed_ttl(header: str, value: str) -> None:
    error = refused({"x-delay": "5000", header: value})
    assert_refused(error, MQRC_EXPIRY_ERROR, f"{header}={value!r}")


def test_earlier_of_two_expiries_counts() -> None:
    sent = delay_of(
        {"x-delay": "5000", "expires": str(NOW + 9000), "expiration": "6000"},
        DEST,
        NOW,
        CONFIG,
    )
    assert sent is not None and sent.expires_ms == NOW + 6000
    error = refused({"x-delay": "5000", "expires": str(NOW + 4000), "expiration": "60000"})
    assert_refused(error, MQRC_EXPIRY_ERROR, f"expires='{NOW + 4000}'", "time to live 4000 ms")
    error = refused({"x-delay": "5000", "expires": "0", "expiration": "10"})
    assert_refused(error, MQRC_EXPIRY_ERROR, "expiration='10'")


def test_huge_ttl_is_fine() -> None:
    sent = delay_of({"x-delay": "5000", "expiration": "9" * 5000}, DEST, NOW, CONFIG)
    assert sent is not None and sent.expires_ms is not None and sent.expires_ms > NOW + 5000


# --- configuration ---------------------------------------------------------------------------


def test_config_must_allow_thirty_days() -> None:
    assert DelayConfig(max_delay_ms=30 * DAY).max_delay_ms == 30 * DAY
    with pytest.raises(ConfigError, match="30 days"):
        DelayConfig(max_delay_ms=30 * DAY - 1)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"relative_headers": ("x-delay", "x-delay")},
        {"relative_headers": ("JMSDeliveryTime",)},
        {"relative_headers": ("",)},
        {"relative_headers": (), "absolute_headers": ()},
        {"disabled_destinations": ("",)},
        {"disabled_destinations": ("orders.>.eu",)},
        {"disabled_destinations": ("/queue/#.x",)},
    ],
)
def test_bad_config(kwargs: dict[str, tuple[str, ...]]) -> None:
    with pytest.raises(ConfigError):
        DelayConfig(**kwargs)  # type: ignore[arg-type]


def test_config_is_frozen() -> None:
    with pytest.raises(AttributeError):
        CONFIG.max_delay_ms = 1  # type: ignore[misc]


# --- destination patterns --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "destination", "expected"),
    [
        ("/queue/orders.eu", "/queue/orders.eu", True),
        ("/queue/orders.eu", "/queue/orders.us", False),
        ("/queue/orders.eu", "/topic/orders.eu", False),
        ("/queue/orders.eu", "/queue/Orders.eu", False),
        ("/queue/orders.*", "/queue/orders.eu", True),
        ("/queue/orders.*", "/queue/orders.eu.x", False),
        ("/queue/orders.*", "/queue/orders", False),
        ("/queue/*.eu", "/queue/orders.eu", True),
        ("/queue/*", "/queue/orders", True),
        ("/queue/*", "/queue/orders.eu", False),
        ("/topic/prices.>", "/topic/prices.a", True),
        ("/topic/prices.>", "/topic/prices.a.b", True),
        ("/topic/prices.>", "/topic/prices", False),
        ("/topic/prices.>", "/queue/prices.a", False),
        ("/topic/prices.#", "/topic/prices.a.b", True),
        ("/topic/prices.#", "/topic/prices", False),
        ("/topic/*.>", "/topic/prices.a", True),
        ("/topic/*.>", "/topic/prices", False),
        ("/queue/>", "/queue/anything.at.all", True),
        ("/queue/>", "/topic/x", False),
        (">", "/queue/x", True),
        (">", "/topic/a.b.c", True),
        ("#", "plain", True),
        ("orders.*", "/queue/orders.eu", True),
        ("orders.*", "/topic/orders.eu", True),
        ("orders.*", "orders.eu", True),
        ("orders.*", "/queue/orders.eu.x", False),
        ("orders.*", "/queue/big.orders.eu", False),
        ("orders.eu", "/queue/orders.eu", True),
        ("/queue/orders.eu", "orders.eu", True),  # a bare name is the queue of that name
        ("/queue/orders.eu", "/amq/queue/orders.eu", True),  # RabbitMQ's other form of it
        ("/topic/orders.eu", "orders.eu", False),
        (
            "orders*",
            "/queue/orders.eu",
            False,
        ),  # a wildcard inside a segment is literal
        ("orders*", "/queue/orders*", True),
        ("/exchange/amq.topic/prices.*", "/exchange/amq.topic/prices.eu", True),
        ("/exchange/amq.topic/prices.*", "/exchange/other/prices.eu", False),
        ("/*/orders.eu", "/queue/orders.eu", False),  # the prefix is literal
        ("*", "/queue/orders", True),
        ("*", "/queue/orders.eu", False),
    ],
)
def test_matches(pattern: str, destination: str, expected: bool) -> None:
    assert matches(pattern, destination) is expected


def test_bad_pattern() -> None:
    with pytest.raises(ConfigError):
        matches("a.>.b", "/queue/a.x.b")


# --- properties ------------------------------------------------------------------------------

delays = st.integers(min_value=0, max_value=CONFIG.max_delay_ms)
nows = st.integers(min_value=0, max_value=10**13)


@given(now=nows, delay=delays, data=st.data())
def test_ttl_longer_than_delay_is_accepted(now: int, delay: int, data: st.DataObject) -> None:
    ttl = data.draw(st.integers(min_value=delay + 1, max_value=CONFIG.max_delay_ms * 2))
    sent = delay_of({"x-delay": str(delay), "expiration": str(ttl)}, DEST, now, CONFIG)
    if delay == 0:
        assert sent is None
    else:
        assert sent == DelayedSend(delay, now + delay, now, now + ttl, "x-delay")


@given(
    now=nows,
    delay=st.integers(min_value=1, max_value=CONFIG.max_delay_ms),
    data=st.data(),
)
def test_ttl_not_longer_than_delay_is_refused(now: int, delay: int, data: st.DataObject) -> None:
    ttl = data.draw(st.integers(min_value=1, max_value=delay))
    for headers in (
        {"x-delay": str(delay), "expiration": str(ttl)},
        {"JMSDeliveryTime": str(now + delay), "expires": str(now + ttl)},
    ):
        with pytest.raises(Refused) as info:
            delay_of(headers, DEST, now, CONFIG)
        assert info.value.reason == MQRC_EXPIRY_ERROR
        assert str(info.value).startswith("MQRC_EXPIRY_ERROR (2013): ")


@given(now=nows, delay=delays)
def test_relative_and_absolute_agree(now: int, delay: int) -> None:
    relative = delay_of({"AMQ_SCHEDULED_DELAY": str(delay)}, DEST, now, CONFIG)
    absolute = delay_of({"JMSDeliveryTime": str(now + delay)}, DEST, now, CONFIG)
    if delay == 0:
        assert relative is None and absolute is None
    else:
        assert relative is not None and absolute is not None
        assert (
            (relative.delay_ms, relative.due_ms)
            == (absolute.delay_ms, absolute.due_ms)
            == (delay, now + delay)
        )


header_names = st.sampled_from(
    [
        "x-delay",
        "AMQ_SCHEDULED_DELAY",
        "JMSDeliveryTime",
        "expires",
        "expiration",
        "JMSXGroupID",
        "JMS_IBM_RETAIN",
    ]
)


header_values = (
    st.text(alphabet="0123456789-+ .ex", max_size=20)
    | st.integers(min_value=-(10**14), max_value=10**14).map(str)
    | st.text(max_size=8)
)


@given(headers=st.dictionaries(header_names, header_values), now=nows)
def test_any_headers_give_a_decision_or_refused(headers: dict[str, str], now: int) -> None:
    try:
        sent = delay_of(headers, DEST, now, CONFIG)
    except Refused as error:
        assert error.reason in (MQRC_OPTIONS_ERROR, MQRC_EXPIRY_ERROR)
        assert str(error).startswith(error.reason.name)
        return
    if sent is not None:
        assert 0 < sent.delay_ms <= CONFIG.max_delay_ms
        assert sent.due_ms == now + sent.delay_ms and sent.sent_ms == now
        assert sent.expires_ms is None or sent.expires_ms >= sent.due_ms
        assert sent.header in CONFIG.delay_header_names()


segments = st.text(alphabet="abcXYZ09-_", min_size=1, max_size=5)
names = st.lists(segments, min_size=1, max_size=5).map(".".join)


@given(
    prefix=st.sampled_from(["/queue/", "/topic/", "/exchange/amq.topic/", ""]),
    name=names,
)
def test_literal_and_catch_all_patterns(prefix: str, name: str) -> None:
    destination = prefix + name
    assert matches(destination, destination)
    assert matches(name, destination)
    assert matches(">", destination) and matches("#", destination)
    assert matches(".".join("*" for _ in name.split(".")), destination)
    assert not matches(name + ".x", destination)


def _parse_int_by_pattern(value: str) -> int | None:
    """``_parse_int`` as the pattern alone reads it (its quick way for plain digits must agree)."""
    import re

    if not re.fullmatch(r"-?[0-9]+", value):
        return None
    digits = value.lstrip("-").lstrip("0") or "0"
    number = 10**20 if len(digits) > 20 else int(digits)
    return -number if value.startswith("-") else number


@given(st.one_of(
    st.text(alphabet="0123456789", max_size=25),
    st.text(alphabet="-+0123456789 ٠١٢²", max_size=25),
    st.integers(min_value=-(10**25), max_value=10**25).map(str),
))
def test_a_delay_value_reads_as_the_pattern_reads_it(value: str) -> None:
    from policies.delay import _parse_int

    assert _parse_int(value) == _parse_int_by_pattern(value)
