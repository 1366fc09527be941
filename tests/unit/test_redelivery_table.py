"""The redelivery: config section: compiling, most-specific lookup, users, odd YAML, describe."""

import pytest
import yaml

from policies.errors import ConfigError
from policies.redelivery import (
    DEFAULT_POLICY,
    PRESERVE_UNDELIVERED_HEADER,
    Delete,
    Move,
    PolicyTable,
    Redeliver,
    Row,
    compile_table,
    decide,
    describe,
    parse_jmsjca,
)
from policies.redelivery.table import specificity

SOURCE = "config file /etc/jms-bridge.yaml"

CONFIG = """
redelivery:
  "/queue/orders.*": "5:1000; 10:5000; 50:move(queue:dlq$error)"
  "/queue/billing": {dialect: weblogic, redelivery-limit: 5, error-destination: billing.errors}
  "orders.eu": "50:delete"
  "orders.>": "1:100"
  "/queue/>": "2:200"
  users:
    batch:
      "orders.>": "move(same:batch.dlq)"
"""


def table() -> PolicyTable:
    return compile_table(yaml.safe_load(CONFIG)["redelivery"], source=SOURCE)


def test_lookup_returns_the_pattern_and_its_policy() -> None:
    pattern, policy = table().lookup("/queue/orders.us")
    assert pattern == "/queue/orders.*"
    assert policy.dialect == "jmsjca"
    assert decide(policy, 51, "/queue/orders.us", {}, 0.5) == Move("/queue/dlqorders.userror")


def test_a_dialect_mapping() -> None:
    pattern, policy = table().lookup("/queue/billing")
    assert pattern == "/queue/billing" and policy.dialect == "weblogic"
    assert decide(policy, 6, "/queue/billing", {}, 0.5) == Move("/queue/billing.errors")


def test_nothing_configured_means_jmsjcas_default() -> None:
    assert table().lookup("/topic/prices") == (None, DEFAULT_POLICY)
    assert compile_table(None).lookup("/queue/a") == (None, DEFAULT_POLICY)
    assert compile_table({}).lookup("/queue/a") == (None, DEFAULT_POLICY)


@pytest.mark.parametrize(
    ("destination", "pattern"),
    [
        ("/queue/orders.eu", "orders.eu"),  # a literal name beats /queue/orders.* and /queue/>
        ("/queue/orders.us", "/queue/orders.*"),  # orders.* beats orders.>, then prefix
        ("/topic/orders.us", "orders.>"),
        ("/queue/orders.us.east", "orders.>"),  # orders.> beats /queue/> at the second segment
        ("/queue/invoices", "/queue/>"),
    ],
)
def test_most_specific_pattern_wins(destination: str, pattern: str) -> None:
    assert table().lookup(destination)[0] == pattern


def test_specificity_order() -> None:
    ordered = ["/queue/>", "orders.>", "orders.*", "/queue/orders.*", "orders.eu",
               "/queue/orders.eu"]
    assert sorted(reversed(ordered), key=specificity) == ordered


def test_a_users_own_pattern_overrides_the_servers() -> None:
    t = table()
    pattern, policy = t.lookup("/queue/orders.eu", user="batch")
    assert pattern == "orders.>"
    assert decide(policy, 1, "/queue/orders.eu", {}, 0.5) == Move("/queue/batch.dlq")
    assert t.lookup("/queue/invoices", user="batch")[0] == "/queue/>"  # falls back to the server
    assert t.lookup("/queue/orders.eu", user="someone")[0] == "orders.eu"


