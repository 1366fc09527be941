"""The staging engine's unit of work: one move for the adapter's ``settle``, what kind of move
it is, and what to count, log and answer once the broker has done it; and the client
destinations its moves go to."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from adapters.base import Move, StagedFormat
from bridge.staging.envelope import Staged
from bridge.staging.levels import Layout
from bridge.staging.orders import Order
from bridge.staging.outcomes import MessageOutcome
from policies.reasons import Reason


class WorkKind(Enum):
    HOLD = "hold"  # a level head due within the horizon, kept for release
    HOP = "hop"
    RELEASE = "release"
    EXPIRE = "expire"
    INVALID = "invalid"
    UNDELIVERABLE = "undeliverable"
    UNDELIVERED = "undelivered"  # to the undelivered queue (JMS_TIBCO_PRESERVE_UNDELIVERED)
    DEAD_LETTERED = "dead-lettered"  # to a destination the target's policy names
    DISCARD = "discard"  # could not be delivered and asked to be discarded (MQRO_DISCARD_MSG)
    RETRY = "retry"  # refused for a reason that can pass: back on the staging queues
    KEEP = "keep"  # its dead-letter destination refused it: back on the staging queues
    CANCEL = "cancel"  # an operator's order: acknowledged, never delivered
    RELEASE_NOW = "release-now"  # an operator's order: delivered before its due time
    # A broker's dead letter the bridge does not keep (an expiry nothing asked to keep, another
    # reason): acknowledged, as the broker would have dropped it.
    DROP = "drop"
    RESCHEDULE = "reschedule"  # an operator's order: back on the staging queues, due anew
    NOTED = "noted"  # a tool's note of what it did itself: acknowledged, its event recorded
    # A scheduler series' copy released (``Releaser.released``): its staged copy replaced by
    # the next one, or acknowledged when the series is over.
    SERIES = "series"


@dataclass(slots=True)
class Work:
    """One move and what to count and log once the broker has done it."""

    kind: WorkKind
    move: Move
    staged: Staged | None = None
    queue: str | None = None  # HOP: the queue entered; INVALID: the queue it was found on
    error: str | None = None
    reason: Reason | None = None  # a failure's (the refusal's, or MQFB_EXPIRATION)
    order: Order | None = None  # the operator's order this carries out, answered once done
    count: int = 1  # RETRY: the retry's number; KEEP: times kept
    noted: MessageOutcome | None = None  # NOTED: the event the tool's note tells of
    series_key: tuple[str, str] | None = None  # SERIES: which copy of which series


class Destinations:
    """The client destinations of the staging queues a move can go to, named at each connect."""

    def __init__(self, layout: Layout, fmt: StagedFormat) -> None:
        self.layout = layout
        self.format = fmt
        self.ready = ""
        self.invalid = ""
        self.undeliverable = ""

    def name(self) -> None:
        self.ready = self.format.client_destination(self.layout.ready)
        self.invalid = self.format.client_destination(self.layout.invalid)
        self.undeliverable = self.format.client_destination(self.layout.undeliverable)

    def of(self, queue: str) -> str:
        """The destination to put a staged copy on ``queue`` with."""
        return self.ready if queue == self.layout.ready else self.format.client_destination(queue)
