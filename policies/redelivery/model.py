"""The canonical redelivery policy, and :func:`decide`, the one function that applies it.

Every dialect (JMSJCA strings, WebLogic, JBoss, WebSphere, TIBCO, ActiveMQ, Artemis) compiles to a
:class:`Policy`; nothing else in the bridge needs to know which dialect an operator wrote.

Counting failures
-----------------
``failures`` is how many deliveries of the message have failed, the one that just failed
included. A delivery carries ``JMSXDeliveryCount`` = 1 the first time, so the consumer's first
NACK (reject, rollback) is failure 1, and the redelivery that follows carries
``JMSXDeliveryCount`` = 2. In general: when the delivery with ``JMSXDeliveryCount`` = *n* fails,
call ``decide(..., failures=n, ...)``; the message has then been *redelivered* n - 1 times.

Steps
-----
A policy is a tuple of :class:`Step`, ordered by ``after``. The step with ``after=k`` governs
failure k + 1 and every later one until the next step begins; failures before the first step
are redelivered at once. A step's rule is either a wait (:class:`Backoff`) or a terminal rule
(:class:`MoveTo`, :class:`Delete`, :class:`Undelivered`), which can only be the last step. A
:class:`Backoff` counts its own attempts from the failure where its step begins, so a fixed delay
is a backoff with multiplier 1.

The terminal rule, in every dialect
-----------------------------------
When a failure reaches the terminal step (the message "exceeded its redelivery limit"):

1. a message whose ``JMS_TIBCO_PRESERVE_UNDELIVERED`` is set (true, 1, their text) goes to the
   bridge's undelivered queue (:class:`Undelivered`, TIBCO's ``$sys.undelivered``), whatever
   the policy names: the sender asked for it to be kept;
2. otherwise the step's own rule: a move when the policy names a destination, else the
   dialect's own end (TIBCO, WebLogic, JBoss and Artemis without a dead-letter destination
   delete; WebSphere's default system exception destination is the undelivered queue).

Every terminal action carries ``MQRC_BACKOUT_THRESHOLD_REACHED`` (2362) as its reason, for the
dead-letter headers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from policies.backoff import backoff_ms
from policies.errors import ConfigError
from policies.properties import flag
from policies.reasons import MQRC_BACKOUT_THRESHOLD_REACHED, Reason
from policies.redelivery.destinations import resolve_move

__all__ = [
    "MAX_WAIT_MS",
    "PRESERVE_UNDELIVERED_HEADER",
    "RedeliveryAction",
    "Backoff",
    "Delete",
    "Move",
    "MoveTo",
    "Policy",
    "Redeliver",
    "Rule",
    "Step",
    "Undelivered",
    "bounded",
    "decide",
    "preserves_undelivered",
]

PRESERVE_UNDELIVERED_HEADER = "JMS_TIBCO_PRESERVE_UNDELIVERED"
# No redelivery waits longer than the longest delivery delay the bridge stages by default (400
# days), whatever a policy's cap says; an uncapped exponential backoff stops growing there.
MAX_WAIT_MS = 400 * 24 * 3600 * 1000


# Actions: what decide() returns.


@dataclass(frozen=True, slots=True)
class Redeliver:
    """Give the message back to its consumers after ``delay_ms`` (0 = at once)."""

    delay_ms: int


@dataclass(frozen=True, slots=True)
class Move:
    """Dead-letter the message to ``destination`` (a STOMP destination, e.g. ``/queue/dlq``)."""

    destination: str
    reason: Reason = MQRC_BACKOUT_THRESHOLD_REACHED


@dataclass(frozen=True, slots=True)
class Delete:
    """Drop the message. Also a rule: the terminal step of a policy that deletes."""

    reason: Reason = MQRC_BACKOUT_THRESHOLD_REACHED


@dataclass(frozen=True, slots=True)
class Undelivered:
    """Move the message to the bridge's configured undelivered queue (TIBCO's
    ``$sys.undelivered``). Also a rule: the terminal step of a policy that keeps it there."""

    reason: Reason = MQRC_BACKOUT_THRESHOLD_REACHED


RedeliveryAction = Redeliver | Move | Delete | Undelivered


# Rules: what a policy's steps hold.


@dataclass(frozen=True, slots=True)
class Backoff:
    """Redeliver after ``initial_ms * multiplier ** (k - 1)``, capped at ``max_ms``, spread by
    ``jitter`` (a fraction, see :func:`policies.backoff.backoff_ms`), for the k-th failure of its
    step; never more than :data:`MAX_WAIT_MS`. ``Backoff(1000)`` is a fixed delay of one
    second. ``linear``: ``initial_ms * k`` instead (the queue-argument schedules of RabbitMQ
    4.3 and LavinMQ), capped the same way; ``multiplier`` and ``jitter`` do not apply."""

    initial_ms: int
    multiplier: float = 1.0
    max_ms: int | None = None
    jitter: float = 0.0
    linear: bool = False

    def __post_init__(self) -> None:
        if self.initial_ms < 0:
            raise ConfigError(f"a redelivery delay cannot be negative: {self.initial_ms} ms")
        if self.multiplier < 1.0:
            raise ConfigError(f"a backoff multiplier must be at least 1, got {self.multiplier}")
        if self.max_ms is not None and self.max_ms < 0:
            raise ConfigError(f"a maximum redelivery delay cannot be negative: {self.max_ms} ms")
        if not 0.0 <= self.jitter <= 1.0:
            raise ConfigError(f"a jitter factor must be between 0 and 1, got {self.jitter}")

    def delay_ms(self, attempt: int, rand: float) -> int:
        """The wait for the ``attempt``-th failure of this step (1 = its first)."""
        if self.linear:
            cap = MAX_WAIT_MS if self.max_ms is None else min(self.max_ms, MAX_WAIT_MS)
            return min(self.initial_ms * attempt, cap)
        return backoff_ms(
            attempt,
            initial_ms=self.initial_ms,
            multiplier=self.multiplier,
            max_ms=MAX_WAIT_MS if self.max_ms is None else min(self.max_ms, MAX_WAIT_MS),
            jitter=self.jitter,
            rand=rand,
        )

    @property
    def grows(self) -> bool:
        """Whether later failures can wait longer than earlier ones."""
        return ((self.multiplier > 1.0 or self.linear) and self.initial_ms > 0
                and self.max_ms != self.initial_ms)


@dataclass(frozen=True, slots=True)
class MoveTo:
    """Move to a destination. ``kind`` ``queue``, ``topic`` or ``same`` (the source's kind) takes
    a JMSJCA name in which ``$`` stands for the source's name; ``exact`` takes a whole STOMP
    destination, used as written. See :func:`policies.redelivery.destinations.resolve_move`."""

    kind: str
    name: str

    def __post_init__(self) -> None:
        if self.kind not in ("queue", "topic", "same", "exact") or not self.name:
            raise ConfigError(f"a move needs queue, topic, same or exact and a name: {self}")

    def __str__(self) -> str:
        return self.name if self.kind == "exact" else f"{self.kind}:{self.name}"


Rule = Backoff | MoveTo | Delete | Undelivered
_TERMINAL = (MoveTo, Delete, Undelivered)


@dataclass(frozen=True, slots=True)
class Step:
    """``rule`` governs failure ``after + 1`` and every later one, until the next step."""

    after: int
    rule: Rule

    @property
    def terminal(self) -> bool:
        return isinstance(self.rule, _TERMINAL)


@dataclass(frozen=True, slots=True)
class Policy:
    """One destination's redelivery policy, with the dialect and text it was written in (for
    dead-letter headers and ``policy show``). ``expiry`` is where the dialect sends messages that
    expire (JBoss's ExpiryQueue, Artemis's expiry-address); :func:`decide` does not use it."""

    dialect: str
    text: str
    steps: tuple[Step, ...]
    expiry: str | None = None

    def __post_init__(self) -> None:
        previous = -1
        for index, step in enumerate(self.steps):
            if step.after < 0 or step.after <= previous:
                raise ConfigError(
                    f"redelivery steps must start at increasing failure counts, got "
                    f"{[s.after for s in self.steps]}"
                )
            if step.terminal and index != len(self.steps) - 1:
                raise ConfigError(f"nothing can follow a terminal step: {self.text}")
            previous = step.after

    @property
    def limit(self) -> int | None:
        """The first failure that ends redelivery (the terminal step), or None: never."""
        if self.steps and self.steps[-1].terminal:
            return self.steps[-1].after + 1
        return None

    def step_for(self, failures: int) -> Step | None:
        """The step that governs failure ``failures``, or None (redeliver at once)."""
        found = None
        for step in self.steps:
            if step.after >= failures:
                break
            found = step
        return found


def bounded(
    waits: Sequence[tuple[int, Backoff]], limit: int | None, end: Rule
) -> tuple[Step, ...]:
    """Steps for the vendor dialects' shape: ``waits`` as ``(after, Backoff)`` in order, then
    ``end`` from failure ``limit`` on (None: never). Waits that ``end`` overtakes, and waits of
    nothing at all, are left out."""
    last = None if limit is None else limit - 1
    steps = [
        Step(after, wait) for after, wait in waits
        if (last is None or after < last) and not (wait.initial_ms == 0 and after == 0)
    ]
    if last is not None:
        steps.append(Step(max(0, last), end))
    return tuple(steps)


def preserves_undelivered(headers: Mapping[str, str]) -> bool:
    """Whether the message asked TIBCO-style to be kept when it cannot be delivered (TIBCO's
    property is a boolean: true, 1 or their text, ``policies.properties.flag``)."""
    return flag(headers.get(PRESERVE_UNDELIVERED_HEADER))


def decide(
    policy: Policy, failures: int, source: str, headers: Mapping[str, str], rand: float
) -> RedeliveryAction:
    """What to do after failure ``failures`` (the ``JMSXDeliveryCount`` of the delivery that
    failed) of a message consumed from ``source``. ``rand`` is a draw from [0, 1) for the
    jitter; the caller owns the randomness."""
    if failures < 1:
        raise ValueError(f"failures count from 1 (the first failed delivery), got {failures}")
    if not 0.0 <= rand <= 1.0:
        raise ValueError(f"rand must be a draw from [0, 1), got {rand}")
    step = policy.step_for(failures)
    if step is None:
        return Redeliver(0)
    rule = step.rule
    if isinstance(rule, Backoff):
        return Redeliver(rule.delay_ms(failures - step.after, rand))
    if preserves_undelivered(headers):
        return Undelivered()
    if isinstance(rule, MoveTo):
        return Move(resolve_move(rule.kind, rule.name, source))
    return rule