def test_the_same_pattern_twice_is_refused() -> None:
    with pytest.raises(ConfigError, match="'orders.>' and 'orders.#' are the same pattern"):
        compile_table({"orders.>": "1:1", "orders.#": "2:2"}, source=SOURCE)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"/queue/a": "10:abc"},
         "config file /etc/jms-bridge.yaml: redelivery: policy for '/queue/a': "
         "'10:abc': delay must be milliseconds"),
        ({"/queue/a": 5}, "policy for '/queue/a': .* got the number 5"),
        ({"/queue/a": None}, "policy for '/queue/a': .* got nothing \\(null\\)"),
        ({"/queue/a": ["5:1000"]}, "policy for '/queue/a': .* got a list"),
        ({"/queue/a": True}, "policy for '/queue/a': .* got the boolean true"),
        ({"/queue/a": 1.5}, "got the number 1.5"),
        ({"/queue/a": {"dialect": "tibco", "maxRedelivery": "lots"}},
         "policy for '/queue/a': maxRedelivery: must be a whole number, got 'lots'"),
        ({"a.>.b": "1:1"}, "policy for 'a.>.b': .*only as the last segment"),
        ({"": "1:1"}, "policy for '': an empty destination pattern"),
        ({5: "1:1"}, "a destination pattern must be text, got the number 5"),
        ({None: "1:1"}, "a destination pattern must be text, got nothing"),
        (["/queue/a"], "redelivery: must map destination patterns to policies, got a list"),
        ("5:1000", "redelivery: must map destination patterns to policies, got '5:1000'"),
        (42, "got the number 42"),
        ({"users": ["batch"]}, "users: must map user names to their patterns, got a list"),
        ({"users": None}, "users: must map user names to their patterns, got nothing"),
        ({"users": {"batch": "5:1000"}}, "redelivery of user 'batch': must map destination"),
        ({"users": {7: {}}}, "a user name must be text, got the number 7"),
        ({"users": {"batch": {"/queue/a": "1:9999"}}},
         "redelivery of user 'batch': policy for '/queue/a': '1:9999': delay 9999 ms"),
    ],
)
def test_bad_configuration_is_one_clean_line(value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        compile_table(value, source=SOURCE)
    assert "\n" not in str(caught.value)
    assert str(caught.value).startswith(SOURCE)


def test_unquoted_yaml_base_60_gets_a_hint() -> None:
    value = yaml.safe_load('"/queue/a": 5:50')  # YAML 1.1 reads 5:50 as 350
    with pytest.raises(ConfigError, match="quote the policy string"):
        compile_table(value, source=SOURCE)


# describe


def test_describe_the_default() -> None:
    assert [str(row) for row in describe(DEFAULT_POLICY, "/queue/a")] == [
        "failures 1-3: redeliver at once",
        "failures 4-5: redeliver after 25 ms",
        "failures 6-10: redeliver after 50 ms",
        "failures 11-20: redeliver after 100 ms",
        "failures 21-50: redeliver after 1000 ms",
        "failure 51 and later: redeliver after 5000 ms",
    ]


def test_describe_a_move_names_the_destination_and_the_preserve_rule() -> None:
    policy = parse_jmsjca("5:1000; 50:move(queue:dlq$error)")
    rows = describe(policy, "/queue/Queue1")
    assert rows[-1] == Row(
        51, None,
        "move to /queue/dlqQueue1error (the undelivered queue if the message sets "
        f"{PRESERVE_UNDELIVERED_HEADER}=true)",
    )
    preserved = describe(policy, "/queue/Queue1", headers={PRESERVE_UNDELIVERED_HEADER: "true"})
    assert preserved[-1].action == "move to the undelivered queue"


def test_describe_upto_and_jitter() -> None:
    t = compile_table({"/queue/a": {"dialect": "activemq", "useCollisionAvoidance": True,
                                     "maximumRedeliveries": 1}})
    rows = describe(t.lookup("/queue/a")[1], "/queue/a", upto=3)
    assert [str(r) for r in rows] == [
        "failure 1: redeliver after 850-1150 ms (jitter)",
        "failure 2 and later: move to /queue/ActiveMQ.DLQ (the undelivered queue if the message "
        f"sets {PRESERVE_UNDELIVERED_HEADER}=true)",
    ]
    assert describe(DEFAULT_POLICY, "/queue/a", upto=4) == (
        Row(1, 3, "redeliver at once"), Row(4, 4, "redeliver after 25 ms"))


def test_describe_runs_an_exponential_backoff_to_its_cap() -> None:
    t = compile_table({"/queue/a": {"dialect": "artemis", "redelivery-delay": 1000,
                                     "redelivery-delay-multiplier": 2,
                                     "max-delivery-attempts": -1}})
    rows = describe(t.lookup("/queue/a")[1], "/queue/a")
    assert rows[-1] == Row(5, None, "redeliver after 10000 ms")
    assert decide(t.lookup("/queue/a")[1], 4, "/queue/a", {}, 0.5) == Redeliver(8000)


def test_describe_a_delete() -> None:
    rows = describe(parse_jmsjca("2:delete"), "/queue/a")
    assert rows[-1].first == 3 and rows[-1].action.startswith("delete")
    assert decide(parse_jmsjca("2:delete"), 3, "/queue/a", {}, 0.5) == Delete()
