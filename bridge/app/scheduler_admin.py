"""ActiveMQ's scheduler management actions carried out on the staging queues.

The management interceptor (``bridge.intercept.scheduler``) holds the send while this runs in a
thread: the staged copies are read and cancelled with the bridge's own connection and its
staging tools, limited to those the sending user staged (``jms-bridge-sender``); what BROWSE
finds is sent to the reply-to as that user, so the broker authorizes it as any send of theirs.
"""

from __future__ import annotations

import asyncio
import time

import structlog

from adapters.base import Message, StagingBroker
from bridge.app.brokers import broker_as, staging_broker
from bridge.app.config import Settings
from bridge.intercept.scheduler import BROWSE, REMOVE, Request
from bridge.staging import envelope, listing, operations, series
from bridge.staging.levels import Layout
from policies.errors import PutRefused, Refused
from policies.scheduler import JOB_ID


class SchedulerAdmin:
    """The management interceptor's ``act``."""

    def __init__(self, settings: Settings, layout: Layout) -> None:
        self.settings, self.layout = settings, layout
        self._log = structlog.get_logger("scheduler")

    async def __call__(self, request: Request) -> None:
        await asyncio.to_thread(self.act, request)

    def act(self, request: Request) -> None:
        own = staging_broker(self.settings)
        own.connect()
        try:
            mine = self._mine(own, request)
            if request.action == BROWSE:
                self._browse(request, mine)
                return
            for message in mine:
                message_id = message.headers[envelope.MESSAGE_ID]
                operations.cancel(own, self.layout, message_id)
            self._log.info("scheduled messages removed", action=request.action,
                           login=request.principal.login, removed=len(mine))
        finally:
            own.close()

    def _mine(self, own: StagingBroker, request: Request) -> list[Message]:
        """The user's staged copies the request is about."""
        login = request.principal.login
        found = []
        for message in listing.staged_messages(own, self.layout):
            headers = message.headers
            if headers.get(envelope.SENDER) != login or login is None:
                continue
            try:
                staged = envelope.Staged.of(headers)
            except (KeyError, ValueError):
                continue
            if request.action == REMOVE:
                if headers[envelope.MESSAGE_ID] != request.job_id:
                    continue
            elif not request.in_window(staged.due_ms):
                continue
            found.append(message)
        return found

    def _browse(self, request: Request, mine: list[Message]) -> None:
        """Each scheduled message to the reply-to, as ActiveMQ's browse sends it: the message
        as it will be delivered, with its ``scheduledJobId`` (and its next delivery time,
        ``jms-bridge-delivery-time``), soonest first."""
        assert request.reply_to is not None
        who = request.principal
        user = broker_as(self.settings, who.login, who.passcode, who.vhost)
        user.connect()
        now = time.time_ns() // 1_000_000
        fmt = user.format
        try:
            for message in sorted(mine, key=lambda m: envelope.Staged.of(m.headers).due_ms):
                headers = message.headers
                out = envelope.released_headers(headers, fmt, now_ms=now)
                # Without AMQ_SCHEDULED_*: a broker whose own scheduler is on would schedule
                # the browse copy again instead of delivering it.
                if series.is_series(headers):
                    out = series.as_copy(out, headers, fmt.message_id_header)
                else:
                    out[JOB_ID] = headers[envelope.MESSAGE_ID]
                try:
                    user.publish(request.reply_to, Message(out, message.body))
                except PutRefused as refused:
                    raise Refused(refused.reason, f"reply-to {request.reply_to}: "
                                                  f"{refused.text}") from None
        finally:
            user.close()
