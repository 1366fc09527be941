"""What a policy does at each failure, as rows a CLI prints (``jms-bridge policy show``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from policies.redelivery.model import (
    PRESERVE_UNDELIVERED_HEADER,
    Backoff,
    Delete,
    Move,
    Policy,
    Redeliver,
    RedeliveryAction,
    decide,
    preserves_undelivered,
)

__all__ = ["Row", "describe"]

_MIN_ROWS = 10
_MAX_ROWS = 1000


@dataclass(frozen=True, slots=True)
class Row:
    """The same action for failures ``first`` to ``last`` (None: and every later failure)."""

    first: int
    last: int | None
    action: str

    def __str__(self) -> str:
        if self.last is None:
            span = f"failure {self.first} and later"
        elif self.last == self.first:
            span = f"failure {self.first}"
        else:
            span = f"failures {self.first}-{self.last}"
        return f"{span}: {self.action}"


def describe(
    policy: Policy,
    source: str,
    upto: int | None = None,
    headers: Mapping[str, str] | None = None,
) -> tuple[Row, ...]:
    """The action for failures 1 to ``upto`` of a message from ``source``, consecutive equal
    actions merged. ``upto`` None: far enough to show every step (at least 10 failures, and an
    exponential wait until it reaches its cap). The last row is open-ended when nothing changes
    after it. A jittered wait shows its range."""
    if upto is not None and upto < 1:
        raise ValueError(f"upto counts failures from 1, got {upto}")
    headers = headers or {}
    end = upto if upto is not None else _default_upto(policy)
    rows: list[Row] = []
    for failures in range(1, end + 1):
        text = _action_text(policy, failures, source, headers)
        if rows and rows[-1].action == text:
            rows[-1] = Row(rows[-1].first, failures, text)
        else:
            rows.append(Row(failures, failures, text))
    if _settled(policy, end):
        rows[-1] = Row(rows[-1].first, None, rows[-1].action)
    return tuple(rows)


def _action_text(policy: Policy, failures: int, source: str, headers: Mapping[str, str]) -> str:
    low = decide(policy, failures, source, headers, 0.0)
    high = decide(policy, failures, source, headers, 1.0)
    if isinstance(low, Redeliver) and isinstance(high, Redeliver):
        if high.delay_ms == 0:
            return "redeliver at once"
        if low.delay_ms == high.delay_ms:
            return f"redeliver after {low.delay_ms} ms"
        return f"redeliver after {low.delay_ms}-{high.delay_ms} ms (jitter)"
    text = _terminal_text(low)
    if isinstance(low, Move | Delete) and not preserves_undelivered(headers):
        text += f" (the undelivered queue if the message sets {PRESERVE_UNDELIVERED_HEADER}=true)"
    return text


def _terminal_text(action: RedeliveryAction) -> str:
    if isinstance(action, Move):
        return f"move to {action.destination}"
    if isinstance(action, Delete):
        return "delete"
    return "move to the undelivered queue"


def _default_upto(policy: Policy) -> int:
    if not policy.steps:
        return _MIN_ROWS
    upto = max(_MIN_ROWS, policy.steps[-1].after + 1)
    while upto < _MAX_ROWS and not _settled(policy, upto) and _capped_backoff(policy):
        upto += 1
    return upto


def _capped_backoff(policy: Policy) -> bool:
    rule = policy.steps[-1].rule
    return isinstance(rule, Backoff) and rule.max_ms is not None


def _settled(policy: Policy, failures: int) -> bool:
    """Whether every failure after ``failures`` gets the same action as it."""
    step = policy.step_for(failures)
    if step is None:
        return not policy.steps
    if step is not policy.steps[-1]:
        return False
    rule = step.rule
    if not isinstance(rule, Backoff) or not rule.grows:
        return True
    return rule.max_ms is not None and rule.delay_ms(failures - step.after, 0.5) >= rule.max_ms
