"""The AMQP front-end's one error, and AMQP 0-9-1's reply codes as data.

``AmqpProtocolError`` sits under ``policies.errors.ProtocolError`` and carries the reply the
bridge sends the peer: a ``Connection.Close`` with the reply code and text (``reply()``), or,
for a client that does not speak AMQP 0-9-1 at all, the protocol header RabbitMQ answers with.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

from bridge.frontends.amqp.builders import PROTOCOL_HEADER, connection_close
from policies.errors import ProtocolError


class ReplyCode(IntEnum):
    """AMQP 0-9-1 reply codes (the spec's constants; RabbitMQ's names in the text)."""

    REPLY_SUCCESS = 200
    CONTENT_TOO_LARGE = 311
    NO_ROUTE = 312
    NO_CONSUMERS = 313
    CONNECTION_FORCED = 320
    INVALID_PATH = 402
    ACCESS_REFUSED = 403
    NOT_FOUND = 404
    RESOURCE_LOCKED = 405
    PRECONDITION_FAILED = 406
    FRAME_ERROR = 501
    SYNTAX_ERROR = 502
    COMMAND_INVALID = 503
    CHANNEL_ERROR = 504
    UNEXPECTED_FRAME = 505
    RESOURCE_ERROR = 506
    NOT_ALLOWED = 530
    NOT_IMPLEMENTED = 540
    INTERNAL_ERROR = 541


# Metric labels (``ProtocolError.kind``) per reply code.
_KINDS: dict[int, str] = {
    ReplyCode.FRAME_ERROR: "frame-error",
    ReplyCode.SYNTAX_ERROR: "syntax-error",
    ReplyCode.COMMAND_INVALID: "command-invalid",
    ReplyCode.CHANNEL_ERROR: "channel-error",
    ReplyCode.UNEXPECTED_FRAME: "unexpected-frame",
    ReplyCode.RESOURCE_ERROR: "resource-error",
    ReplyCode.PRECONDITION_FAILED: "precondition-failed",
}


def _name(reply_code: int) -> str:
    try:
        return ReplyCode(reply_code).name
    except ValueError:
        return ""


class AmqpProtocolError(ProtocolError):
    """A peer sent bytes AMQP 0-9-1 does not allow.

    ``reply_code`` and ``reply_text`` are what the bridge tells the client; ``class_id`` and
    ``method_id`` name the method at fault (0 when it is not a method). ``channel`` is 0 for a
    connection error. ``bad_header`` is set when the peer did not send AMQP 0-9-1's protocol
    header: its reply is that header, not a Connection.Close. ``events`` holds what the call
    that failed had already produced from the same bytes, so the relay can still forward it.
    """

    def __init__(
        self,
        reply_code: int,
        reply_text: str,
        *,
        class_id: int = 0,
        method_id: int = 0,
        channel: int = 0,
        bad_header: bool = False,
    ) -> None:
        name = _name(reply_code)
        kind = "bad-protocol-header" if bad_header else _KINDS.get(reply_code, "malformed")
        label = f"{reply_code} {name}" if name else str(reply_code)
        super().__init__(f"{label}: {reply_text}", kind=kind)
        self.reply_code = reply_code
        self.reply_text = reply_text
        self.class_id = class_id
        self.method_id = method_id
        self.channel = channel
        self.bad_header = bad_header
        self.events: list[Any] = []  # framer or connection events, by who raised it

    def close_frame(self) -> bytes:
        """The Connection.Close frame to send the client, RabbitMQ style ("NAME - text")."""
        name = _name(self.reply_code)
        text = f"{name} - {self.reply_text}" if name else self.reply_text
        return connection_close(self.reply_code, text, self.class_id, self.method_id)

    def reply(self) -> bytes:
        """The bytes to send the peer before closing the connection."""
        return PROTOCOL_HEADER if self.bad_header else self.close_frame()
