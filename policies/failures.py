"""Where a message the bridge holds goes when it cannot be delivered: one story for every way.

The staging engine meets two failures of a staged message: its target refused it when it was due
(after message-retry, or at once for a refusal that cannot pass: :mod:`policies.retry`), or it
expired while staged. Both are decided here, with the same rules the consumer side's redelivery
limit follows (:func:`policies.redelivery.decide`), IBM MQ's report options
(:mod:`policies.reports`) and TIBCO's ``JMS_TIBCO_PRESERVE_UNDELIVERED``:

1. a report, when the message asked for one of this kind and named a reply-to: an exception
   report (feedback: the refusal's MQRC code) or an expiration report (MQFB_EXPIRATION), put
   before anything else happens to the original;
2. a refused message that asked for MQRO_DISCARD_MSG is then discarded;
3. a message that set ``JMS_TIBCO_PRESERVE_UNDELIVERED: true`` goes to the undelivered queue
   (TIBCO's ``$sys.undelivered``);
4. else a destination its target's redelivery policy names: for a refusal, the policy's
   dead-letter destination (its terminal ``move``; a policy that ends in "undelivered", as
   WebSphere's does, the undelivered queue); for an expiry, the policy's expiry destination
   (JBoss's ExpiryQueue, Artemis's expiry-address);
5. else a refused message goes to the staging area's undeliverable queue
   (``<prefix>.undeliverable``, the bridge's dead-letter queue for releases, as before), and an
   expired one is discarded, as TIBCO and IBM MQ do with an expired message.

A report that cannot be put sends the original to its dead-letter home even when it asked to
be discarded, or when it expired and would have been discarded (then: the undeliverable queue),
and the report goes there with it (``route(..., report_failed=True)``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from policies.reasons import MQFB_EXPIRATION, Reason
from policies.redelivery.destinations import resolve_move
from policies.redelivery.model import MoveTo, Policy, Undelivered, preserves_undelivered
from policies.reports import Report, ReportKind, report_for, report_options

__all__ = ["Cause", "Home", "Route", "route"]


class Cause(enum.Enum):
    REFUSED = "refused"  # the target refused it when due (retries exhausted, or cannot pass)
    EXPIRED = "expired"  # its time to live ran out while staged


class Home(enum.Enum):
    UNDELIVERED = "undelivered"  # the bridge's undelivered queue (TIBCO's $sys.undelivered)
    DEAD_LETTER = "dead-letter"  # a destination the policy names (``Route.destination``)
    UNDELIVERABLE = "undeliverable"  # the staging area's undeliverable queue
    DISCARD = "discard"  # acknowledged, kept nowhere


@dataclass(frozen=True, slots=True)
class Route:
    home: Home
    reason: Reason
    destination: str | None = None  # DEAD_LETTER: where
    report: Report | None = None  # to put first
    why: str = ""  # which rule decided, in words (for the log line and the POLICY header)


def route(
    cause: Cause,
    reason: Reason,
    headers: Mapping[str, str],
    *,
    target: str,
    original_id: str,
    policy: Policy | None = None,
    report_failed: bool = False,
) -> Route:
    """Where a message that failed this way goes. ``headers`` are the message's own (report
    options, reply-to, the TIBCO property); ``reason`` the refusal's (MQFB_EXPIRATION for an
    expiry); ``policy`` the redelivery policy that governs ``target``."""
    if cause is Cause.EXPIRED:
        reason = MQFB_EXPIRATION
    options = report_options(headers)
    report = None
    if not report_failed:
        kind = ReportKind.EXCEPTION if cause is Cause.REFUSED else ReportKind.EXPIRATION
        report = report_for(kind, options, reply_to=headers.get("reply-to"), reason=reason,
                            original_id=original_id,
                            correlation_id=headers.get("correlation-id"))
    if cause is Cause.REFUSED and options.discard and not report_failed:
        return Route(Home.DISCARD, reason, report=report, why="MQRO_DISCARD_MSG")
    if preserves_undelivered(headers):
        return Route(Home.UNDELIVERED, reason, report=report,
                     why="JMS_TIBCO_PRESERVE_UNDELIVERED")
    if policy is not None:
        named = _named(cause, policy, target)
        if named is not None:
            home, destination = named
            return Route(home, reason, destination, report, f"{policy.dialect}: {policy.text}")
    if cause is Cause.EXPIRED and not report_failed:
        return Route(Home.DISCARD, reason, report=report, why="expired")
    return Route(Home.UNDELIVERABLE, reason, report=report,
                 why="report not put" if report_failed else "")


def _named(cause: Cause, policy: Policy, target: str) -> tuple[Home, str | None] | None:
    if cause is Cause.EXPIRED:
        return (Home.DEAD_LETTER, policy.expiry) if policy.expiry else None
    if not policy.steps:
        return None
    rule = policy.steps[-1].rule
    if isinstance(rule, MoveTo):
        return Home.DEAD_LETTER, resolve_move(rule.kind, rule.name, target)
    if isinstance(rule, Undelivered):
        return Home.UNDELIVERED, None
    return None
