"""The STOMP codec's one error: it carries the ERROR frame the bridge sends before closing."""

from __future__ import annotations

from bridge.frontends.stomp.frame import Frame, HeartBeat, error_frame
from policies.errors import ProtocolError

KINDS: frozenset[str] = frozenset(
    {
        "unknown-command", "frame-too-large", "too-many-headers", "header-too-large",
        "bad-header", "bad-escape", "bad-content-length", "missing-nul", "bad-encoding",
        "buffer-overflow",
    }
)  # fmt: skip


class StompProtocolError(ProtocolError):
    """A peer sent bytes STOMP does not allow; ``kind`` is the metric label.

    ``error_frame`` is the complete ERROR frame to send to the peer, escaped per the version in
    force when the error was found. ``events`` holds what FrameParser.feed() parsed from the
    same call before the bad frame, so that the relay can still forward those.
    """

    def __init__(
        self, message: str, *, kind: str, detail: str = "", version: str | None = "1.2"
    ) -> None:
        assert kind in KINDS, kind
        super().__init__(message, kind=kind)
        self.detail = detail or message
        self.error_frame: bytes = error_frame(message, detail=self.detail, version=version)
        self.events: list[Frame | HeartBeat] = []
