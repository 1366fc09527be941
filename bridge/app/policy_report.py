"""What the configured redelivery policies do for a destination: for ``jms-bridge policy show``
and the admin API's ``GET /policy``, so an operator can check a configuration before relying on
it; and the patterns of a configuration that can never match, said at start."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from policies.errors import ConfigError
from policies.naming import QUEUE, named, pattern_problem
from policies.redelivery import Policy, PolicyTable, describe

if TYPE_CHECKING:
    from bridge.app.config import Settings

_BROKER_NAMES = {"rabbitmq": "RabbitMQ", "activemq": "ActiveMQ"}
# What becomes of a NACK the bridge leaves to the broker (a topic subscriber's, say): the bridge
# puts no copy back where every subscriber would get it (bridge/intercept/redelivery.py).
BROKER_HANDLES = {
    "rabbitmq": "RabbitMQ requeues a NACKed message to the subscription at once, every time: "
                "no delay, no limit, no dead-letter destination",
    "activemq": "ActiveMQ takes a NACK as a poison acknowledgement: the subscriber does not get "
                "the message again, and ActiveMQ's own dead-letter strategy decides where it "
                "goes",
}


def policy_report(
    table: PolicyTable, destination: str, *, user: str | None = None, upto: int | None = None,
    declared: Callable[[str], Policy | None] | None = None,
) -> dict[str, Any]:
    """The report of ``destination`` in any form the broker takes; a ConfigError for a form it
    does not. ``declared``: the policy a queue's own arguments declare (by its name), which
    wins over the configured patterns."""
    broker = table.broker
    canonical = named(destination, broker)
    if canonical is None:
        why = pattern_problem(destination, broker) or "not a destination the broker takes"
        raise ConfigError(f"{destination!r}: {why}")
    pattern, policy = table.lookup(destination, user)
    applied = canonical.kind == QUEUE
    source = "default" if pattern is None else "pattern"
    if declared is not None and applied and not canonical.scope:
        own = declared(canonical.name)
        if own is not None:
            pattern, policy, source = None, own, "queue arguments"
    return {
        "destination": destination,
        "broker": broker,
        "kind": canonical.kind,
        "scope": canonical.scope,
        "name": canonical.name,
        "user": user,
        "pattern": pattern,
        "source": source,
        "applied": applied,
        "dialect": policy.dialect,
        "policy": policy.text,
        "broker_handles": None if applied else BROKER_HANDLES[broker],
        "failures": [
            {"first": row.first, "last": row.last, "action": row.action}
            for row in (describe(policy, destination, upto) if applied else ())
        ],
    }


def render_policy(report: dict[str, Any], *, as_json: bool = False) -> str:
    if as_json:
        return json.dumps(report, indent=2)
    who = f" (user {report['user']})" if report["user"] else ""
    what = f"the {report['kind']} {report['name']}"
    if report["scope"]:
        what = f"the exchange {report['scope']}, routing key {report['name'] or '(none)'}"
    if not report["applied"]:
        matched = (f"; pattern {report['pattern']} matches, but is not applied"
                   if report["pattern"] is not None else "")
        article = "an" if report["kind"][:1] in "aeiou" else "a"
        return (f"{report['destination']}{who}: {what}: the bridge applies no redelivery policy "
                f"to {article} {report['kind']} subscriber's failed deliveries (only a queue's: "
                f"a copy put back on a topic would reach every subscriber){matched}\n"
                f"  {report['broker_handles']}")
    matched = (f"from the queue's arguments {report['policy']}"
               if report.get("source") == "queue arguments"
               else f"pattern {report['pattern']}" if report["pattern"] is not None
               else "no pattern matches: JMSJCA's default")
    lines = [
        f"{report['destination']}{who}: {what}: {matched}",
        f"policy ({report['dialect']}): {report['policy']}",
    ]
    for row in report["failures"]:
        first, last = row["first"], row["last"]
        span = (f"failure {first} and later" if last is None
                else f"failure {first}" if last == first else f"failures {first}-{last}")
        lines.append(f"  {span}: {row['action']}")
    return "\n".join(lines)


def pattern_warnings(settings: Settings) -> list[str]:
    """One line for each configured destination pattern that can never match anything the
    broker has (a typo in its form), naming the setting, the pattern and why."""
    broker = settings.broker
    found = [
        *(("delay-disabled", p) for p in settings.delay_disabled),
        *(("first-delivery-count", p) for p in settings.first_delivery_count),
        *settings.redelivery.patterns(),
        *(("message-retry", p) for p, _ in settings.message_retry.entries),
    ]
    lines = []
    for where, pattern in found:
        why = pattern_problem(pattern, broker)
        if why is not None:
            lines.append(f"{where}: destination pattern {pattern!r} can never match on "
                         f"{_BROKER_NAMES[broker]}: {why}")
    return lines
