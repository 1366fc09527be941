"""The vendor dialects: each vendor's documented defaults, setting names and limits."""

from collections.abc import Mapping

import pytest

from policies.errors import ConfigError
from policies.redelivery import (
    PRESERVE_UNDELIVERED_HEADER,
    Delete,
    Move,
    Policy,
    Redeliver,
    RedeliveryAction,
    Undelivered,
    decide,
    parse_policy,
)

SOURCE = "/queue/orders"


def run(policy: Policy, upto: int, headers: Mapping[str, str] | None = None,
        rand: float = 0.5) -> list[RedeliveryAction]:
    return [decide(policy, n, SOURCE, headers or {}, rand) for n in range(1, upto + 1)]


def policy(**settings: object) -> Policy:
    return parse_policy(settings)


# WebLogic


def test_weblogic_defaults_redeliver_at_once_for_ever() -> None:
    p = policy(dialect="weblogic")
    assert p.dialect == "weblogic" and p.limit is None
    assert run(p, 3) == [Redeliver(0)] * 3


def test_weblogic_limit_counts_redeliveries_then_error_destination() -> None:
    p = policy(dialect="weblogic", **{"redelivery-delay": 2000, "redelivery-limit": 2,
                                       "error-destination": "/queue/orders.errors"})
    assert run(p, 3) == [Redeliver(2000), Redeliver(2000), Move("/queue/orders.errors")]
    assert p.text == ("dialect: weblogic, redelivery-delay: 2000, redelivery-limit: 2, "
                      "error-destination: /queue/orders.errors")


def test_weblogic_without_error_destination_deletes_and_accepts_mbean_names() -> None:
    p = policy(dialect="WebLogic", RedeliveryLimit=0, RedeliveryDelayOverride=-1)
    assert run(p, 1) == [Delete()]
    assert run(p, 1, {PRESERVE_UNDELIVERED_HEADER: "true"}) == [Undelivered()]


# JBoss 5


def test_jboss_defaults_ten_attempts_then_dlq() -> None:
    p = policy(dialect="jboss")
    assert run(p, 10) == [Redeliver(0)] * 9 + [Move("/queue/DLQ")]
    assert p.expiry == "/queue/ExpiryQueue"


def test_jboss_server_defaults_and_destination_overrides() -> None:
    p = policy(dialect="jboss", DefaultRedeliveryDelay=500, DefaultMaxDeliveryAttempts=3,
               DefaultDLQ="jboss.messaging.destination:service=Queue,name=MyDLQ",
               DefaultExpiryQueue="queue/Expired")
    assert run(p, 3) == [Redeliver(500), Redeliver(500), Move("/queue/MyDLQ")]
    assert p.expiry == "/queue/Expired"
    q = policy(dialect="jboss", DefaultMaxDeliveryAttempts=3, MaxDeliveryAttempts=2,
               RedeliveryDelay=-1, DefaultRedeliveryDelay=100, DLQ="none")
    assert run(q, 2) == [Redeliver(100), Delete()]


# WebSphere 6.1


def test_websphere_defaults_five_failures_then_system_exception_destination() -> None:
    p = policy(dialect="websphere")
    assert run(p, 5) == [Redeliver(0)] * 4 + [Undelivered()]


def test_websphere_named_exception_destination_and_none() -> None:
    p = policy(dialect="websphere", maxFailedDeliveries=2, exceptionDestination="ORDERS.EXC")
    assert run(p, 2) == [Redeliver(0), Move("/queue/ORDERS.EXC")]
    never = policy(dialect="websphere", maxFailedDeliveries=2, exceptionDestination="none")
    assert never.limit is None and run(never, 4) == [Redeliver(0)] * 4
    system = policy(dialect="websphere", **{
        "Maximum failed deliveries per message": 1,
        "exceptionDestination": "$DEFAULT_EXCEPTION_DESTINATION",
    })
    assert run(system, 1) == [Undelivered()]


def test_websphere_has_no_delay_setting() -> None:
    with pytest.raises(ConfigError, match="unknown websphere setting 'redelivery-delay'"):
        policy(dialect="websphere", **{"redelivery-delay": 100})


# TIBCO EMS


def test_tibco_defaults_no_limit() -> None:
    p = policy(dialect="tibco")
    assert p.limit is None and run(p, 3) == [Redeliver(0)] * 3


def test_tibco_max_redelivery_deletes_unless_the_message_asks_to_be_preserved() -> None:
    p = policy(dialect="tibco", maxRedelivery=3)
    assert run(p, 3) == [Redeliver(0), Redeliver(0), Delete()]
    assert run(p, 3, {PRESERVE_UNDELIVERED_HEADER: "true"})[-1] == Undelivered()


@pytest.mark.parametrize(("value", "ms"), [(30, 30_000), ("30", 30_000), ("15sec", 15_000),
                                           ("30min", 1_800_000), ("8hour", 28_800_000), (0, 0)])
def test_tibco_redelivery_delay_units(value: object, ms: int) -> None:
    assert run(policy(dialect="tibco", redeliveryDelay=value), 1) == [Redeliver(ms)]


