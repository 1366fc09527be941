"""Delivery delay: a send that asks for one is validated and rewritten into its staged copy.

A send that asks for a delay is validated by IBM MQ's rules (``policies.delay``) and rewritten,
on the client's own upstream connection, into a send of the staged copy to its staging queue.
So the broker's confirmation (a STOMP RECEIPT, an AMQP publisher confirm) says that it is
staged, and a transaction's commit or rollback decides whether it is staged at all, exactly as
for any other send.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from adapters import amqp_types
from adapters.base import PutCheck, StagedFormat
from adapters.rabbitmq_delayed import DELAY_HEADER
from bridge.intercept.chain import Interceptor, Interest
from bridge.intercept.clock import wall_ms_ceil
from bridge.intercept.decisions import RELAY, Decision, Hold, Refuse, Rewrite
from bridge.intercept.views import Send
from bridge.staging import envelope
from bridge.staging.envelope import staged_headers
from bridge.staging.levels import Layout
from bridge.staging.outcomes import Kind, MessageOutcome, Sink
from bridge.staging.series import check_cron, cron_next, series_headers
from bridge.staging.targets import PASSES, TargetChecks, TargetKey, Unknown
from policies.delay import DelayConfig, delay_of
from policies.errors import Refused
from policies.reasons import (
    MQRC_MSG_TOO_BIG_FOR_Q,
    MQRC_OPTIONS_ERROR,
    MQRC_PROPERTY_VALUE_BAD,
)
from policies.scheduler import DELAY, SCHEDULE_HEADERS, first_occurrence, series_of


class DelayInterceptor(Interceptor):
    """Validates delayed sends and rewrites each into its staged copy."""

    def __init__(
        self,
        *,
        fmt: StagedFormat,
        config: DelayConfig,
        layout: Layout,
        clock: Callable[[], int] = wall_ms_ceil,
        sinks: Sequence[Sink] = (),
        targets: TargetChecks | None = None,
        scheduler: bool = True,
    ) -> None:
        """``scheduler``: take ActiveMQ's scheduler headers (``AMQ_SCHEDULED_PERIOD``,
        ``_REPEAT``, ``_CRON``): a series staged here, its copies released by the engine."""
        self.fmt = fmt
        self.scheduler = scheduler
        self.config = config
        self.layout = layout
        self.clock = clock
        self.sinks = tuple(sinks)
        self.targets = targets
        self._drop = config.delay_header_names()
        if scheduler:
            self._drop += tuple(h for h in SCHEDULE_HEADERS if h not in self._drop)
        self.interest = Interest(send_headers=frozenset(self._drop))
        # Made once each (one is needed for every delayed send): the target checks' keys, by
        # who sends to where, and the staging levels' destinations, by queue.
        self._keys: dict[tuple[str | None, str | None, str, str | None], TargetKey] = {}
        self._staging: dict[str, str] = {}

    def on_send(self, send: Send) -> Decision:
        try:
            return self._stage(send)
        except Refused as refusal:
            if self.sinks:
                self._tell(MessageOutcome(Kind.REFUSED, self.clock(), send.headers.get(
                    self.fmt.message_id_header or "message-id"), send.destination,
                    reason=refusal.reason, detail=refusal.detail, size=send.body_size))
            return Refuse(refusal)

    def _tell(self, outcome: MessageOutcome) -> None:
        for sink in self.sinks:
            sink((outcome,))

    def _stage(self, send: Send) -> Decision:
        headers, destination = send.headers, send.destination
        now = self.clock()
        try:
            delayed = delay_of(headers, destination, now, self.config)
        except Refused:
            if not _undelayed(headers, destination):
                raise
            # The plugin delivers at once what carries a negative x-delay: the same here, on
            # a delayed-message exchange.
            found = self._verdict(send)
            if isinstance(found, Hold):
                return found
            if found.delayed_exchange:
                return RELAY
            raise
        series = None
        if self.scheduler:
            series = series_of(headers, delayed.delay_ms if delayed else 0, check_cron)
        first = None
        if series is not None:
            first = first_occurrence(series, now, cron_next)
            asked = next(h for h in (*SCHEDULE_HEADERS, DELAY) if h in headers)
            delayed = delay_of(headers, destination, now, self.config,
                               series_due=(asked, first.due_ms))
        if delayed is None:
            return RELAY
        fmt = self.fmt
        if destination.startswith(fmt.temporary_prefixes):
            raise Refused(
                MQRC_OPTIONS_ERROR,
                f"delivery delay is not supported for temporary destination {destination}",
            )
        for name in fmt.short_string_headers:
            value = headers.get(name)
            if value is None or len(value) * 4 <= fmt.short_string_bytes:
                continue  # (UTF-8 takes at most 4 bytes a character)
            size = len(value.encode())
            if size > fmt.short_string_bytes:
                raise Refused(
                    MQRC_PROPERTY_VALUE_BAD,
                    f"{name} is {size} bytes; a delayed message on {fmt.broker} can carry "
                    f"at most {fmt.short_string_bytes}",
                )
        verdict = self._verdict(send)
        if isinstance(verdict, Hold):
            return verdict
        queue = self.layout.queue_for(delayed.due_ms - now)
        staging = self._staging.get(queue)
        if staging is None:  # (the layout's few queues)
            staging = self._staging[queue] = fmt.client_destination(queue)
        staged = staged_headers(
            headers,
            fmt,
            target=destination,
            staging_destination=staging,
            due_ms=delayed.due_ms,
            sent_ms=now,
            expires_ms=delayed.expires_ms,
            drop=self._drop,
        )
        if series is not None and first is not None:
            staged += series_headers(series, _original_id(staged), first)
        if send.principal.login:
            staged.append((envelope.SENDER, send.principal.login))
        if verdict.delayed_exchange:
            _as_the_plugin_routes(staged, delayed.header, delayed.delay_ms)
        if self.sinks:
            original_id = None
            for name, value in reversed(staged):  # (the envelope's entries are near the end)
                if name == envelope.MESSAGE_ID:
                    original_id = value
                    break
            self._tell(MessageOutcome(Kind.STAGED, now, original_id, destination,
                                      delayed.due_ms, delayed.expires_ms, queue=queue,
                                      size=send.body_size, headers=staged))
        return Rewrite(staging, staged)

    def _verdict(self, send: Send) -> PutCheck | Hold:
        """What is known of the send's target (PASSES without target checks); a Hold while it
        is asked; Refused when the target would refuse the message."""
        if self.targets is None:
            return PASSES
        destination = send.destination
        who = send.principal
        found = (who.login, who.vhost, destination, who.passcode)
        key = self._keys.get(found)
        if key is None:
            key = TargetKey(*found)
            if len(self._keys) >= 4096:  # many users times many targets: start again
                self._keys.clear()
            self._keys[found] = key
        verdict = self.targets.verdict(key)
        if isinstance(verdict, Unknown):
            targets = self.targets
            return Hold(key, lambda: targets.check(key))
        if verdict.refused is not None:
            raise Refused(verdict.refused.reason, verdict.refused.detail)
        limit = verdict.max_body_bytes
        if limit is not None and send.body_size > limit:
            raise Refused(
                MQRC_MSG_TOO_BIG_FOR_Q,
                f"{destination} takes messages of at most {limit} bytes; "
                f"this one has {send.body_size}",
            )
        return verdict


def _original_id(staged: list[tuple[str, str]]) -> str:
    for name, value in reversed(staged):  # (the envelope's entries are near the end)
        if name == envelope.MESSAGE_ID:
            return value
    raise ValueError("a staged copy without its original message id")


def _undelayed(headers: Mapping[str, str], destination: str) -> bool:
    """Whether a refused send may be one the delayed-message plugin delivers at once: a
    negative ``x-delay`` to an exchange."""
    value = headers.get(DELAY_HEADER)
    return (value is not None and destination.startswith("/exchange/")
            and value.startswith("-") and value[1:].isascii() and value[1:].isdigit())


def _as_the_plugin_routes(staged: list[tuple[str, str]], header: str, delay_ms: int) -> None:
    """A staged copy for a delayed-message exchange: released mandatory, and carrying
    ``x-delay`` as the plugin leaves it on what it delivers (the delay negated, a signed
    32-bit integer, so that it is not delayed again)."""
    staged.append((envelope.MANDATORY, "true"))
    if header != DELAY_HEADER:
        return
    staged.append((DELAY_HEADER, str(-delay_ms)))
    for i, (name, value) in enumerate(staged):
        if name == amqp_types.TYPES_HEADER:
            typed = amqp_types.with_entry(value, DELAY_HEADER, -delay_ms)
            if typed is not None:
                staged[i] = (name, typed)
            return
    typed = amqp_types.with_entry(None, DELAY_HEADER, -delay_ms)
    if typed is not None:
        staged.append((amqp_types.TYPES_HEADER, typed))
