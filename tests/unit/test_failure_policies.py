"""The pure parts of a staged message's failure: IBM MQ report options, message-retry, and where
a message that cannot be delivered goes (policies.reports, policies.retry, policies.failures)."""

from __future__ import annotations

import pytest

from bridge.staging.failures import retry_wait_ms
from policies import reports
from policies.errors import ConfigError, PutRefused
from policies.failures import Cause, Home, route
from policies.reasons import (
    MQFB_EXPIRATION,
    MQRC_MSG_TOO_BIG_FOR_Q,
    MQRC_NOT_AUTHORIZED,
    MQRC_PUT_INHIBITED,
    MQRC_Q_FULL,
    MQRC_UNKNOWN_OBJECT_NAME,
)
from policies.redelivery import compile_table, parse_policy
from policies.reports import Data, ReportKind, report_body, report_for, report_options
from policies.retry import MessageRetry, RetryTable, can_pass, compile_retry, parse_retry_text

# -- report options ----------------------------------------------------------------------------


def test_mqro_constants_are_ibms() -> None:
    """The values of IBM MQ's cmqc.h (and the IBM MQ classes for JMS' MQC)."""
    assert reports.MQRO_EXCEPTION == 16777216
    assert reports.MQRO_EXCEPTION_WITH_DATA == 50331648
    assert reports.MQRO_EXCEPTION_WITH_FULL_DATA == 117440512
    assert reports.MQRO_EXPIRATION == 2097152
    assert reports.MQRO_EXPIRATION_WITH_DATA == 6291456
    assert reports.MQRO_EXPIRATION_WITH_FULL_DATA == 14680064
    assert reports.MQRO_DISCARD_MSG == 134217728
    assert reports.MQRO_PASS_MSG_ID == 128 and reports.MQRO_PASS_CORREL_ID == 64
    assert reports.MQRO_COA == 256 and reports.MQRO_COD == 2048
    assert reports.MQMT_REPORT == 4


@pytest.mark.parametrize(
    ("value", "data"),
    [
        (str(reports.MQRO_EXCEPTION), Data.NONE),
        (str(reports.MQRO_EXCEPTION_WITH_DATA), Data.FIRST_100),
        (str(reports.MQRO_EXCEPTION_WITH_FULL_DATA), Data.FULL),
        ("0x03000000", Data.FIRST_100),
        # The whole Report field, as an application that copies MQMD.Report may set it.
        (str(reports.MQRO_EXCEPTION_WITH_DATA | reports.MQRO_DISCARD_MSG | reports.MQRO_COA),
         Data.FIRST_100),
        ("0", None),
        (str(reports.MQRO_EXPIRATION), None),  # another report's bits
        ("not a number", None),
        ("", None),
    ],
)
def test_exception_report_option_values(value: str, data: Data | None) -> None:
    assert report_options({reports.REPORT_EXCEPTION: value}).exception is data


@pytest.mark.parametrize(
    ("value", "data"),
    [
        (reports.MQRO_EXPIRATION, Data.NONE),
        (reports.MQRO_EXPIRATION_WITH_DATA, Data.FIRST_100),
        (reports.MQRO_EXPIRATION_WITH_FULL_DATA, Data.FULL),
        (reports.MQRO_EXCEPTION, None),
    ],
)
def test_expiration_report_option_values(value: int, data: Data | None) -> None:
    assert report_options({reports.REPORT_EXPIRATION: str(value)}).expiration is data


def test_discard_and_pass_options() -> None:
    options = report_options({
        reports.REPORT_DISCARD: str(reports.MQRO_DISCARD_MSG),
        reports.REPORT_PASS_MSG_ID: str(reports.MQRO_PASS_MSG_ID),
        reports.REPORT_PASS_CORREL_ID: str(reports.MQRO_PASS_CORREL_ID),
    })
    assert options.discard and options.pass_msg_id and options.pass_correl_id
    assert options.exception is None and options.expiration is None
    assert not report_options({reports.REPORT_DISCARD: "1"}).discard
    assert report_options({"x-app": "1"}) == reports.ReportOptions()


def test_a_report_goes_to_the_reply_to_with_the_original_id_as_correlation_id() -> None:
    options = report_options({reports.REPORT_EXCEPTION: str(reports.MQRO_EXCEPTION_WITH_DATA)})
    report = report_for(ReportKind.EXCEPTION, options, reply_to="/queue/replies",
                        reason=MQRC_Q_FULL, original_id="ID:42", correlation_id="app-corr")
    assert report is not None
    assert report.destination == "/queue/replies" and report.feedback == 2053
    assert report.correlation_id == "ID:42" and report.message_id is None
    assert report.data is Data.FIRST_100
    assert report.headers() == {"JMS_IBM_MsgType": "4", "JMS_IBM_Feedback": "2053",
                                "correlation-id": "ID:42"}


