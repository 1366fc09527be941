"""The operator's tools' round trip to the running staging engines: an order on the control
topic, and the engines' answers on a reply topic of the tool's own."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import structlog

from adapters.base import Message, StagingBroker
from bridge.staging.levels import Layout
from bridge.staging.orders import Order, destination
from policies.errors import PutRefused, Refused

# How long cancel and release wait for an engine to answer an order. An engine hears it at its
# next poll: within milliseconds when idle, later while it settles a burst or shares a busy
# machine (2 s was too short beside a whole test suite). Only a message no engine holds costs
# the whole wait. (So does an engine asked for what it holds.)
ANSWER_S = 5.0


def reply_topic(layout: Layout) -> str:
    """A topic of this tool's own for the engines' answers (under the control topic's name,
    so the clients' guard keeps clients of the bridge off it)."""
    return f"{layout.control}.reply.{uuid.uuid4().hex}"


def ask(
    broker: StagingBroker, layout: Layout, order: Order, wait_s: float, *,
    answers: int | Callable[[], int], quiet: bool = False,
) -> list[Message]:
    """Publish ``order`` on the control topic and collect up to ``answers`` answers to it
    within ``wait_s``; none when the broker does not let us give orders (logged; at debug
    level when ``quiet``). ``answers`` may be a function, asked once the first answer has come
    (how many engines run: nothing is asked of the broker when none answers)."""
    reply = order.reply_topic
    assert reply is not None
    try:
        broker.listen(reply)
        broker.publish(destination(layout.control), order.message())
    except (Refused, PutRefused) as refused:
        log = structlog.get_logger("staging.tools")
        (log.debug if quiet else log.warning)(
            "cannot give the running staging engines an order", order=order.action.value,
            message_id=order.message_id or None, error=str(refused))
        return []
    return answers_to(broker, order, wait_s, answers=answers)


def answers_to(
    broker: StagingBroker, order: Order, wait_s: float, *, answers: int | Callable[[], int],
) -> list[Message]:
    """Up to ``answers`` answers to ``order`` on its reply topic (listened to already), within
    ``wait_s`` (``ask``)."""
    reply = order.reply_topic
    got: list[Message] = []
    deadline = time.monotonic() + wait_s
    wanted = answers if isinstance(answers, int) else 1
    while len(got) < wanted and (left := deadline - time.monotonic()) > 0:
        for held in broker.poll(left):
            if held.queue == reply and order.answered(held.message.headers):
                got.append(held.message)
        if got and not isinstance(answers, int) and wanted == 1:
            wanted = max(1, answers())
    return got

