"""``jms-bridge dlq handle``: a dead-letter queue handler driven by a rules table, as IBM MQ's
``runmqdlq`` is (the table: ``policies.dlqrules``).

Each pass sweeps the input queue once and applies the first matching rule to each message:
RETRY puts the application's message back to its original destination (as ``dlq replay``
does) with ``jms-bridge-dlq-retries`` counting the retries; FWD puts the message, its
dead-letter metadata kept, to the rule's destination; DISCARD removes it; IGNORE (and a
message no rule matches) leaves it in its place. Every put is committed with the removal in
one broker transaction. Without ``once`` the handler passes again every ``RETRYINT`` seconds
until stopped (SIGINT/SIGTERM: the batch in flight is rolled back, nothing lost); with
``once``, or with ``WAIT(NO)`` once the queue is empty, it stops after a pass.

Each decision is logged once, with the original id (a message left in place is logged the
first time this process leaves it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import structlog

from adapters.base import Message, StagedFormat
from adapters.queues import DROP, KEEP, Found, Put, QueueTools, SweepAction, Visit
from bridge.deadletter import metadata
from bridge.deadletter.deadletter_stats import DeadLetterStats
from policies.dlqrules import Decision, Rules

log = structlog.get_logger("deadletter.handler")
_REMEMBER = 100_000  # ids of messages left in place, logged once each


@dataclass(slots=True)
class Totals:
    passes: int = 0
    seen: int = 0
    actions: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        done = ", ".join(f"{a} {n}" for a, n in sorted(self.actions.items())) or "nothing done"
        return f"{self.passes} pass(es), {self.seen} messages seen: {done}"


class Handler:
    def __init__(
        self, tools: QueueTools, rules: Rules, queue: str, fmt: StagedFormat, *,
        stats: DeadLetterStats | None = None, batch: int = 500,
    ) -> None:
        self.tools = tools
        self.rules = rules
        self.queue = queue
        self.fmt = fmt
        self.stats = stats
        self.batch = batch
        self.totals = Totals()
        self._ignored: dict[str, None] = {}

    def action(self, found: Found) -> tuple[SweepAction, Decision, metadata.Info]:
        headers = found.message.headers
        info = metadata.describe(headers, found.broker_id)
        decision = self.rules.decide(metadata.facts(info, headers))
        if decision.action == "DISCARD":
            return DROP, decision, info
        if decision.action == "RETRY" and decision.destination:
            out = metadata.replay_headers(headers, info, self.fmt)
            out[metadata.RETRIES] = str(info.handler_retries + 1)
            return Put(decision.destination, Message(out, found.message.body)), decision, info
        if decision.action == "FWD" and decision.destination:
            out = metadata.moved_headers(headers, info)
            return Put(decision.destination, Message(out, found.message.body)), decision, info
        return KEEP, decision, info

    def run_pass(self) -> int:
        """One sweep of the input queue; how many messages it saw."""
        decided: dict[int, tuple[Decision, metadata.Info]] = {}

        def decide(found: Found) -> SweepAction:
            act, decision, info = self.action(found)
            if act is KEEP:
                key = info.original_id or found.broker_id
                if key not in self._ignored:
                    self._ignored[key] = None
                    if len(self._ignored) > _REMEMBER:
                        self._ignored.pop(next(iter(self._ignored)))
                    self._log(decision, info, None)
                    self._count("IGNORE", info)
            else:
                decided[found.position] = (decision, info)
            return act

        def committed(visits: Sequence[Visit]) -> None:
            for visit in visits:
                decision, info = decided.pop(visit.found.position)
                where = visit.action.destination if isinstance(visit.action, Put) else None
                self._log(decision, info, where)
                self._count(decision.action, info)

        self.totals.passes += 1
        report = self.tools.sweep(self.queue, decide, batch=self.batch, after_commit=committed)
        self.totals.seen += report.seen
        return report.seen

    def _count(self, action: str, info: metadata.Info) -> None:
        self.totals.actions[action] = self.totals.actions.get(action, 0) + 1
        if self.stats is not None:
            self.stats.count(f"handle-{action}", info.reason or "none")

    def _log(self, decision: Decision, info: metadata.Info, where: str | None) -> None:
        rule = decision.rule
        log.info("dead letter handled", action=decision.action, original_id=info.original_id,
                 queue=self.queue, reason=info.reason,
                 original_destination=info.original_destination, to=where,
                 rule_line=rule.line if rule else None)

    def run(self, *, once: bool, stop: Callable[[], bool] = lambda: False,
            sleep: Callable[[float], None] = time.sleep) -> Totals:
        while True:
            self.run_pass()
            if once or stop():
                return self.totals
            if not self.rules.control.wait and (self.tools.size(self.queue) or 0) == 0:
                return self.totals
            sleep(self.rules.control.retry_interval_s)
            if stop():
                return self.totals