def test_an_expiration_report_has_mqfb_expiration_and_pass_options_apply() -> None:
    options = report_options({
        reports.REPORT_EXPIRATION: str(reports.MQRO_EXPIRATION),
        reports.REPORT_PASS_MSG_ID: str(reports.MQRO_PASS_MSG_ID),
        reports.REPORT_PASS_CORREL_ID: str(reports.MQRO_PASS_CORREL_ID),
    })
    report = report_for(ReportKind.EXPIRATION, options, reply_to="/queue/r",
                        reason=MQFB_EXPIRATION, original_id="ID:1", correlation_id="mine")
    assert report is not None and report.feedback == 258
    assert report.message_id == "ID:1" and report.correlation_id == "mine"


def test_no_report_without_a_reply_to_or_without_the_option() -> None:
    options = report_options({reports.REPORT_EXCEPTION: str(reports.MQRO_EXCEPTION)})
    assert report_for(ReportKind.EXCEPTION, options, reply_to=None, reason=MQRC_Q_FULL,
                      original_id="ID:1") is None
    assert report_for(ReportKind.EXPIRATION, options, reply_to="/queue/r",
                      reason=MQFB_EXPIRATION, original_id="ID:1") is None


def test_report_data_none_first_100_bytes_or_all() -> None:
    body = bytes(range(250))
    assert report_body(Data.NONE, body) == b""
    assert report_body(Data.FIRST_100, body) == body[:100]
    assert report_body(Data.FULL, body) == body


# -- message-retry -----------------------------------------------------------------------------


def test_only_refusals_that_can_pass_are_retried() -> None:
    assert can_pass(MQRC_Q_FULL) and can_pass(MQRC_PUT_INHIBITED)
    for reason in (MQRC_NOT_AUTHORIZED, MQRC_UNKNOWN_OBJECT_NAME, MQRC_MSG_TOO_BIG_FOR_Q):
        assert not can_pass(reason)


def test_retry_waits_are_tenacitys_fixed_interval_up_to_the_count() -> None:
    retry = MessageRetry(count=3, interval_ms=250)
    full = PutRefused(0, MQRC_Q_FULL, "full", "/queue/a")
    assert [retry_wait_ms(retry, full, n) for n in range(1, 6)] == [250, 250, 250, None, None]
    gone = PutRefused(0, MQRC_UNKNOWN_OBJECT_NAME, "gone", "/queue/a")
    assert retry_wait_ms(retry, gone, 1) is None
    assert retry_wait_ms(MessageRetry(count=0), full, 1) is None


