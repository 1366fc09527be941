"""``jms-bridge staged list|count|cancel|release``: operators' view of pending messages.

Staged copies are found by their original message id (``jms-bridge-message-id``, which is
also their correlation id, as on IBM MQ's staging queue) or by target. A message a running
engine holds is out of their reach: one due within about a second, and the first 1,000 (the
level prefetch) of each level of up to about a minute, which the engine takes ahead: so most
messages due within about two minutes. RabbitMQ does not show it at all (a get does not see
unacknowledged messages); ActiveMQ lists it, and cancel and release wait for the engine to let
it go (``PATIENCE_S``), then give up (Busy).
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

from adapters.base import Message, StagingBroker
from bridge.errors import BridgeError
from bridge.staging import envelope
from bridge.staging.levels import Layout


@dataclass(frozen=True, slots=True)
class Row:
    message_id: str
    target: str
    due_ms: int
    size: int
    queue: str

    @property
    def due(self) -> str:
        return dt.datetime.fromtimestamp(self.due_ms / 1000, dt.UTC).isoformat(
            timespec="milliseconds"
        )


def rows(
    broker: StagingBroker,
    layout: Layout,
    *,
    target: str | None = None,
    message_id: str | None = None,
) -> Iterator[Row]:
    for queue in layout.queues:
        for message in broker.browse(queue):
            try:
                info = envelope.Staged.of(message.headers)
            except (KeyError, ValueError):
                continue
            if target is not None and info.target != target:
                continue
            if message_id is not None and info.message_id != message_id:
                continue
            yield Row(info.message_id, info.target, info.due_ms, len(message.body), queue)


def render(items: list[Row], *, as_json: bool) -> str:
    if as_json:
        return json.dumps([{**asdict(r), "due": r.due} for r in items], indent=2)
    if not items:
        return "no staged messages"
    lines = [f"{'MESSAGE ID':<48} {'TARGET':<32} {'DUE (UTC)':<29} {'SIZE':>8}"]
    for r in sorted(items, key=lambda r: r.due_ms):
        lines.append(f"{r.message_id:<48} {r.target:<32} {r.due:<29} {r.size:>8}")
    return "\n".join(lines)


NOT_FOUND = (
    "no staged message {} on the staging queues (a running staging engine holds most messages "
    "due within about two minutes, out of reach of these tools)"
)


class Busy(BridgeError):
    """A staged message the staging engine kept holding for all of the tool's patience."""


# How long cancel and release wait for a message the engine holds: ActiveMQ pushes a level's
# head to the engine's peek subscription, where it stays until the engine's next look at that
# level (the engine's recheck, 5 s) unless it is due sooner.
PATIENCE_S = 8.0


def take(
    broker: StagingBroker,
    layout: Layout,
    message_id: str,
    *,
    then: Callable[[Message], None] | None = None,
    patience_s: float = PATIENCE_S,
) -> Message | None:
    """Remove the staged copy of ``message_id`` from whichever staging queue holds it, calling
    ``then`` with it before it is removed. None when no staging queue has it; Busy when one
    has it but the engine held it for all of ``patience_s``."""
    deadline = time.monotonic() + patience_s
    while True:
        found = find(broker, layout, message_id)
        if found is None:
            return None
        queue, _ = found
        taken = broker.take(queue, envelope.MESSAGE_ID, message_id, then)
        if taken is not None:
            return taken
        if time.monotonic() >= deadline:
            raise Busy(
                f"staged message {message_id} on {queue} is held by the staging engine "
                f"(being moved or released now); try again"
            )
        time.sleep(0.1)


def find(broker: StagingBroker, layout: Layout, message_id: str) -> tuple[str, Message] | None:
    """The staging queue and staged copy of ``message_id``, without consuming it."""
    for queue in layout.queues:
        for message in broker.browse(queue):
            if message.headers.get(envelope.MESSAGE_ID) == message_id:
                return queue, message
    return None


def release_now(
    broker: StagingBroker, layout: Layout, message_id: str, *, name: str,
    patience_s: float = PATIENCE_S,
) -> bool:
    """Deliver a staged message to its target now: hold the staged copy, put the restored
    message to its target (confirmed), and only then remove the staged copy (a crash in
    between duplicates, never loses). False when no staging queue has it."""

    def deliver(message: Message) -> None:
        info = envelope.Staged.of(message.headers)
        now = time.time_ns() // 1_000_000
        headers = envelope.released_headers(message.headers, broker=name, now_ms=now)
        broker.publish(info.target, Message(headers, message.body))

    return take(broker, layout, message_id, then=deliver, patience_s=patience_s) is not None
