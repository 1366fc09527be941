"""Numbers written with characters Python's ``str.isdigit`` takes but ``int`` refuses ('²',
'³', '¹': superscripts): in a header, a setting, a policy or an admin request, each is not a
number to the bridge: a clear error, or the value is ignored as any other non-number is;
never a ValueError traceback."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from bridge.app.admin import Admin
from bridge.app.config import parse_hostport, resolve
from bridge.app.dlq_admin import DeadLetterRoutes
from bridge.intercept.redelivery import delivery_count
from bridge.staging import envelope
from bridge.staging.failures import attempts_of
from bridge.staging.levels import Layout
from policies.dlqrules import parse_rules
from policies.errors import ConfigError
from policies.retry import parse_retry_text

SUPERSCRIPT = "²"  # str.isdigit() is True, int() raises ValueError


def test_superscript_digits_pass_isdigit_but_not_int() -> None:
    assert SUPERSCRIPT.isdigit()
    with pytest.raises(ValueError):
        int(SUPERSCRIPT)


def test_a_delivery_count_header_of_superscripts_counts_as_absent() -> None:
    assert delivery_count({envelope.DELIVERY_COUNT: SUPERSCRIPT}) == 1
    assert delivery_count({"x-delivery-count": SUPERSCRIPT, "redelivered": "true"}) == 2


def test_the_engines_own_counters_read_superscripts_as_none() -> None:
    assert attempts_of({envelope.RETRIES: SUPERSCRIPT}) == 1
    assert Layout().dwell_of(f"{Layout().prefix}.L{SUPERSCRIPT}") is None
    assert Layout().dwell_of(f"{Layout().prefix}.L1x{SUPERSCRIPT}") is None


@pytest.mark.parametrize(("flags", "words"), [
    ({"stomp-listen": f"127.0.0.1:6{SUPERSCRIPT}1"}, "expected HOST:PORT"),
    ({"staging-level-prefetch": SUPERSCRIPT}, "expected a whole number from 1 to 65535"),
    ({"max-connections": SUPERSCRIPT}, "expected a whole number from 1 to 1000000"),
])
def test_settings_of_superscripts_are_refused_by_name(flags: dict[str, str], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        resolve({"broker": "rabbitmq", **flags}, environ={})


def test_policies_of_superscripts_are_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="RETRY must be"):
        parse_rules(f"ACTION(RETRY) RETRY({SUPERSCRIPT})")
    with pytest.raises(ConfigError):
        parse_retry_text(f"{SUPERSCRIPT}:1000", "message-retry")
    assert parse_hostport("h:61613", "x").port == 61613


def test_a_dead_letter_listing_limit_of_superscripts_is_refused() -> None:
    with pytest.raises(ConfigError, match="limit: expected a whole number"):
        DeadLetterRoutes._limit(SimpleNamespace(query={"limit": SUPERSCRIPT}))  # type: ignore
    request = SimpleNamespace(query={"destination": "/queue/q", "upto": SUPERSCRIPT})
    answer = asyncio.run(Admin.policy(SimpleNamespace(), request))  # type: ignore[arg-type]
    assert answer.status == 400 and b"upto: expected 1 to 1000" in answer.body
