"""The one error tree of jms-bridge, at the bottom layer so that every package can raise it.

    BridgeError                    base of everything the product raises on purpose
    +-- ConfigError                a bad flag, environment value or config file
    |   +-- InvalidSelector        a JMS message selector that does not parse (column, reason)
    +-- BrokerUnavailable          the broker cannot be reached or went away
    |   +-- StagingQueueMismatch   it has a staging queue of another type than configured
    +-- ProtocolError              a peer sent bytes the protocol does not allow
    |   +-- StompProtocolError     carries the STOMP ERROR frame to send back
    +-- Refused                    a request refused for an MQRC reason (see policies.reasons)
    +-- PutRefused                 the broker refused one message of a settle (not an outage)

Third-party errors (socket, pika, stomp.py, yaml) are translated into these at the edge that
calls the library and never escape it. ``str(error)`` is the one line a person reads.
"""

from __future__ import annotations

from policies.reasons import MQRC_HOST_NOT_AVAILABLE, Reason


class BridgeError(Exception):
    """Base class of every error jms-bridge raises on purpose."""


class ConfigError(BridgeError):
    """A flag, environment variable or configuration file is invalid."""


class BrokerUnavailable(BridgeError):
    """The broker cannot be reached, refused us, or went away. ``reason`` is the MQRC reason a
    person is told with it: MQRC_HOST_NOT_AVAILABLE unless the adapter knows better (the broker
    refused our credentials: MQRC_NOT_AUTHORIZED); None where no MQRC reason applies."""

    def __init__(self, message: str, reason: Reason | None = MQRC_HOST_NOT_AVAILABLE) -> None:
        super().__init__(message)
        self.reason = reason

    def with_reason(self) -> str:
        """The one line, led by its MQRC reason name and code when it has one."""
        text = str(self)
        if self.reason is None or text.startswith(self.reason.name):
            return text
        return f"{self.reason.name} ({self.reason.code}): {text}"


class StagingQueueMismatch(BrokerUnavailable):
    """The broker refused to declare a staging queue it already has with other arguments
    (classic versus quorum). An engine retries as for an outage (an operator may delete the
    queue); a starting bridge ends naming the queue and the fix."""

    def __init__(self, message: str, reason: Reason | None = None) -> None:
        super().__init__(message, reason)


class ProtocolError(BridgeError):
    """A peer violated the wire protocol. ``kind`` is a short metric label."""

    def __init__(self, message: str, *, kind: str = "malformed") -> None:
        super().__init__(message)
        self.kind = kind


class Refused(BridgeError):
    """A request refused for an IBM MQ reason code; ``str()`` starts with the reason name."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(f"{reason.name} ({reason.code}): {detail}")
        self.reason = reason
        self.detail = detail


class PutRefused(BridgeError):
    """The broker refused to put one message of a ``settle``: ``index`` says which move.

    The connection is fine: moves before ``index`` are done, and so are those after it listed
    in ``also_done`` (an adapter that knows which of its pipelined puts went through); the
    refused one and the other moves after it are not (their held messages are still held).
    Raised instead of BrokerUnavailable so that one bad target cannot stall everything else."""

    def __init__(
        self, index: int, reason: Reason, text: str, destination: str = "",
        also_done: tuple[int, ...] = (),
    ) -> None:
        super().__init__(f"{reason.name} ({reason.code}): {destination}: {text}")
        self.index = index
        self.reason = reason
        self.text = text
        self.destination = destination
        self.also_done = also_done

    def at(self, index: int) -> PutRefused:
        """The same refusal for move ``index`` of a larger settle."""
        return PutRefused(index, self.reason, self.text, self.destination)


class InvalidSelector(ConfigError):
    """A JMS message selector that does not parse, as JMS's InvalidSelectorException.

    ``column`` is the 1-based position of the offending character or token in ``selector``
    (one past its end for an unexpected end); ``reason`` says what is wrong there."""

    def __init__(self, selector: str, column: int, reason: str) -> None:
        super().__init__(f"invalid selector at column {column}: {reason}")
        self.selector = selector
        self.column = column
        self.reason = reason
