"""ActiveMQ's scheduler management destination (``ActiveMQ.Scheduler.Management``).

A send there with ``AMQ_SCHEDULER_ACTION`` asks for what ActiveMQ's scheduler does:
``BROWSE`` (the scheduled messages sent to the send's ``reply-to``), ``REMOVE`` (the one whose
``scheduledJobId`` it names), ``REMOVEALL``; BROWSE and REMOVEALL within
``AMQ_SCHEDULER_ACTION_START_TIME`` and ``_END_TIME`` (epoch ms of the next delivery) when
given. The bridge's scheduled messages are its staged ones: the action is held
(``decisions.Hold``) while the application layer carries it out on the staging queues, limited
to what the sending user staged, then the send goes on to the broker (a topic nobody consumes)
so that its receipt is the broker's as for any send.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from bridge.intercept.chain import Interceptor, Interest
from bridge.intercept.decisions import RELAY, Decision, Hold, Refuse
from bridge.intercept.views import Principal, Send
from policies.errors import BridgeError, Refused
from policies.reasons import MQRC_CONNECTION_BROKEN, MQRC_OPTIONS_ERROR
from policies.scheduler import JOB_ID

ACTION = "AMQ_SCHEDULER_ACTION"
START = "AMQ_SCHEDULER_ACTION_START_TIME"
END = "AMQ_SCHEDULER_ACTION_END_TIME"
BROWSE, REMOVE, REMOVEALL = "BROWSE", "REMOVE", "REMOVEALL"
MANAGEMENT = "ActiveMQ.Scheduler.Management"
DESTINATIONS = (f"/topic/{MANAGEMENT}", f"/exchange/amq.topic/{MANAGEMENT}")


@dataclass(frozen=True, slots=True)
class Request:
    """One management action, as the application layer carries it out."""

    action: str
    principal: Principal
    reply_to: str | None = None
    job_id: str | None = None
    start_ms: int | None = None
    end_ms: int | None = None

    def in_window(self, due_ms: int) -> bool:
        return ((self.start_ms is None or due_ms >= self.start_ms)
                and (self.end_ms is None or due_ms <= self.end_ms))


# Carries out a request; raises Refused when it cannot.
Act = Callable[[Request], Awaitable[None]]


class ManagementInterceptor(Interceptor):
    """Takes the sends to ActiveMQ's scheduler management destination."""

    interest = Interest(send_headers=frozenset({ACTION}))

    def __init__(self, act: Act) -> None:
        self.act = act
        # Requests carried out, by what was sent: the send offered again after its Hold.
        self._done: dict[tuple[object, ...], Refused | None] = {}

    def on_send(self, send: Send) -> Decision:
        if send.destination not in DESTINATIONS:
            return RELAY
        key = (send.principal, send.transaction, tuple(sorted(send.headers.items())))
        if key in self._done:
            refused = self._done.pop(key)
            return RELAY if refused is None else Refuse(refused)
        try:
            request = request_of(send.headers, send.principal)
        except Refused as refused:
            return Refuse(refused)
        done = self._done
        if len(done) >= 1024:  # answers whose clients went away before their frame came back
            done.clear()

        async def check() -> None:
            try:
                await self.act(request)
            except Refused as refused:
                done[key] = refused
            except BridgeError as error:  # the broker could not be asked
                done[key] = Refused(MQRC_CONNECTION_BROKEN, f"{ACTION}={request.action}: {error}")
            else:
                done[key] = None

        return Hold(key, check)


def request_of(headers: Mapping[str, str], principal: Principal) -> Request:
    """The request a management send makes; Refused (MQRC_OPTIONS_ERROR) naming what is wrong."""
    action = headers.get(ACTION, "").strip().upper()
    if action not in (BROWSE, REMOVE, REMOVEALL):
        raise Refused(MQRC_OPTIONS_ERROR, f"{ACTION}={headers.get(ACTION, '')[:64]!r} is not "
                                          f"{BROWSE}, {REMOVE} or {REMOVEALL}")
    reply_to = headers.get("reply-to") or None
    job = headers.get(JOB_ID) or None
    if action == BROWSE and reply_to is None:
        raise Refused(MQRC_OPTIONS_ERROR, f"{ACTION}={BROWSE} needs a reply-to")
    if action == REMOVE and job is None:
        raise Refused(MQRC_OPTIONS_ERROR, f"{ACTION}={REMOVE} needs {JOB_ID}")
    return Request(action, principal, reply_to, job, _time(headers, START), _time(headers, END))


def _time(headers: Mapping[str, str], name: str) -> int | None:
    value = headers.get(name)
    if value is None or value == "":
        return None
    text = value.strip()
    if not (text.isascii() and text.isdigit() and len(text) <= 18):
        raise Refused(MQRC_OPTIONS_ERROR, f"{name}={value[:64]!r} is not a time (epoch ms)")
    return int(text)
