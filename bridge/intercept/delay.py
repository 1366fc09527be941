"""The STOMP front-end's hook for delivery delay and for keeping clients off staging queues.

A SEND that asks for a delay is validated by IBM MQ's rules (``policies.delay``) and rewritten,
in the client's own upstream connection, into a SEND of the staged copy to its staging queue.
So the broker's RECEIPT confirms that the message is staged, and a transaction's COMMIT or
ABORT decides whether it is staged at all, exactly as for any other send.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from bridge.frontends.stomp import Frame, serialize
from bridge.frontends.stomp.session import NeedsCheck, Session
from bridge.staging.envelope import (
    SHORT_STRING_BYTES,
    SHORT_STRING_HEADERS,
    STAGING_DESTINATION,
    staged_headers,
)
from bridge.staging.levels import Layout
from bridge.staging.targets import TargetChecks, TargetKey, Unknown
from policies.delay import DelayConfig, delay_of
from policies.errors import Refused
from policies.reasons import (
    MQRC_MSG_TOO_BIG_FOR_Q,
    MQRC_NOT_AUTHORIZED,
    MQRC_OPTIONS_ERROR,
    MQRC_PROPERTY_VALUE_BAD,
)

# Destinations whose messages cannot wait on a shared staging queue and come back.
UNSTAGEABLE = ("/temp-queue/", "/temp-topic/", "/reply-queue/")


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class DelayInterceptor:
    """Validates and stages delayed SENDs; refuses any client use of the staging queues."""

    commands = frozenset({"SEND", "SUBSCRIBE"})

    def __init__(
        self,
        *,
        broker: str,
        config: DelayConfig,
        layout: Layout,
        clock: Callable[[], int] = _wall_ms,
        on_staged: Callable[[str], None] = lambda queue: None,
        targets: TargetChecks | None = None,
    ) -> None:
        self.broker = broker
        self.config = config
        self.layout = layout
        self.clock = clock
        self.on_staged = on_staged
        self.targets = targets
        self._prefix = layout.prefix.encode()
        self._drop = config.delay_header_names()
        # A SEND that names none of these in its bytes cannot ask for a delay: the common
        # case then costs a few substring searches and no header decoding.
        self._needles = tuple(b"\n" + name.encode() + b":" for name in self._drop)
        self._staging = STAGING_DESTINATION[broker]
        self._short = SHORT_STRING_HEADERS[broker]

    def client_frame(self, frame: Frame, session: Session) -> bytes:
        raw = frame.raw
        # Only the header section can name a header: never search the body (it can be large,
        # and its bytes can make a substring search slow).
        end = frame.body_at
        # A SUBSCRIBE (rare) may name staging queues by a wildcard, without the prefix.
        if raw.find(self._prefix, 0, end) >= 0 or frame.command == "SUBSCRIBE":
            self._guard(frame)
        if frame.command != "SEND":
            return raw
        for needle in self._needles:
            if raw.find(needle, 0, end) >= 0:
                return self._send(frame, session)
        return raw

    def _guard(self, frame: Frame) -> None:
        destination = frame.get("destination") or ""
        if self.layout.owns(destination):
            raise Refused(
                MQRC_NOT_AUTHORIZED,
                f"{destination} is a jms-bridge staging queue or control topic: clients may not "
                f"{'send to' if frame.command == 'SEND' else 'subscribe to'} it",
            )

    def _send(self, frame: Frame, session: Session) -> bytes:
        headers: dict[str, str] = {}
        for name, value in frame.headers:
            headers.setdefault(name, value)
        destination = headers.get("destination", "")
        now = self.clock()
        delayed = delay_of(headers, destination, now, self.config)
        if delayed is None:
            return frame.raw
        if destination.startswith(UNSTAGEABLE):
            raise Refused(
                MQRC_OPTIONS_ERROR,
                f"delivery delay is not supported for temporary destination {destination}",
            )
        for name in self._short:
            size = len(headers.get(name, "").encode())
            if size > SHORT_STRING_BYTES:
                raise Refused(
                    MQRC_PROPERTY_VALUE_BAD,
                    f"{name} is {size} bytes; a delayed message on {self.broker} can carry "
                    f"at most {SHORT_STRING_BYTES}",
                )
        if self.targets is not None:
            key = TargetKey(session.login, session.host, destination, session.passcode)
            verdict = self.targets.verdict(key)
            if isinstance(verdict, Unknown):
                raise NeedsCheck(key)
            if verdict.refused is not None:
                raise Refused(verdict.refused.reason, verdict.refused.detail)
            limit = verdict.max_body_bytes
            if limit is not None and frame.body_length > limit:
                raise Refused(
                    MQRC_MSG_TOO_BIG_FOR_Q,
                    f"{destination} takes messages of at most {limit} bytes; "
                    f"this one has {frame.body_length}",
                )
        queue = self.layout.queue_for(delayed.due_ms - now)
        staged = staged_headers(
            frame.headers,
            broker=self.broker,
            target=destination,
            staging_destination=self._staging.format(queue),
            due_ms=delayed.due_ms,
            sent_ms=now,
            expires_ms=delayed.expires_ms,
            drop=self._drop,
        )
        self.on_staged(queue)
        return serialize("SEND", staged, frame.body, version=session.version)