@pytest.mark.parametrize(("settings", "message"), [
    ({"maxRedelivery": 1}, "0 \\(no limit\\) or 2 to 255"),
    ({"maxRedelivery": 256}, "at most 255"),
    ({"redeliveryDelay": "10sec"}, "between 15 sec and 8 hour"),
    ({"redeliveryDelay": "9hour"}, "between 15 sec and 8 hour"),
    ({"redeliveryDelay": "5 days"}, "expected time\\[sec\\|min\\|hour\\]"),
])
def test_tibco_limits(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        policy(dialect="tibco", **settings)


# ActiveMQ Classic


def test_activemq_defaults_one_second_six_redeliveries_then_activemq_dlq() -> None:
    p = policy(dialect="activemq")
    assert run(p, 7) == [Redeliver(1000)] * 6 + [Move("/queue/ActiveMQ.DLQ")]


def test_activemq_exponential_backoff_with_cap_and_collision_avoidance() -> None:
    p = policy(dialect="activemq", useExponentialBackOff=True, backOffMultiplier=2,
               initialRedeliveryDelay=100, redeliveryDelay=100, maximumRedeliveryDelay=500,
               maximumRedeliveries=-1)
    assert run(p, 5) == [Redeliver(d) for d in (100, 200, 400, 500, 500)]
    # As ActiveMQ's getNextRedeliveryDelay: a cap below redeliveryDelay (1000) is lifted to it.
    low_cap = policy(dialect="activemq", useExponentialBackOff=True, backOffMultiplier=2,
                     initialRedeliveryDelay=100, maximumRedeliveryDelay=500)
    assert run(low_cap, 6)[3:] == [Redeliver(800), Redeliver(1000), Redeliver(1000)]
    jittered = policy(dialect="activemq", useCollisionAvoidance=True)
    assert run(jittered, 1, rand=0.0) == [Redeliver(850)]
    assert run(jittered, 1, rand=0.999999) == [Redeliver(1150)]


def test_activemq_initial_zero_then_redelivery_delay() -> None:
    p = policy(dialect="activemq", initialRedeliveryDelay=0, redeliveryDelay=300,
               maximumRedeliveries=2, deadLetterQueue="none")
    assert run(p, 3) == [Redeliver(0), Redeliver(300), Delete()]
    exp = policy(dialect="activemq", initialRedeliveryDelay=0, redeliveryDelay=300,
                 useExponentialBackOff="true", maximumRedeliveries=-1)
    assert run(exp, 4) == [Redeliver(0), Redeliver(300), Redeliver(1500), Redeliver(7500)]


def test_activemq_zero_redeliveries_dead_letters_at_once() -> None:
    p = policy(dialect="activemq", maximumRedeliveries=0, deadLetterQueue="/queue/dead")
    assert run(p, 1) == [Move("/queue/dead")]


# Artemis


def test_artemis_defaults_ten_attempts_then_removed() -> None:
    p = policy(dialect="artemis")
    assert run(p, 10) == [Redeliver(0)] * 9 + [Delete()]


def test_artemis_documented_example() -> None:
    # The Artemis manual: delay 5000, multiplier 2, max 15000 -> 5000, 10000, 15000.
    p = policy(dialect="artemis", **{"redelivery-delay": 5000, "redelivery-delay-multiplier": 2,
                                     "max-redelivery-delay": 15000, "max-delivery-attempts": 4,
                                     "dead-letter-address": "DLA", "expiry-address": "ExpiryQueue"})
    assert run(p, 4) == [Redeliver(5000), Redeliver(10000), Redeliver(15000), Move("/queue/DLA")]
    assert p.expiry == "/queue/ExpiryQueue"


def test_artemis_default_cap_is_ten_times_the_delay_and_minus_one_is_for_ever() -> None:
    p = policy(dialect="artemis", **{"redelivery-delay": 100, "redelivery-multiplier": 3,
                                     "max-delivery-attempts": -1})
    assert run(p, 4) == [Redeliver(100), Redeliver(300), Redeliver(900), Redeliver(1000)]
    assert p.limit is None


def test_artemis_collision_avoidance_factor_range() -> None:
    message = "redelivery-collision-avoidance-factor: must be at most 1"
    with pytest.raises(ConfigError, match=message):
        policy(dialect="artemis", **{"redelivery-collision-avoidance-factor": 1.5})


# JMSJCA as a mapping, and errors common to every dialect


def test_jmsjca_as_a_mapping() -> None:
    p = policy(dialect="jmsjca", **{"JMSJCA.redeliveryhandling": "5:1000; 50:delete"})
    assert p.text == "5:1000; 50:delete" and p.limit == 51


@pytest.mark.parametrize(("settings", "message"), [
    ({"dialect": "weblogic", "redelivery-limit": "five"},
     "redelivery-limit: must be a whole number, got 'five'"),
    ({"dialect": "weblogic", "redelivery-limit": None}, "got nothing \\(null\\)"),
    ({"dialect": "weblogic", "redelivery-limit": [1]}, "got a list"),
    ({"dialect": "weblogic", "redelivery-limit": True}, "got the boolean true"),
    ({"dialect": "weblogic", "redelivery-limit": -2}, "at least -1"),
    ({"dialect": "weblogic", "redelivery-limit": 1, "RedeliveryLimit": 2}, "are the same setting"),
    ({"dialect": "weblogic", "redelivery-limits": 1},
     "unknown weblogic setting 'redelivery-limits'"),
    ({"dialect": "weblogic", "error-destination": "jms/Errors"}, "error-destination: destination"),
    ({"dialect": "activemq", "useExponentialBackOff": "yes"}, "must be true or false"),
    ({"dialect": "activemq", "backOffMultiplier": 0.5}, "backOffMultiplier: must be at least 1"),
    ({"dialect": "artemis", "redelivery-delay-multiplier": "nan"}, "must be a number"),
    ({"dialect": "oracle-aq"}, "unknown dialect 'oracle-aq'"),
    ({"dialect": 5}, "unknown dialect the number 5"),
    ({"redelivery-limit": 5}, "needs dialect:"),
    ({"dialect": "jmsjca"}, "needs JMSJCA.redeliveryhandling"),
])
def test_bad_settings_are_named(settings: dict[object, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_policy(settings)