def test_message_retry_table_defaults_and_most_specific_pattern() -> None:
    assert compile_retry(None) == RetryTable()
    assert RetryTable().lookup("/queue/x") == MessageRetry(10, 1000)
    table = compile_retry({
        "count": 4, "interval-ms": 500,
        "/queue/orders.*": {"count": 30},
        "orders.eu": {"interval-ms": 2000},
        "/queue/count": {"count": 0},
    })
    assert table.lookup("/queue/other") == MessageRetry(4, 500)
    assert table.lookup("/queue/orders.us") == MessageRetry(30, 500)
    assert table.lookup("/queue/orders.eu") == MessageRetry(4, 2000)
    assert table.lookup("/queue/count") == MessageRetry(0, 500)
    assert compile_retry("3:100") == RetryTable(MessageRetry(3, 100))
    assert parse_retry_text(" 0:0 ", "x") == MessageRetry(0, 0)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("10", "expected COUNT:INTERVAL_MS (10:1000), got '10'"),
        ("10:-1", "interval-ms: expected a whole number from 0 to 999999999, got '-1'"),
        ({"count": "many"}, "count: expected a whole number from 0 to 999999999, got 'many'"),
        ({"count": True}, "count: expected a whole number"),
        ({"/queue/a": {"tries": 3}}, "'/queue/a': unknown key 'tries' (known: count, interval-ms)"),
        ({"/queue/a": 3}, "'/queue/a': expected {count: N, interval-ms: MS}, got 3"),
        ({"orders.>.x": {"count": 1}}, "'orders.>.x':"),
        ([1, 2], "expected COUNT:INTERVAL_MS or a mapping"),
    ],
)
def test_bad_message_retry_is_one_line_naming_the_part(value: object, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        compile_retry(value, source="config file b.yaml")
    assert str(error.value).startswith("config file b.yaml: message-retry: ")
    assert message in str(error.value) and "\n" not in str(error.value)


# -- where a failed message goes ---------------------------------------------------------------

EXC = {reports.REPORT_EXCEPTION: str(reports.MQRO_EXCEPTION), "reply-to": "/queue/r"}
EXP = {reports.REPORT_EXPIRATION: str(reports.MQRO_EXPIRATION), "reply-to": "/queue/r"}
DISCARD = {reports.REPORT_DISCARD: str(reports.MQRO_DISCARD_MSG)}
PRESERVE = {"JMS_TIBCO_PRESERVE_UNDELIVERED": "true"}


def _route(cause: Cause, headers: dict[str, str], policy: str | None = None,
           **kw: bool) -> tuple[Home, str | None, ReportKind | None]:
    found = route(cause, MQRC_Q_FULL, headers, target="/queue/orders", original_id="ID:1",
                  policy=parse_policy(policy) if policy is not None else None, **kw)
    return found.home, found.destination, found.report.kind if found.report else None


def test_refused_goes_to_the_undeliverable_queue_and_plain_expiry_is_discarded() -> None:
    assert _route(Cause.REFUSED, {}) == (Home.UNDELIVERABLE, None, None)
    assert _route(Cause.EXPIRED, {}) == (Home.DISCARD, None, None)
    assert route(Cause.EXPIRED, MQRC_Q_FULL, {}, target="/queue/a",
                 original_id="x").reason is MQFB_EXPIRATION


def test_reports_of_the_right_kind_are_asked_for() -> None:
    assert _route(Cause.REFUSED, EXC) == (Home.UNDELIVERABLE, None, ReportKind.EXCEPTION)
    assert _route(Cause.EXPIRED, EXC) == (Home.DISCARD, None, None)
    assert _route(Cause.EXPIRED, EXP) == (Home.DISCARD, None, ReportKind.EXPIRATION)
    assert _route(Cause.REFUSED, EXP) == (Home.UNDELIVERABLE, None, None)


def test_discard_msg_discards_a_refused_message_unless_its_report_failed() -> None:
    assert _route(Cause.REFUSED, {**EXC, **DISCARD}) == (Home.DISCARD, None, ReportKind.EXCEPTION)
    assert _route(Cause.REFUSED, DISCARD) == (Home.DISCARD, None, None)
    assert _route(Cause.REFUSED, {**EXC, **DISCARD}, report_failed=True) == (
        Home.UNDELIVERABLE, None, None)
    # An expired message whose report failed is kept with its report, not discarded.
    assert _route(Cause.EXPIRED, EXP, report_failed=True) == (Home.UNDELIVERABLE, None, None)


def test_preserve_undelivered_wins_over_a_policys_destination() -> None:
    dlq = "50:move(queue:dlq$)"
    assert _route(Cause.REFUSED, PRESERVE, dlq) == (Home.UNDELIVERED, None, None)
    assert _route(Cause.EXPIRED, {**PRESERVE, **EXP}) == (
        Home.UNDELIVERED, None, ReportKind.EXPIRATION)
    assert _route(Cause.REFUSED, {"JMS_TIBCO_PRESERVE_UNDELIVERED": "false"}) == (
        Home.UNDELIVERABLE, None, None)


def test_a_policys_dead_letter_and_expiry_destinations() -> None:
    assert _route(Cause.REFUSED, {}, "50:move(queue:dlq$)") == (
        Home.DEAD_LETTER, "/queue/dlqorders", None)
    assert _route(Cause.REFUSED, {}, "5:1000") == (Home.UNDELIVERABLE, None, None)  # no end
    assert _route(Cause.REFUSED, {}, "5:delete") == (Home.UNDELIVERABLE, None, None)
    websphere = {"dialect": "websphere", "maxFailedDeliveries": 5}
    found = route(Cause.REFUSED, MQRC_Q_FULL, {}, target="/queue/a", original_id="x",
                  policy=parse_policy(websphere))
    assert found.home is Home.UNDELIVERED  # its default exception destination
    artemis = parse_policy({"dialect": "artemis", "expiry-address": "/queue/expired",
                            "dead-letter-address": "/queue/DLA"})
    found = route(Cause.EXPIRED, MQFB_EXPIRATION, {}, target="/queue/a", original_id="x",
                  policy=artemis)
    assert (found.home, found.destination) == (Home.DEAD_LETTER, "/queue/expired")
    assert found.why.startswith("artemis: ")
    found = route(Cause.REFUSED, MQRC_Q_FULL, {}, target="/queue/a", original_id="x",
                  policy=artemis)
    assert (found.home, found.destination) == (Home.DEAD_LETTER, "/queue/DLA")


def test_the_policy_table_lookup_feeds_the_route() -> None:
    table = compile_table({"/queue/orders": "10:move(queue:orders.dlq)"})
    _, policy = table.lookup("/queue/orders")
    found = route(Cause.REFUSED, MQRC_NOT_AUTHORIZED, {}, target="/queue/orders",
                  original_id="x", policy=policy)
    assert found.destination == "/queue/orders.dlq" and found.reason is MQRC_NOT_AUTHORIZED
